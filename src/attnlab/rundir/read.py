"""The verified reader: a run directory's files read, checked against each other, and the model
they describe built (the files are listed in ``layout``; ``write`` writes them).

Every file is written to a temporary name in the same directory, fsynced, then renamed, so a
crash never leaves half a file. Only safetensors and JSON are ever read: nothing is unpickled.
The pieces under the reader and the writer: ``attnlab.files`` (atomic writes, the writer lock)
and ``attnlab.safetensors_io`` (the header read and checked first, then the data).

A run directory is untrusted input (someone may send you one), so ``load_run`` allocates
nothing until its files agree with each other (``check_run``):
    1. config.json is read, and model.safetensors' header: names, dtypes, shapes and byte
       offsets, no tensor data (``read_header``: the header's size is bounded and every offset
       checked against the file's length, so a hostile header cannot make us allocate).
    2. The model config.json describes is built on the meta device (shapes, no memory), after
       its layer counts are checked against the number of tensors in the file.
    3. Every tensor name, shape and dtype must be the model's; its computed tables (position
       tables, not stored) must not be larger than the weights; the tokenizer's vocabulary must
       be the config's (both sides for an encoder-decoder; a ViT's image size and classes).
Then the weights are memory-mapped and assigned to the meta model (``assign_weights``): loading
costs one copy of the weights, read as they are used. A writer replaces model.safetensors only
by renaming a whole file onto it, so ``load_run`` works at every instant.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from attnlab.config import ConfigError
from attnlab.files import FileChangedError, RunError
from attnlab.models.meta import skip_initialising_meta_tensors
from attnlab.rundir.layout import (
    CONFIG_FILE,
    FORMAT_VERSION,
    LENS_FILE,
    LENS_META,
    METRICS_FILE,
    MODEL_FILE,
    STATE_FILE,
    TARGET_TOKENIZER_FILE,
    TOKENIZER_FILE,
)
from attnlab.safetensors_io import (
    PICKLE_SUFFIXES,
    SafetensorsHeader,
    TensorInfo,
    error_line,
    load_tensors,
    looks_like_pickle,
    nonfinite,
    read_header,
)
from attnlab.tokenizers import PairTokenizer, Tokenizer, TokenizerError, load_tokenizer

# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def model_class(model_type: str) -> type[nn.Module]:
    """The class registered for config.json's ``model_type`` (``attnlab.models.declare``)."""
    from attnlab.models.declare import registered

    kinds = registered()
    if model_type not in kinds:
        raise RunError(f"unknown model_type {model_type!r}; known: {', '.join(kinds)}")
    return kinds[model_type]


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DistributedDataParallel's wrappers."""
    model = uncompiled(model)
    if isinstance(model, DistributedDataParallel):
        model = model.module
    return model


def uncompiled(model: nn.Module) -> nn.Module:
    """The module inside torch.compile's wrapper (``model`` itself where it is not one)."""
    dynamo = sys.modules.get("torch._dynamo")  # loaded once anything has been compiled
    if dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule):
        return model._orig_mod
    return model


