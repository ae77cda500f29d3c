"""The one place that reads and writes run directories.

A run directory looks like a Hugging Face model directory:
    config.json          {"attnlab_format": 1, "model_type": "gpt", "config": {...}, ...}
    model.safetensors    the weights (tied copies stored once)
    tokenizer.json       see attnlab.tokenizers
plus, for training runs (written by ``attnlab.training.Trainer`` through the functions of the
last section here):
    optimizer.safetensors   AdamW moments of the same step as model.safetensors
    trainer_state.json      step, train config, RNG states, data position, best metric so far
    best/                   config.json, tokenizer.json, model.safetensors of the best evaluation
    metrics.jsonl, loss.png one JSON line per log or evaluation; the loss curve
    snapshots/              attention and head scores every --snapshot-every steps

Every file is written to a temporary name in the same directory, fsynced, then renamed, so a
crash never leaves half a file. Only safetensors and JSON are ever read: nothing is unpickled.
Loading checks every tensor's name, shape and dtype against the model the config describes.

How a checkpoint stays whole: its three files are first written into a fresh ``ckpt-tmp/``
directory (each file fsynced), which is then renamed to ``ckpt-ready/``: the rename is the
commit point. The files are then moved into place one by one (each move atomic) and
``ckpt-ready/`` removed. A crash before the commit leaves the previous checkpoint untouched
(``ckpt-tmp/`` is discarded by ``recover_checkpoint``); a crash after it is rolled forward by
finishing the moves. ``model.safetensors`` is always one whole file, and config.json and
tokenizer.json never change during training, so ``load_run`` works at every instant.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import ConfigError
from attnlab.tokenizers import PairTokenizer, Tokenizer, TokenizerError, load_tokenizer

FORMAT_VERSION = 1

# model_type -> "module:Class"; the class has ``config_class`` and is built as Class(config).
MODEL_TYPES: dict[str, str] = {
    "gpt": "attnlab.models.gpt:GPT",
    "encoder": "attnlab.models.encoder:Encoder",
    "seq2seq": "attnlab.models.seq2seq:Seq2SeqTransformer",
    "rnn": "attnlab.models.rnn:RNNSeq2Seq",
    "vit": "attnlab.models.vit:ViT",
}

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


class RunError(ValueError):
    """A run directory that is missing, incomplete, corrupt or inconsistent."""


def looks_like_pickle(path: Path) -> bool:
    """A file named like a PyTorch checkpoint whose first bytes are a pickle (protocol 2-5) or a
    ``torch.save`` zip. Only those bytes are read: the file is never unpickled. (A run's own
    ``tokens.bin`` is raw token ids and is not one.)"""
    if path.suffix.lower() not in PICKLE_SUFFIXES or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head == b"PK\x03\x04"


# ---------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(tmp_path)``, fsync the result, then rename it onto ``path``."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _about(e, path) from None
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename == tmp:
            raise _about(e, path) from None  # name the file the user asked for, not our temp
        raise
    fsync_dir(path.parent)


def _about(e: OSError, path: Path) -> OSError:
    """The same error (type, errno, message) about ``path``."""
    return type(e)(e.errno, e.strerror, str(path)) if e.errno else e


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_tensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; anything else (a pickle, a truncated file) is a RunError."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: file not found")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for bad headers/lengths
        raise RunError(f"{path}: not a valid safetensors file ({_short(e)})") from None


def _short(e: Exception) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def model_class(model_type: str) -> type[nn.Module]:
    if model_type not in MODEL_TYPES:
        raise RunError(f"unknown model_type {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    module, name = MODEL_TYPES[model_type].split(":")
    return getattr(importlib.import_module(module), name)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DistributedDataParallel's wrappers."""
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    return getattr(model, "module", model)  # DistributedDataParallel wrapper


