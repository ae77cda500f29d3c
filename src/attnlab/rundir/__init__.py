"""The run directory: the one package that knows its files, their names and their formats.

    read.py    the verified reader: config.json, the weights and the tokenizer checked against
               each other before anything is allocated, then the model built on the meta device
    write.py   the locked writer (``RunDir``): a training run's checkpoints, metrics, best/
               and snapshots, each written whole or not at all, under the directory's lock

Everything else reads and writes a run directory through the names exported here.
"""

from attnlab.files import FileChangedError, RunError
from attnlab.rundir.read import (
    COMPUTED_ALLOWANCE,
    FORMAT_VERSION,
    MODEL_FILE,
    WEIGHT_DTYPES,
    CheckedRun,
    assign_weights,
    build_model,
    check_run,
    check_state_dict,
    check_tokenizer,
    imported_weights,
    load_model,
    model_class,
    open_model,
    read_json_object,
    read_run_config,
    read_tokenizer_files,
    save_model,
    state_dict_for_saving,
    unwrap,
    weights_dtype,
    with_weights_dtype,
    write_run_config,
    write_tokenizer,
)
from attnlab.rundir.write import (
    METRICS_FILE,
    RunDir,
    read_metrics,
    read_trainer_state,
)
from attnlab.safetensors_io import load_tensors, read_header, save_tensors

__all__ = [
    "COMPUTED_ALLOWANCE", "FORMAT_VERSION", "METRICS_FILE", "MODEL_FILE", "WEIGHT_DTYPES",
    "CheckedRun", "FileChangedError", "RunDir", "RunError", "assign_weights", "build_model",
    "check_run", "check_state_dict", "check_tokenizer", "imported_weights", "load_model",
    "load_tensors", "model_class", "open_model", "read_header", "read_json_object",
    "read_metrics", "read_run_config", "read_tokenizer_files", "read_trainer_state",
    "save_model", "save_tensors", "state_dict_for_saving", "unwrap", "weights_dtype",
    "with_weights_dtype", "write_run_config", "write_tokenizer",
]  # fmt: skip
