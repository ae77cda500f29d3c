"""The run directory: the one package that knows its files, their names and their formats.

    layout.py  the file names and the format version (the list of what a run directory holds)
    read.py    the verified reader: config.json, the weights and the tokenizer checked against
               each other before anything is allocated, then the model built on the meta device
               (``open_model``, ``check_run``); a run's trainer state, metrics, tuned lens
    write.py   the locked writer: a model directory (``save_model``), and ``RunDir``, the one
               object a training run writes through (checkpoints, metrics, best/, snapshots,
               each written whole or not at all, under the directory's writer lock)

Nothing outside this package opens a run's files by name: it calls what is exported here.

    run = open_model("runs/mine")                 # (model, tokenizer), checked first
    with writing("runs/new") as run_dir:          # the writer lock, for as long as it trains
        run_dir.create(); ...; run_dir.start(model, tokenizer, record, resumed=False, step=0)
"""

from attnlab.files import FileChangedError, RunError
from attnlab.rundir.layout import (
    CONFIG_FILE,
    CURVE_FILE,
    EXPLORER_FILE,
    FORMAT_VERSION,
    LENS_FILE,
    LENS_META,
    METRICS_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
)
from attnlab.rundir.read import (
    COMPUTED_ALLOWANCE,
    WEIGHT_DTYPES,
    CheckedRun,
    assign_weights,
    build_model,
    check_run,
    check_state_dict,
    check_tokenizer,
    has_run_config,
    imported_from,
    imported_weights,
    is_run,
    load_model,
    model_class,
    model_digest,
    open_model,
    read_json_object,
    read_metrics,
    read_run_config,
    read_tokenizer_files,
    read_trainer_state,
    read_tuned_lens_meta,
    read_tuned_lens_probes,
    state_dict_for_saving,
    unwrap,
    weights_dtype,
    with_weights_dtype,
)
from attnlab.rundir.write import (
    RunDir,
    save_model,
    write_run_config,
    write_tokenizer,
    write_tuned_lens,
    writing,
)

__all__ = [
    "COMPUTED_ALLOWANCE", "CONFIG_FILE", "CURVE_FILE", "EXPLORER_FILE", "FORMAT_VERSION",
    "LENS_FILE", "LENS_META", "METRICS_FILE", "MODEL_FILE", "TOKENIZER_FILE", "WEIGHT_DTYPES",
    "CheckedRun", "FileChangedError", "RunDir", "RunError", "assign_weights", "build_model",
    "check_run", "check_state_dict", "check_tokenizer", "has_run_config", "imported_from",
    "imported_weights", "is_run", "load_model", "model_class", "model_digest", "open_model",
    "read_json_object", "read_metrics", "read_run_config", "read_tokenizer_files",
    "read_trainer_state", "read_tuned_lens_meta", "read_tuned_lens_probes", "save_model",
    "state_dict_for_saving", "unwrap", "weights_dtype", "with_weights_dtype",
    "write_run_config", "write_tokenizer", "write_tuned_lens", "writing",
]  # fmt: skip