def state_dict_for_saving(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unwrapped model's state dict with tied copies dropped (stored once)."""
    model = unwrap(model)
    sd = model.state_dict()
    tied = (
        getattr(model, "tied_weights_keys", ())
        if getattr(model.config, "tie_weights", False)
        else ()
    )
    return {k: v for k, v in sd.items() if k not in tied}


def check_state_dict(model: nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Every name, shape and dtype must match what the config's model expects."""
    expected = state_dict_for_saving(model)
    missing = sorted(set(expected) - set(tensors))
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
                           f"config implies {tuple(ref.shape)}")  # fmt: skip
        if t.dtype != ref.dtype:
            raise RunError(f"{source}: {k} has dtype {t.dtype}, expected {ref.dtype}")


def save_model(
    run_dir: str | Path,
    model: nn.Module,
    tokenizer: Tokenizer | None = None,
    extra: dict | None = None,
) -> None:
    """Write config.json, model.safetensors (and tokenizer.json) into ``run_dir``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    inner = unwrap(model)
    save_tensors(
        run_dir / "model.safetensors", state_dict_for_saving(inner), metadata={"format": "pt"}
    )
    if tokenizer is not None:
        write_tokenizer(run_dir, tokenizer)
    write_run_config(run_dir, inner, extra)


def write_tokenizer(run_dir: str | Path, tokenizer) -> None:
    """tokenizer.json (and target_tokenizer.json for a PairTokenizer, as a seq2seq run has)."""
    files = getattr(tokenizer, "to_json_files", None)
    files = files() if files else {"tokenizer.json": tokenizer.to_json()}
    for name, text in files.items():
        atomic_write_text(Path(run_dir) / name, text)


def write_run_config(run_dir: str | Path, model: nn.Module, extra: dict | None = None) -> None:
    """Write config.json: format version, model_type, the model's config, and ``extra``."""
    inner = unwrap(model)
    cfg = {"attnlab_format": FORMAT_VERSION, "model_type": inner.model_type}
    cfg["config"] = inner.config.to_dict()
    cfg.update(extra or {})
    atomic_write_json(Path(run_dir) / "config.json", cfg)


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
    path = run_dir / "config.json"
    if not path.is_file():
        hint = (
            f" (found {pickles[0]}: pickles are refused, attnlab never unpickles)"
            if pickles
            else ""
        )
        raise RunError(f"{run_dir}: no config.json, so this is not an attnlab run directory{hint}")
    cfg = read_json_object(path)
    version = cfg.get("attnlab_format")
    if version is None:
        raise RunError(f"{path}: no attnlab_format version (not written by attnlab, or too old)")
    if version != FORMAT_VERSION:
        raise RunError(
            f"{path}: unknown attnlab_format {version!r}; this attnlab reads {FORMAT_VERSION}"
        )
    if not (run_dir / "model.safetensors").is_file():
        hint = (
            f" (found {pickles[0]}: pickles are refused, attnlab never unpickles)"
            if pickles
            else ""
        )
        raise RunError(f"{run_dir}: no model.safetensors{hint}")
    return cfg


def build_model(cfg: dict, source: str | Path = "config.json") -> nn.Module:
    """The model ``cfg`` (a run's config.json, read from ``source``) describes, freshly built."""
    try:
        cls = model_class(cfg.get("model_type", ""))
    except RunError as e:
        raise RunError(f"{source}: {e}") from None
    try:
        config = cls.config_class.from_dict(cfg.get("config", {}))
    except (ConfigError, TypeError) as e:
        raise RunError(f"{source}: invalid {cls.__name__} config ({e})") from None
    return cls(config)


def load_model(run_dir: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    model = build_model(cfg, run_dir / "config.json")
    tensors = load_tensors(run_dir / "model.safetensors")
    check_state_dict(model, tensors, str(run_dir / "model.safetensors"))
    model.load_state_dict(tensors, strict=False)  # tied copies are re-tied by the constructor
    return model.to(device).eval()


def _read_tokenizer(path: Path) -> Tokenizer:
    try:
        return load_tokenizer(path)
    except TokenizerError as e:
        raise RunError(str(e)) from None  # it names the file


def load_run(
    run_dir: str | Path, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Tokenizer | None]:
    """``(model, tokenizer)`` for any run directory, trained or imported, in eval mode.

    An encoder-decoder run (one with ``target_tokenizer.json``) gives a ``PairTokenizer``.
    """
    run_dir = Path(run_dir)
    model = load_model(run_dir, device)
    tok_path, tgt_path = run_dir / "tokenizer.json", run_dir / "target_tokenizer.json"
    tokenizer = _read_tokenizer(tok_path) if tok_path.is_file() else None
    if tgt_path.is_file():
        if tokenizer is None:
            raise RunError(f"{run_dir}: target_tokenizer.json without tokenizer.json")
        tokenizer = PairTokenizer(tokenizer, _read_tokenizer(tgt_path))
    return model, tokenizer


# ---------------------------------------------------------------------------------------------
# Training runs: the directory, checkpoints, trainer state and metrics (written by the Trainer)
# ---------------------------------------------------------------------------------------------

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss.png"
SNAPSHOT_DIR, SNAPSHOT_PREFIX = "snapshots", "step-"  # snapshots/step-00000250.safetensors
STAGING, READY = "ckpt-tmp", "ckpt-ready"
CHECKPOINT_FILES = (OPTIMIZER_FILE, MODEL_FILE, STATE_FILE)  # install order: state last
# what makes a directory a run (one of these, and starting a new run there is refused)
RUN_FILES = ("config.json", MODEL_FILE, STATE_FILE, "tokenizer.json", METRICS_FILE)


def check_writable(run_dir: str | Path) -> None:
    """Create ``run_dir`` if needed and prove a file can be written there (then remove it)."""
    d = Path(run_dir)
    try:
        if d.exists() and not d.is_dir():
            raise RunError(f"{d}: exists and is not a directory")
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / ".write-test", "ok")
        (d / ".write-test").unlink()
    except OSError as e:
        raise RunError(
            f"cannot write the run directory {d}: {e.strerror or e} "
            "(nothing was trained; choose another --out)"
        ) from None


def check_new_run(run_dir: str | Path) -> None:
    """A new run may go into a missing or empty directory, or one holding other files; one that
    holds a run (even part of one) is refused: it is continued with --resume, never replaced."""
    d = Path(run_dir)
    if d.exists() and not d.is_dir():
        raise RunError(f"{d}: exists and is not a directory")
    found = [name for name in RUN_FILES if (d / name).exists()]
    if not found:
        return
    if (d / STATE_FILE).is_file():
        try:
            step = read_trainer_state(d).get("step")
        except RunError:
            step = None
        held = f"a training run (step {step})" if step is not None else "a training run"
        raise RunError(
            f"{d} already holds {held}; pass --resume to continue it, or choose another --out"
        )
    if (d / MODEL_FILE).is_file():
        raise RunError(f"{d} already holds a model; choose another --out (it is left as it is)")
    raise RunError(
        f"{d} holds part of a run that never wrote its first checkpoint ({found[0]}); "
        "remove the directory or choose another --out"
    )


def create_run_dir(run_dir: str | Path) -> bool:
    """Create (or reuse) the directory of a new run and prove it writable; True if it is new."""
    created = not Path(run_dir).exists()
    check_writable(run_dir)
    return created


def remove_partial_run(run_dir: str | Path, created: bool, names: tuple[str, ...] = ()) -> None:
    """Bad input found while a new run was being prepared: leave nothing behind. A directory
    this run created is removed whole; in one that existed, only ``names`` (and the files every
    run writes) are removed, with their temporary copies."""
    d = Path(run_dir)
    if created:
        shutil.rmtree(d, ignore_errors=True)
        return
    for name in (*names, *RUN_FILES, "target_tokenizer.json", OPTIMIZER_FILE, CURVE_FILE):
        (d / name).unlink(missing_ok=True)
        for tmp in d.glob(f".{name}.*tmp"):
            tmp.unlink(missing_ok=True)
    shutil.rmtree(d / "best", ignore_errors=True)
    for name in (STAGING, READY, SNAPSHOT_DIR):
        shutil.rmtree(d / name, ignore_errors=True)


def write_run_files(run_dir: str | Path, model: nn.Module, tokenizer, extra: dict) -> None:
    """config.json and the tokenizer files, in ``run_dir`` and in ``run_dir/best``: written
    once, before the first step (which also proves the directory writable before training)."""
    d = Path(run_dir)
    try:
        for target in (d, d / "best"):
            target.mkdir(exist_ok=True)
            write_run_config(target, model, extra)
            if tokenizer is not None:
                write_tokenizer(target, tokenizer)
    except OSError as e:
        raise RunError(
            f"cannot write the run directory {d}: {e.strerror or e} (nothing was trained)"
        ) from None


def write_checkpoint(
    run_dir: str | Path,
    model_tensors: dict[str, torch.Tensor],
    optimizer_tensors: dict[str, torch.Tensor],
    state: dict,
    fault: Callable[[str, Path], None] | None = None,
) -> None:
    """Write one checkpoint (model, optimizer, trainer state of ``state["step"]``) whole or not
    at all: staged in ``ckpt-tmp/``, committed by renaming it ``ckpt-ready/``, then installed.

    ``fault(point, staging_dir)`` is a test hook called at "start", "optimizer" (model staged)
    and "installed-model". An OSError (a full disk) leaves the previous checkpoint in place.
    """
    d = Path(run_dir)
    staging, ready = d / STAGING, d / READY
    hook = fault or (lambda point, where: None)
    try:
        hook("start", staging)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        meta = {"format": "pt", "step": str(state["step"])}
        save_tensors(staging / MODEL_FILE, model_tensors, meta)
        hook("optimizer", staging)
        save_tensors(staging / OPTIMIZER_FILE, optimizer_tensors)
        atomic_write_json(staging / STATE_FILE, state)
        fsync_dir(staging)
        os.replace(staging, ready)  # the commit point
        fsync_dir(d)
        for name in CHECKPOINT_FILES:
            os.replace(ready / name, d / name)
            if name == MODEL_FILE:
                hook("installed-model", staging)
        fsync_dir(d)
        ready.rmdir()
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def recover_checkpoint(run_dir: str | Path) -> None:
    """Bring a run directory back to one whole checkpoint after a crash: finish installing a
    committed ``ckpt-ready/``, discard an uncommitted ``ckpt-tmp/`` and half-written files."""
    run_dir = Path(run_dir)
    ready = run_dir / READY
    if ready.is_dir():
        for name in CHECKPOINT_FILES:
            if (ready / name).exists():
                os.replace(ready / name, run_dir / name)
        fsync_dir(run_dir)
        shutil.rmtree(ready)
    shutil.rmtree(run_dir / STAGING, ignore_errors=True)
    for tmp in list(run_dir.glob(".*.tmp")) + list((run_dir / "best").glob(".*.tmp")):
        tmp.unlink(missing_ok=True)  # a file whose atomic write was cut short


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


def read_checkpoint(run_dir: str | Path) -> tuple[dict, dict, dict] | None:
    """(trainer state, model tensors, optimizer tensors) of the run's last checkpoint, after
    ``recover_checkpoint``; None if it has none. The state's step must be a number and the
    model's weights must be of that step (their metadata says which)."""
    d = Path(run_dir)
    state = read_trainer_state(d)
    if state is None:
        return None
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise RunError(f"{d / STATE_FILE}: not a trainer state (no step number)")
    tensors = load_tensors(d / MODEL_FILE)
    from safetensors import safe_open

    with safe_open(str(d / MODEL_FILE), "pt") as f:
        model_step = (f.metadata() or {}).get("step", "-1")
    if str(model_step) != str(step):
        raise RunError(
            f"{d}: model.safetensors is from step {model_step} but trainer_state.json "
            f"from step {step}"
        )
    return state, tensors, load_tensors(d / OPTIMIZER_FILE)


def read_tokenizer_files(run_dir: str | Path):
    """The run's tokenizer: tokenizer.json, paired with target_tokenizer.json when there is one
    (an encoder-decoder run); None when the run has no tokenizer."""
    run_dir = Path(run_dir)
    src, tgt = run_dir / "tokenizer.json", run_dir / "target_tokenizer.json"
    try:
        tok = load_tokenizer(src) if src.is_file() else None
        if tok is not None and tgt.is_file():
            tok = PairTokenizer(tok, load_tokenizer(tgt))
    except TokenizerError as e:
        raise RunError(str(e)) from None  # it names the file
    return tok


def write_best(run_dir: str | Path, model_tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """best/model.safetensors; ``meta`` (step, metric, value) goes into its metadata."""
    meta = {"format": "pt", **{k: str(v) for k, v in meta.items()}}
    save_tensors(Path(run_dir) / "best" / MODEL_FILE, model_tensors, meta)


def append_metrics(run_dir: str | Path, row: dict) -> None:
    with open(Path(run_dir) / METRICS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


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


def truncate_metrics(run_dir: str | Path, step: int) -> list[dict]:
    """Keep the rows up to ``step`` (a resumed run rewrites what came after its checkpoint)."""
    path = Path(run_dir) / METRICS_FILE
    keep = [row for row in read_metrics(path) if row.get("step", 0) <= step]
    if path.is_file():
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in keep))
    return keep


def clear_metrics(run_dir: str | Path) -> None:
    """A run starting from step 0 begins with no metrics and no curve."""
    for name in (METRICS_FILE, CURVE_FILE):
        (Path(run_dir) / name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Training snapshots: attention and head scores recorded during training
# (written by attnlab.training.snapshots, read by attnlab timeline)
# ---------------------------------------------------------------------------------------------


def snapshot_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR / f"{SNAPSHOT_PREFIX}{step:08d}.safetensors"


def write_snapshot(run_dir: str | Path, step: int, tensors: dict[str, torch.Tensor],
                   meta: dict) -> Path:  # fmt: skip
    """``snapshots/step-NNNNNNNN.safetensors``: ``tensors`` and ``meta`` (JSON, in the file's
    metadata), written whole or not at all."""
    path = snapshot_path(run_dir, step)
    path.parent.mkdir(exist_ok=True)
    save_tensors(path, tensors, {"format": "pt", "snapshot": json.dumps({"step": step, **meta})})
    return path


def snapshot_steps(run_dir: str | Path) -> list[int]:
    """The steps that have a snapshot, in order."""
    d = Path(run_dir) / SNAPSHOT_DIR
    steps = []
    for p in d.glob(f"{SNAPSHOT_PREFIX}*.safetensors") if d.is_dir() else ():
        number = p.name[len(SNAPSHOT_PREFIX) : -len(".safetensors")]
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)


def read_snapshot(run_dir: str | Path, step: int, keys=None) -> tuple[dict, dict]:
    """(meta, tensors) of the snapshot of ``step``: every tensor, or those whose name starts
    with one of ``keys`` (the scores alone, without the patterns). A RunError names a damaged
    file."""
    from safetensors import safe_open

    path = snapshot_path(run_dir, step)
    try:
        with safe_open(str(path), "pt") as f:
            meta = json.loads((f.metadata() or {}).get("snapshot", "null"))
            names = [k for k in f.keys() if keys is None or k.startswith(tuple(keys))]  # noqa: SIM118
            tensors = {k: f.get_tensor(k) for k in names}
    except FileNotFoundError:
        raise RunError(f"{path}: file not found") from None
    except Exception as e:  # safetensors' own error types, bad JSON
        raise RunError(f"{path}: not a valid snapshot ({_short(e)})") from None
    if not isinstance(meta, dict) or meta.get("step") != step:
        raise RunError(f"{path}: not a valid snapshot (its metadata names no step {step})")
    return meta, tensors


def truncate_snapshots(run_dir: str | Path, step: int) -> None:
    """Remove the snapshots after ``step`` (a resumed run takes them again)."""
    for s in snapshot_steps(run_dir):
        if s > step:
            snapshot_path(run_dir, s).unlink(missing_ok=True)
    d = Path(run_dir) / SNAPSHOT_DIR
    for tmp in d.glob(".*.tmp") if d.is_dir() else ():
        tmp.unlink(missing_ok=True)


def clear_snapshots(run_dir: str | Path) -> None:
    """A run starting from step 0 begins with no snapshots."""
    shutil.rmtree(Path(run_dir) / SNAPSHOT_DIR, ignore_errors=True)
