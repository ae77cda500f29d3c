"""The locked writer: everything attnlab writes into a run directory (the files are listed in
``layout``), and ``RunDir``, the one object a training run writes its directory through.

    save_model(dir, model, tokenizer, extra)   config.json, model.safetensors, tokenizer.json
    with writing(out, writer=True) as run:      # the directory's writer lock (attnlab.files)
        run.create()                   # a new run: refuse one already there, make it, lock it
        run.write_tokenizer(tokenizer) # a new run's tokenizer, as soon as its data has one
        checked = run.reopen()         # a run to continue: checked, with its trainer state
        history = run.start(model, tokenizer, record, resumed=False, step=0)
        run.append_metrics(row); run.save_best(tensors, meta, model=model)
        run.save_checkpoint(model_tensors, optimizer_tensors, state, model=model)
        run.read_checkpoint(model=model)   # (state, model tensors, optimizer tensors) or None,
                                           # after finishing or discarding one cut short

How a checkpoint stays whole: its three files are first written into a fresh ``ckpt-tmp/``
directory (each file fsynced), which is then renamed to ``ckpt-ready/``: the rename is the
commit point. The files are then moved into place one by one (each move atomic) and
``ckpt-ready/`` removed. A crash before the commit leaves the previous checkpoint untouched
(``ckpt-tmp/`` is discarded by ``recover``); a crash after it is rolled forward by finishing
the moves. ``model.safetensors`` is always one whole file, and config.json and tokenizer.json
never change during training, so ``attnlab.load_run`` works at every instant.

One process writes a run directory at a time: a ``RunDir`` entered with ``with`` holds the
directory's ``FileLock``, an OS lock on the directory itself that dies with the process (kill
-9 too). A directory that does not exist yet is locked by ``create``, before its first file is
written. A second writer is refused in one line naming the holder. Readers take no lock:
renames make every file they open whole. ``writer=False`` (the processes of a torchrun job
other than rank 0) locks and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from attnlab.files import (
    FileLock,
    RunError,
    atomic_write_json,
    atomic_write_text,
    fsync_dir,
)
from attnlab.rundir.layout import (
    BEST_DIR,
    CHECKPOINT_FILES,
    CONFIG_FILE,
    CURVE_FILE,
    FORMAT_VERSION,
    LENS_FILE,
    LENS_META,
    METRICS_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    READY,
    RUN_FILES,
    SNAPSHOT_DIR,
    SNAPSHOT_PREFIX,
    STAGING,
    STATE_FILE,
    TARGET_TOKENIZER_FILE,
    TOKENIZER_FILE,
)
from attnlab.rundir.read import (
    CheckedRun,
    check_run,
    check_state_dict,
    model_digest,
    read_metrics,
    read_tokenizer_files,
    read_trainer_state,
    refuse_nonfinite,
    state_dict_for_saving,
    unwrap,
    weights_dtype,
)
from attnlab.safetensors_io import error_line, load_tensors, read_header, save_tensors
from attnlab.tokenizers import Tokenizer

# ---------------------------------------------------------------------------------------------
# A model directory: config.json, the weights, the tokenizer
# ---------------------------------------------------------------------------------------------


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
    save_tensors(run_dir / MODEL_FILE, state_dict_for_saving(inner), metadata={"format": "pt"})
    if tokenizer is not None:
        write_tokenizer(run_dir, tokenizer)
    write_run_config(run_dir, inner, extra)


def write_tokenizer(run_dir: str | Path, tokenizer) -> None:
    """tokenizer.json (and target_tokenizer.json for a PairTokenizer, as a seq2seq run has)."""
    files = getattr(tokenizer, "to_json_files", None)
    files = files() if files else {TOKENIZER_FILE: tokenizer.to_json()}
    for name, text in files.items():
        atomic_write_text(Path(run_dir) / name, text)


def write_run_config(run_dir: str | Path, model: nn.Module, extra: dict | None = None) -> None:
    """Write config.json: format version, model_type, the model's config, and ``extra``."""
    inner = unwrap(model)
    cfg = {"attnlab_format": FORMAT_VERSION, "model_type": inner.model_type}
    cfg["config"] = inner.config.to_dict()
    dtype = weights_dtype(inner)
    if dtype != "float32":  # float32, the default, is not written: older runs read the same
        cfg["dtype"] = dtype
    cfg.update(extra or {})
    atomic_write_json(Path(run_dir) / CONFIG_FILE, cfg)