def state_dict_for_saving(
    model: nn.Module, sd: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The unwrapped model's state dict (or ``sd``, one gathered from a sharded model) with
    tied copies dropped (stored once)."""
    model = unwrap(model)
    sd = model.state_dict() if sd is None else sd
    return {k: v for k, v in sd.items() if k not in model.tied_now}


def check_state_dict(
    model: nn.Module, tensors: dict[str, torch.Tensor] | dict[str, TensorInfo], source: str
) -> None:
    """Every name, shape and dtype must match what the config's model expects.

    ``tensors`` may be the tensors or, to check before reading any data, a header's
    ``TensorInfo``s; ``model`` may be on the meta device. The first difference is a RunError."""
    expected = state_dict_for_saving(model)
    missing = [k for k in expected if k not in tensors]  # in the model's order
    extra = sorted(set(tensors) - set(expected))
    if missing:
        raise RunError(f"{source}: does not match config.json: missing tensor {missing[0]!r}"
                       + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))  # fmt: skip
    if extra:
        raise RunError(f"{source}: does not match config.json: unexpected tensor {extra[0]!r}")
    for k, ref in expected.items():
        t = tensors[k]
        if tuple(t.shape) != tuple(ref.shape):
            raise RunError(f"{source}: does not match config.json: {k} has shape {tuple(t.shape)}, "
                           f"config.json implies {tuple(ref.shape)}")  # fmt: skip
        if t.dtype != ref.dtype:
            raise RunError(f"{source}: {k} has dtype {t.dtype}, expected {ref.dtype}")


# the dtypes a run's weights may have (config.json's "dtype", float32 when absent). A
# bfloat16 run is one imported from bfloat16 weights: it is computed in bfloat16, as
# transformers computes such a model by default, and held at the size of its file.
WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def weights_dtype(model: nn.Module) -> str:
    """The name of the dtype of every floating parameter of ``model`` (WEIGHT_DTYPES);
    float32 when they differ or are of another dtype."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    names = {v: k for k, v in WEIGHT_DTYPES.items()}
    return names.get(dtypes.pop(), "float32") if len(dtypes) == 1 else "float32"


def with_weights_dtype(model: nn.Module, dtype: str) -> nn.Module:
    """``model`` with its floating parameters (not its buffers: computed tables stay float32)
    in ``dtype``, a name in WEIGHT_DTYPES; tied parameters stay one parameter."""
    to = WEIGHT_DTYPES[dtype]
    for p in model.parameters():  # each parameter once, shared ones included
        if p.is_floating_point() and p.dtype != to:
            p.data = p.data.to(to)
    return model


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``; a RunError naming the file if it is not one."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise RunError(f"{path}: expected a JSON object")
    return cfg


def read_run_config(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunError(f"{run_dir}: no such run directory")
    if run_dir.is_file():
        if run_dir.suffix.lower() in PICKLE_SUFFIXES:
            raise RunError(f"{run_dir}: pickle checkpoints are refused (attnlab never unpickles); "
                           "give a run directory with model.safetensors")  # fmt: skip
        raise RunError(f"{run_dir}: expected a run directory, got a file")
    pickles = [p.name for p in sorted(run_dir.iterdir()) if looks_like_pickle(p)]
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        hint = (
            f" (found {pickles[0]}: pickles are refused, attnlab never unpickles)"
            if pickles
            else ""
        )
        raise RunError(f"{run_dir}: no config.json, so this is not an attnlab run directory{hint}")
    cfg = read_json_object(path)
    version = cfg.get("attnlab_format")
    hf_like = "architectures" in cfg or "model_type" in cfg
    if version is None and hf_like and not isinstance(cfg.get("config"), dict):
        raise RunError(
            f"{run_dir}: a Hugging Face model directory ({cfg.get('model_type') or 'unknown'}), "
            f"not an attnlab run; convert it first: attnlab import-hf {run_dir} --out "
            f"runs/{run_dir.resolve().name or 'imported'}"
        )
    if version is None:
        raise RunError(f"{path}: no attnlab_format version (not written by attnlab, or too old)")
    if version != FORMAT_VERSION:
        raise RunError(
            f"{path}: unknown attnlab_format {version!r}; this attnlab reads {FORMAT_VERSION}"
        )
    if not (run_dir / MODEL_FILE).is_file():
        hint = (
            f" (found {pickles[0]}: pickles are refused, attnlab never unpickles)"
            if pickles
            else ""
        )
        raise RunError(f"{run_dir}: no model.safetensors{hint}")
    return cfg


def build_model(
    cfg: dict, source: str | Path = CONFIG_FILE, *, device: str | torch.device | None = None
) -> nn.Module:
    """The model ``cfg`` (a run's config.json, read from ``source``) describes, freshly built.

    ``device="meta"`` builds it without allocating or initialising anything: every tensor has
    its shape and dtype but no memory (``check_run`` compares those with the weights file).
    """
    try:
        cls = model_class(cfg.get("model_type", ""))
    except RunError as e:
        raise RunError(f"{source}: {e}") from None
    try:
        config = cls.config_class.from_dict(cfg.get("config", {}))
    except (ConfigError, TypeError, AttributeError) as e:
        raise RunError(f"{source}: invalid {cls.__name__} config ({e})") from None
    dtype = cfg.get("dtype", "float32")
    if dtype not in WEIGHT_DTYPES:
        raise RunError(f"{source}: dtype {dtype!r} is not one attnlab runs hold "
                       f"({', '.join(WEIGHT_DTYPES)})")  # fmt: skip
    if device is None:
        return with_weights_dtype(cls(config), dtype)
    if str(device) == "meta":
        skip_initialising_meta_tensors()
    try:
        with torch.device(device):
            return with_weights_dtype(cls(config), dtype)
    except (ValueError, RuntimeError, OverflowError) as e:  # e.g. a size past int64
        raise RunError(
            f"{source}: cannot build the {cls.__name__} it describes ({error_line(e)})"
        ) from None


# Tables a model computes instead of storing (position tables) may take at most the size of
# its weights plus this: a config cannot make a loader allocate through them either.
COMPUTED_ALLOWANCE = 64 << 20


@dataclasses.dataclass
class CheckedRun:
    """A run directory whose files agree with each other, read without its tensor data."""

    run_dir: Path
    config: dict  # config.json
    header: SafetensorsHeader  # model.safetensors: names, dtypes, shapes, offsets
    model: nn.Module  # the model config.json describes, on the meta device
    tokenizer: Any  # Tokenizer, PairTokenizer (encoder-decoder), ImageTokenizer (ViT) or None
    state: dict | None = None  # trainer_state.json, where the run was reopened to train


def check_run(run_dir: str | Path, cfg: dict | None = None) -> CheckedRun:
    """Check that a run directory's config.json (``cfg`` if it was read already), weights and
    tokenizer agree, allocating nothing; the first difference is a RunError naming the file.
    The steps are listed at the top of this module; ``open_model`` then only has to read the
    weights."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir) if cfg is None else cfg
    config_path, weights = run_dir / CONFIG_FILE, run_dir / MODEL_FILE
    header = read_header(weights)
    _check_layer_counts(cfg, header, config_path)
    model = build_model(cfg, config_path, device="meta")
    check_state_dict(model, header.tensors, str(weights))
    _check_computed_tables(model, header, config_path)
    tokenizer = read_tokenizer_files(run_dir)
    check_tokenizer(model, tokenizer, run_dir, imported_weights(cfg))
    return CheckedRun(run_dir, cfg, header, model, tokenizer)


def imported_weights(cfg: dict) -> bool:
    """Did the run's weights come from Hugging Face: imported (``import-hf``), or fine-tuned
    from an imported run (``train --init-from``, whose config.json keeps its ``source``)?"""
    init = cfg.get("init_from")
    for source in (cfg.get("source"), init.get("source") if isinstance(init, dict) else None):
        if isinstance(source, dict) and source.get("format") == "huggingface":
            return True
    return False


def imported_from(cfg: dict) -> str | None:
    """The Hugging Face directory (or name) a run's weights were imported from, if they were."""
    source = cfg.get("source")
    if isinstance(source, dict) and source.get("format") == "huggingface":
        return str(source.get("name_or_path") or source.get("path") or "Hugging Face")
    return None


def _check_layer_counts(cfg: dict, header: SafetensorsHeader, source: Path) -> None:
    """Before building: a model on the meta device costs no memory for its tensors, but its
    modules cost time and memory per layer. So the layer counts (every config field named
    like ``n_layer``) are checked first against the number of tensors in the file, predicted
    from tiny builds: tensors(counts) = tensors(all 1) + sum_f (count_f - 1) * per-layer_f.
    Up to twice the file's count is built anyway, to name the first difference."""
    sizes = cfg["config"] if isinstance(cfg.get("config"), dict) else {}
    fields = [k for k, v in sizes.items() if "layer" in k and type(v) is int and v > 1]
    if not fields:
        return

    def tensors(**counts) -> int:
        probe = {**cfg, "config": {**sizes, **counts}}
        return len(state_dict_for_saving(build_model(probe, source, device="meta")))

    ones = {k: 1 for k in fields}
    base = tensors(**ones)
    implied = base + sum((sizes[k] - 1) * (tensors(**{**ones, k: 2}) - base) for k in fields)
    if implied > 2 * len(header.tensors) + 16:
        counts = ", ".join(f"{k} = {sizes[k]:,}" for k in fields)
        raise RunError(f"{source}: {counts} implies {implied:,} tensors, but model.safetensors "
                       f"holds {len(header.tensors):,}")  # fmt: skip


def _check_computed_tables(model: nn.Module, header: SafetensorsHeader, source: Path) -> None:
    sizes = {
        name: (b.numel() * b.element_size(), tuple(b.shape)) for name, b in model.named_buffers()
    }
    total = sum(size for size, _ in sizes.values())
    if total > header.nbytes + COMPUTED_ALLOWANCE:
        name = max(sizes, key=lambda n: sizes[n][0])
        raise RunError(
            f"{source}: the model it describes computes {_size(total)} of tables (such as "
            f"{name}, {sizes[name][1]}), more than its {_size(header.nbytes)} of weights allow"
        )


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def check_tokenizer(
    model: nn.Module, tokenizer, run_dir: str | Path, imported: bool = False
) -> None:
    """The tokenizer must speak the model's ids: the same vocabulary size (each side of an
    encoder-decoder, counting its <pad>, <bos>, <eos>), and for a ViT the same classes, image
    size and channels (the model's ``tokenizer_fields``). A run imported from Hugging Face (``imported``)
    may have a larger vocabulary than its tokenizer, as ``import-hf`` accepts (some models pad
    it), but never a smaller one. A run saved without a tokenizer passes."""
    if tokenizer is None:
        return
    run_dir, kind, fields = Path(run_dir), model.model_type, model.tokenizer_fields
    for name in dict.fromkeys(name for *_, name in fields):
        if not (run_dir / name).is_file():
            raise RunError(f"{run_dir}: has tokenizer.json but no {name}, which a {kind} run needs")
    for field, attr, name in fields:
        got, want = getattr(tokenizer, attr, None), getattr(model.config, field)
        if got is None:
            what = getattr(tokenizer, "kind", type(tokenizer).__name__)
            raise RunError(f"{run_dir / name}: a {kind} run needs a tokenizer with {attr}; "
                           f"this one is a {what} tokenizer")  # fmt: skip
        if got != want and not (imported and field == "vocab_size" and got < want):
            specials = " (with <pad>, <bos>, <eos>)" if isinstance(tokenizer, PairTokenizer) else ""
            raise RunError(f"{run_dir / name}: does not match config.json: the tokenizer's "
                           f"{attr} is {got}{specials}, config.json's {field} is {want}")  # fmt: skip


def assign_weights(model: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """Give a model built on the meta device its weights, by reference: no copy.

    ``load_state_dict(assign=True)`` makes each tensor the parameter itself. Then tied copies
    (a GPT's lm_head is its tok_embed, stored once) are tied again to the stored parameter,
    and each module with tables it computes rather than stores (positions) recomputes them
    with its ``reset_buffers()``. Names, shapes and dtypes must have been checked
    (``check_state_dict``): what is left on the meta device afterwards is an error.
    """
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    result = model.load_state_dict(tensors, strict=False, assign=True)
    for names in names_of.values():
        stored = [n for n in names if n in tensors]
        if len(names) > 1 and len(stored) == 1:  # tied: every name is the stored parameter
            param = model.get_parameter(stored[0])
            for name in names:
                owner, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(owner), leaf, param)
    for module in model.modules():
        if any(b.is_meta for b in module.buffers(recurse=False)):
            try:
                reset = module.reset_buffers
            except AttributeError:  # a new module: see attnlab.positional
                raise TypeError(f"{type(module).__name__} has buffers that are not in the "
                                "checkpoint, so it needs a reset_buffers() that computes "
                                "them") from None  # fmt: skip
            reset()
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left or result.unexpected_keys:
        raise RunError(f"weights not assigned: {(left or result.unexpected_keys)[0]!r}")
    return model


def load_model(run_dir: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The run's model in eval mode (see ``open_model``)."""
    return open_model(run_dir, device)[0]


def open_model(
    run_dir: str | Path, device: str | torch.device = "cpu", cfg: dict | None = None
) -> tuple[nn.Module, Tokenizer | None]:
    """``(model, tokenizer)`` for any run directory, trained or imported, in eval mode; the
    loader under ``attnlab.load_run`` (the one door to a run), given its config.json once read.

    Everything is checked before the weights are read (``check_run``); then the weights are
    memory-mapped and assigned to the model built on the meta device (``assign_weights``), so
    loading costs one copy of them. An encoder-decoder run (one with ``target_tokenizer.json``)
    gives a ``PairTokenizer``, a ViT run an ``ImageTokenizer``.
    """
    for attempt in range(3):  # a training run may replace model.safetensors as we read it
        run = check_run(run_dir, cfg if attempt == 0 else None)
        try:
            tensors = load_tensors(run.header.path, mmap=True, header=run.header)
            break
        except FileChangedError:
            if attempt == 2:
                raise
    refuse_nonfinite(tensors, run.header.path)
    model = assign_weights(run.model, tensors)
    return model.to(device).eval(), run.tokenizer


def refuse_nonfinite_run(run_dir: str | Path) -> None:
    """``refuse_nonfinite`` for a run directory's weights, read (mapped) for the check alone:
    what fine-tuning from a run checks before it reads or writes anything else."""
    header = read_header(Path(run_dir) / MODEL_FILE)
    refuse_nonfinite(load_tensors(header.path, mmap=True, header=header), header.path)


def refuse_nonfinite(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A RunError when the weights hold NaN or an infinity: every verb would print NaN scores
    or crash on them (a sampler cannot draw from NaN probabilities), so the run is refused
    before anything is built, printed or written."""
    found = nonfinite(tensors)
    if found is not None:
        name, n = found
        raise RunError(f"{path}: {n:,} weight value{'s' if n != 1 else ''} are not finite (NaN "
                       f"or infinity; the first in {name}): the weights are corrupt. A run that "
                       "diverged keeps its last finite checkpoint in its run directory; train "
                       "again, with a lower --lr")  # fmt: skip


def _image_tokenizer(body: dict):
    """A ViT run's tokenizer.json (``attnlab.data.images``, imported only for one)."""
    from attnlab.data.images import ImageTokenizer

    return ImageTokenizer.from_dict(body)


def read_tokenizer_files(run_dir: str | Path):
    """The run's tokenizer: tokenizer.json, paired with target_tokenizer.json when there is one
    (an encoder-decoder run); None when the run has no tokenizer."""
    run_dir = Path(run_dir)
    src, tgt = run_dir / TOKENIZER_FILE, run_dir / TARGET_TOKENIZER_FILE
    if tgt.is_file() and not src.is_file():
        raise RunError(f"{run_dir}: target_tokenizer.json without tokenizer.json")
    try:
        tok = load_tokenizer(src, {"image": _image_tokenizer}) if src.is_file() else None
        if tok is not None and tgt.is_file():
            tok = PairTokenizer(tok, load_tokenizer(tgt))
    except TokenizerError as e:
        raise RunError(str(e)) from None  # it names the file
    return tok


# ---------------------------------------------------------------------------------------------
# What a run holds besides its model
# ---------------------------------------------------------------------------------------------


def has_run_config(run_dir: str | Path) -> bool:
    """Was a run written at ``run_dir`` (it has a config.json, finished or not)?"""
    return (Path(run_dir) / CONFIG_FILE).is_file()


def is_run(run_dir: str | Path) -> bool:
    """Is ``run_dir`` an attnlab run directory (its config.json names an attnlab_format)?
    Unreadable or foreign files say no."""
    try:
        cfg = json.loads((Path(run_dir) / CONFIG_FILE).read_text(encoding="utf-8"))
        return "attnlab_format" in cfg
    except (OSError, ValueError, TypeError):
        return False


def read_trainer_state(run_dir: str | Path) -> dict | None:
    """trainer_state.json as a dict; None when the run has no checkpoint yet."""
    path = Path(run_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunError(f"{path}: cannot read ({e})") from None
    if not isinstance(state, dict):
        raise RunError(f"{path}: not a trainer state (expected a JSON object)")
    return state


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl file (a run directory, or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def model_digest(run_dir: str | Path) -> str:
    """The sha256 of the run's model.safetensors: what a tuned lens was fitted on."""
    digest = hashlib.sha256()
    with open(Path(run_dir) / MODEL_FILE, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_tuned_lens_meta(run_dir: str | Path) -> dict | None:
    """tuned_lens.json (what the probes were fitted on); None unless both of the tuned lens's
    files are there."""
    run_dir = Path(run_dir)
    if not (run_dir / LENS_META).is_file() or not (run_dir / LENS_FILE).is_file():
        return None
    return read_json_object(run_dir / LENS_META)


def read_tuned_lens_probes(run_dir: str | Path) -> dict[str, torch.Tensor]:
    """tuned_lens.safetensors: each probe's weight and bias by residual point."""
    return load_tensors(Path(run_dir) / LENS_FILE)