def write_tuned_lens(run_dir: str | Path, probes: dict[str, torch.Tensor],
                     meta: dict) -> tuple[Path, Path]:  # fmt: skip
    """tuned_lens.safetensors (the probes, in float32) and tuned_lens.json (``meta`` and the
    sha256 of the weights they were fitted on), each written atomically under the directory's
    writer lock (a training run writing it refuses this). Returns both paths."""
    run_dir = Path(run_dir)
    with FileLock(run_dir):
        meta = {**meta, "model_sha256": model_digest(run_dir)}
        save_tensors(run_dir / LENS_FILE, {k: v.float() for k, v in probes.items()})
        atomic_write_json(run_dir / LENS_META, meta)
    return run_dir / LENS_FILE, run_dir / LENS_META


# ---------------------------------------------------------------------------------------------
# A training run
# ---------------------------------------------------------------------------------------------

# ``fault(point, staging_dir)``: called while a checkpoint is written (see save_checkpoint)
Fault = Callable[[str, Path], None]


class RunDir:
    """A training run's directory (see the module docstring): its path and its writer lock."""

    def __init__(self, path: str | Path, *, writer: bool = True):
        self.path = Path(path)
        self.writer = writer
        self.lock = FileLock(self.path, enabled=writer)
        self.created = False  # made by ``create`` (so ``discard`` removes it whole)
        self.model_file, self.optimizer_file = self.path / MODEL_FILE, self.path / OPTIMIZER_FILE
        self.state_file, self.metrics_file = self.path / STATE_FILE, self.path / METRICS_FILE
        self.curve_file = self.path / CURVE_FILE
        self.kept_snapshots: list[int] = []  # the snapshots' steps once ``start`` has run

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __enter__(self) -> RunDir:
        self.lock.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.lock.__exit__(*exc)

    # -- a new run -----------------------------------------------------------------------------

    def create(self) -> None:
        """Open the directory of a new run: refuse one that holds a run (even part of one: it
        is continued with --resume, never replaced); create it if needed, take its lock, and
        prove a file can be written there. A directory holding other files may be used."""
        d = self.path
        if d.exists() and not d.is_dir():
            raise RunError(f"{d}: exists and is not a directory")
        found = [name for name in RUN_FILES if (d / name).exists()]
        if found:
            raise RunError(self._held(found[0]))
        self.created = not d.exists()
        self._check_writable()

    def _held(self, first: str) -> str:
        d = self.path
        if self.state_file.is_file():
            try:
                step = (self.trainer_state() or {}).get("step")
            except RunError:
                step = None
            held = f"a training run (step {step})" if step is not None else "a training run"
            return (
                f"{d} already holds {held}; pass --resume to continue it, or choose another --out"
            )
        if self.model_file.is_file():
            return f"{d} already holds a model; choose another --out (it is left as it is)"
        return (f"{d} holds part of a run that never wrote its first checkpoint ({first}); "
                "remove the directory or choose another --out")  # fmt: skip

    def _check_writable(self) -> None:
        """Create the directory if needed, take its lock, and prove a file can be written there
        (then remove it)."""
        d = self.path
        try:
            if d.exists() and not d.is_dir():
                raise RunError(f"{d}: exists and is not a directory")
            d.mkdir(parents=True, exist_ok=True)
            self.lock.take()  # before the first file: a second writer is refused here
            atomic_write_text(d / ".write-test", "ok")
            (d / ".write-test").unlink()
        except OSError as e:
            raise RunError(
                f"cannot write the run directory {d}: {e.strerror or e} "
                "(nothing was trained; choose another --out)"
            ) from None

    def discard(self, names: tuple[str, ...] = ()) -> None:
        """Bad input found while a new run was being prepared: leave nothing behind. A directory
        ``create`` made is removed whole; in one that existed, only ``names`` (files or
        directories, such as a task's token shards) and the files every run writes are removed,
        with their temporary copies."""
        d = self.path
        if self.created:
            shutil.rmtree(d, ignore_errors=True)
            return
        for name in (*names, *RUN_FILES, TARGET_TOKENIZER_FILE, OPTIMIZER_FILE, CURVE_FILE):
            if (d / name).is_dir() and not (d / name).is_symlink():
                shutil.rmtree(d / name, ignore_errors=True)
            else:
                (d / name).unlink(missing_ok=True)
            for tmp in d.glob(f".{name}.*tmp"):
                tmp.unlink(missing_ok=True)
        for name in (BEST_DIR, STAGING, READY, SNAPSHOT_DIR):
            shutil.rmtree(d / name, ignore_errors=True)

    def write_tokenizer(self, tokenizer) -> None:
        """A new run's tokenizer files, as soon as its data has made them (the other processes
        of a torchrun job read them from here); ``start`` writes them again with config.json."""
        write_tokenizer(self.path, tokenizer)

    def read_tokenizer(self):
        """The run's tokenizer (``read_tokenizer_files``)."""
        return read_tokenizer_files(self.path)

    def reopen(self) -> CheckedRun:
        """A run to continue training: its config.json, weights' header and tokenizer checked
        against each other before anything is allocated (``check_run``: the model it describes
        is built on the meta device), with its trainer state (None: no checkpoint yet)."""
        checked = check_run(self.path)
        checked.state = self.trainer_state()
        return checked

    # -- the Trainer's calls -------------------------------------------------------------------

    def start(self, model: nn.Module, tokenizer, extra: dict, *, resumed: bool,
              step: int) -> list[dict]:  # fmt: skip
        """Begin training in this directory; returns the metrics rows kept (the history).

        A run that does not continue a checkpoint (``resumed`` False) is refused where one is
        (continue it with resume). Then, by the writer: config.json and the tokenizer files, in
        the directory and in best/ (written once, before the first step, which also proves the
        directory writable before training); the metrics and snapshots after ``step`` removed
        (a resumed run writes them again), or all of them and the curve for a run from 0.
        ``kept_snapshots`` then lists the steps of the snapshots kept."""
        if not resumed and self.trainer_state() is not None:
            raise RunError(f"{self.path} already holds a training run; continue it with resume "
                           "(--resume), or choose another directory")  # fmt: skip
        if not self.writer:
            return []
        self._check_writable()
        try:
            for target in (self.path, self.path / BEST_DIR):
                target.mkdir(exist_ok=True)
                write_run_config(target, model, extra)
                if tokenizer is not None:
                    write_tokenizer(target, tokenizer)
        except OSError as e:
            raise RunError(f"cannot write the run directory {self.path}: {e.strerror or e} "
                           "(nothing was trained)") from None  # fmt: skip
        if resumed:
            self._truncate_snapshots(step)
            self.kept_snapshots = self.snapshot_steps()
            return self._truncate_metrics(step)
        for path in (self.metrics_file, self.curve_file):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.path / SNAPSHOT_DIR, ignore_errors=True)
        return []

    def save_checkpoint(self, model_tensors: dict[str, torch.Tensor],
                        optimizer_tensors: dict[str, torch.Tensor], state: dict,
                        fault: Fault | None = None, *, model: nn.Module | None = None,
                        metrics: dict | None = None) -> None:  # fmt: skip
        """Write one checkpoint (model, optimizer, trainer state of ``state["step"]``) whole or
        not at all: staged in ``ckpt-tmp/``, committed by renaming it ``ckpt-ready/``, then
        installed. An OSError (a full disk) leaves the previous checkpoint in place. Given the
        ``model`` whose state dict ``model_tensors`` is, its tied copies are stored once.
        ``metrics``: the row of the evaluation this checkpoint follows, appended to
        metrics.jsonl first (it is kept whatever becomes of the checkpoint, as a row appended on
        its own would be).

        ``fault(point, staging_dir)`` is called at "start", "optimizer" (model staged) and
        "installed-model" (committed, the model moved into place): where a test injects a
        crash or a full disk (``Trainer`` callbacks' ``on_save``)."""
        if metrics is not None:
            self.append_metrics(metrics)
        if model is not None:
            model_tensors = state_dict_for_saving(model, model_tensors)
        d = self.path
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

    def save_best(self, model_tensors: dict[str, torch.Tensor], meta: dict, *,
                  model: nn.Module | None = None) -> None:  # fmt: skip
        """best/model.safetensors; ``meta`` (step, metric, value) goes into its metadata. Given
        the ``model`` whose state dict ``model_tensors`` is, its tied copies are stored once."""
        if model is not None:
            model_tensors = state_dict_for_saving(model, model_tensors)
        meta = {"format": "pt", **{k: str(v) for k, v in meta.items()}}
        save_tensors(self.path / BEST_DIR / MODEL_FILE, model_tensors, meta)

    def append_metrics(self, row: dict) -> None:
        with open(self.metrics_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def recover(self) -> None:
        """Bring the directory back to one whole checkpoint after a crash (the writer alone):
        finish installing a committed ``ckpt-ready/``, discard an uncommitted ``ckpt-tmp/`` and
        half-written files."""
        if not self.writer:
            return
        d, ready = self.path, self.path / READY
        if ready.is_dir():
            for name in CHECKPOINT_FILES:
                if (ready / name).exists():
                    os.replace(ready / name, d / name)
            fsync_dir(d)
            shutil.rmtree(ready)
        shutil.rmtree(d / STAGING, ignore_errors=True)
        for tmp in list(d.glob(".*.tmp")) + list((d / BEST_DIR).glob(".*.tmp")):
            tmp.unlink(missing_ok=True)  # a file whose atomic write was cut short

    def read_checkpoint(
        self, sync: Callable[[], None] | None = None, *, model: nn.Module | None = None
    ) -> tuple[dict, dict, dict] | None:
        """(trainer state, model tensors, optimizer tensors) of the last checkpoint, once the
        writer has ``recover``-ed it (``sync()`` then runs in every process: a barrier, so
        that the others read what it recovered); None if there is none. The state's step must
        be a number and the model's weights must be of that step (their metadata says which);
        given the ``model`` they are for, their names, shapes and dtypes must be its."""
        self.recover()
        if sync is not None:
            sync()
        state = self.trainer_state()
        if state is None:
            return None
        step = state.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise RunError(f"{self.state_file}: not a trainer state (no step number)")
        header = read_header(self.model_file)
        model_step = header.metadata.get("step", "-1")
        if str(model_step) != str(step):
            raise RunError(f"{self.path}: model.safetensors is from step {model_step} but "
                           f"trainer_state.json from step {step}")  # fmt: skip
        tensors = load_tensors(self.model_file, header=header)
        if model is not None:
            check_state_dict(model, tensors, str(self.model_file))
        refuse_nonfinite(tensors, self.model_file)
        return state, tensors, load_tensors(self.optimizer_file)

    # -- reading -------------------------------------------------------------------------------

    def trainer_state(self) -> dict | None:
        return read_trainer_state(self.path)

    def metrics(self) -> list[dict]:
        return read_metrics(self.path)

    def _truncate_metrics(self, step: int) -> list[dict]:
        """Keep the rows up to ``step`` (a resumed run rewrites what came after its checkpoint)."""
        keep = [row for row in self.metrics() if row.get("step", 0) <= step]
        if self.metrics_file.is_file():
            atomic_write_text(self.metrics_file, "".join(json.dumps(row) + "\n" for row in keep))
        return keep

    # -- snapshots (attnlab.training.snapshots writes them, attnlab timeline reads them) ------

    def snapshot_path(self, step: int) -> Path:
        return self.path / SNAPSHOT_DIR / f"{SNAPSHOT_PREFIX}{step:08d}.safetensors"

    def write_snapshot(self, step: int, tensors: dict[str, torch.Tensor], meta: dict) -> Path:
        """``snapshots/step-NNNNNNNN.safetensors``: ``tensors`` and ``meta`` (JSON, in the
        file's metadata), written whole or not at all."""
        path = self.snapshot_path(step)
        path.parent.mkdir(exist_ok=True)
        save_tensors(
            path, tensors, {"format": "pt", "snapshot": json.dumps({"step": step, **meta})}
        )
        return path

    def snapshot_steps(self) -> list[int]:
        """The steps that have a snapshot, in order."""
        d = self.path / SNAPSHOT_DIR
        steps = []
        for p in d.glob(f"{SNAPSHOT_PREFIX}*.safetensors") if d.is_dir() else ():
            number = p.name[len(SNAPSHOT_PREFIX) : -len(".safetensors")]
            if number.isdigit():
                steps.append(int(number))
        return sorted(steps)

    def read_snapshot(self, step: int, keys=None) -> tuple[dict, dict]:
        """(meta, tensors) of the snapshot of ``step``: every tensor, or those whose name
        starts with one of ``keys`` (the scores alone, without the patterns). A RunError names
        a damaged file."""
        from safetensors import safe_open

        path = self.snapshot_path(step)
        try:
            with safe_open(str(path), "pt") as f:
                meta = json.loads((f.metadata() or {}).get("snapshot", "null"))
                names = [k for k in f.keys() if keys is None or k.startswith(tuple(keys))]  # noqa: SIM118
                tensors = {k: f.get_tensor(k) for k in names}
        except FileNotFoundError:
            raise RunError(f"{path}: file not found") from None
        except Exception as e:  # safetensors' own error types, bad JSON
            raise RunError(f"{path}: not a valid snapshot ({error_line(e)})") from None
        if not isinstance(meta, dict) or meta.get("step") != step:
            raise RunError(f"{path}: not a valid snapshot (its metadata names no step {step})")
        return meta, tensors

    def _truncate_snapshots(self, step: int) -> None:
        """Remove the snapshots after ``step`` (a resumed run takes them again)."""
        for s in self.snapshot_steps():
            if s > step:
                self.snapshot_path(s).unlink(missing_ok=True)
        d = self.path / SNAPSHOT_DIR
        for tmp in d.glob(".*.tmp") if d.is_dir() else ():
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def writing(path: str | Path, *, writer: bool = True, new: bool = False) -> Iterator[RunDir]:
    """The run directory at ``path``, its writer lock held while the block runs (by the
    ``writer``: the other processes of a torchrun job lock and write nothing). ``new``: a new
    run's, made as ``RunDir.create`` makes it (refused where a run is); should the block fail
    before anything is written there, a directory made for it is removed again."""
    with RunDir(path, writer=writer) as run:
        if new and writer:
            run.create()
        try:
            yield run
        except BaseException:
            if run.created and run.path.is_dir() and not any(run.path.iterdir()):
                run.path.rmdir()
            raise
