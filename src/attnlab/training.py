"""The Trainer: one loop for any model, a loss function and a source of batches.

    trainer = Trainer(model, loss_fn, train_batches, TrainConfig(...), out_dir="runs/x",
                      val_batches=[...], tokenizer=tok)
    result = trainer.fit()          # or fit(resume=True) to continue from out_dir

- ``loss_fn(model, batch) -> scalar loss``: the model it gets may be wrapped (DDP,
  ``torch.compile``), so it must *call* the model, not reach into it. ``next_token_loss`` is the
  language-model one: mean cross-entropy of logits (B, T, V) against targets (B, T).
- ``train_batches``: an iterator of tuples of tensors (moved to the device here). If it has
  ``state_dict()``/``load_state_dict()`` (``attnlab.data.RandomWindows`` does), its position
  is saved with every checkpoint, so a resumed run sees the same batches.
- ``val_batches``: a fixed list of batches; every ``eval_interval`` steps the mean loss on them
  is ``val_loss`` (and on the fixed ``train_eval_batches``, if given, ``train_loss``).
  ``eval_extras(val_loss) -> dict`` adds figures such as bits per character.

Per step: linear warmup then cosine decay of the learning rate to ``min_lr``; ``grad_accum``
micro-batches; optional bf16/fp16 autocast; gradient clipping; AdamW with weight decay on
matrices only (fused where torch has it, else foreach).

Run directory (written by rank 0 only; see ``attnlab.checkpoint`` for the shared files):
    config.json, tokenizer.json     written once, before the first step (which also proves the
                                    directory is writable before any time is spent training)
    model.safetensors               the last checkpoint's weights (``load_run`` reads these)
    optimizer.safetensors           AdamW moments of the same step
    trainer_state.json              step, train config, RNG states, data position, best val loss
    best/                           config.json, tokenizer.json, model.safetensors of the best
                                    val loss so far (its step and loss in the file's metadata)
    metrics.jsonl, loss.png         one JSON line per log or eval; the loss curve

How a checkpoint stays whole: the three files of a checkpoint are first written into a fresh
``ckpt-tmp/`` directory (each file fsynced), which is then renamed to ``ckpt-ready/``: the
rename is the commit point. The files are then moved into place one by one (each move atomic)
and ``ckpt-ready/`` removed. A crash before the commit leaves the previous checkpoint untouched
(``ckpt-tmp/`` is discarded on resume); a crash after it is rolled forward on resume by
finishing the moves. ``model.safetensors`` is always one whole file, and config.json and
tokenizer.json never change during training, so ``load_run`` works at every instant.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import checkpoint as ckpt
from attnlab.config import BaseConfig, ConfigError
from attnlab.runtime import cpu_threads_for_load, resolve_device, resolve_dtype  # noqa: F401

STATE_FILE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss.png"
STAGING, READY = "ckpt-tmp", "ckpt-ready"
CHECKPOINT_FILES = (OPTIMIZER_FILE, MODEL_FILE, STATE_FILE)  # install order: state last

# Test-only fault injection, e.g. ATTNLAB_FAULT=kill-during-checkpoint:2 (see _Faults).
FAULT_ENV = "ATTNLAB_FAULT"


class TrainingError(RuntimeError):
    """Training had to stop (NaN loss, a failed write); the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# Configuration, schedule, optimizer
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainConfig(BaseConfig):
    max_iters: int = 2000
    batch_size: int = 12  # per process, per micro-step
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # None = max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 = no clipping
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 10
    seed: int = 1337
    device: str = "auto"
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    compile: bool = False

    def validate(self) -> None:
        self._positive(
            "max_iters",
            "batch_size",
            "grad_accum",
            "lr",
            "eval_interval",
            "eval_iters",
            "log_interval",
        )
        self._positive_or_none("lr_decay_iters")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"min_lr must be in [0, lr = {self.lr}], got {self.min_lr}")
        if self.warmup_iters < 0:
            raise ConfigError(f"warmup_iters must be >= 0, got {self.warmup_iters}")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        self._fraction("beta1", "beta2")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )


def lr_at(step: int, c: TrainConfig) -> float:
    """Linear warmup over ``warmup_iters``, then cosine decay to ``min_lr`` at ``lr_decay_iters``.

    lr(t) = lr * (t + 1) / (warmup + 1)                                  for t < warmup
    lr(t) = min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2, r = (t - warmup) / (decay - warmup)
    lr(t) = min_lr                                                       for t > decay
    """
    decay = c.lr_decay_iters or c.max_iters
    if step < c.warmup_iters:
        return c.lr * (step + 1) / (c.warmup_iters + 1)
    if step > decay or decay <= c.warmup_iters:
        return c.min_lr
    r = (step - c.warmup_iters) / (decay - c.warmup_iters)
    return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def make_optimizer(model: nn.Module, c: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with two groups: weight decay on matrices (dim >= 2: linear and embedding weights),
    none on vectors (biases, LayerNorm gains). Fused kernel where torch has one, else foreach."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": c.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kw = dict(lr=c.lr, betas=(c.beta1, c.beta2))
    try:
        return torch.optim.AdamW(groups, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, foreach=True, **kw)


def next_token_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Language modelling: mean cross-entropy of model(x) (B, T, V) against y (B, T)."""
    x, y = batch
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=-1
    )


def bits_per_char(loss_nats_per_token: float, chars_per_token: float) -> float:
    """Nats per token -> bits per character: loss / ln 2 / (characters per token)."""
    return loss_nats_per_token / math.log(2) / chars_per_token


# ---------------------------------------------------------------------------------------------
# Distributed
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device | None = None) -> DistInfo:
    """Join the process group that ``torchrun`` describes in the environment (RANK, WORLD_SIZE,
    LOCAL_RANK): nccl on CUDA, gloo on CPU. A single process returns DistInfo() untouched."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    import torch.distributed as dist

    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = device is not None and device.type == "cuda"
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return info


def _all_mean(value: float, dist_info: DistInfo, device: torch.device) -> float:
    if not dist_info.enabled:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist_info.world_size


# ---------------------------------------------------------------------------------------------
# Checkpoint pieces: optimizer state and RNG states as tensors / JSON
# ---------------------------------------------------------------------------------------------


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Optimizer state_dict split into tensors (``state.<param>.<key>``) and JSON (the rest)."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val):
                tensors[f"state.{idx}.{key}"] = val
            else:
                scalars[f"{idx}.{key}"] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def check_optimizer_tensors(
    opt: torch.optim.Optimizer, tensors: dict[str, Tensor], source: str
) -> None:
    """Every ``state.<param>.<key>`` names a parameter of ``opt``; moment buffers have its shape.

    ``torch.optim.Optimizer.load_state_dict`` checks neither, and casts silently."""
    params = [p for g in opt.param_groups for p in g["params"]]
    for name, t in tensors.items():
        parts = name.split(".", 2)
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise ckpt.RunError(f"{source}: unexpected tensor {name!r}")
        idx, key = int(parts[1]), parts[2]
        if idx >= len(params):
            raise ckpt.RunError(
                f"{source}: state for parameter {idx}, but the model has {len(params)}"
            )
        if key != "step" and tuple(t.shape) != tuple(params[idx].shape):
            raise ckpt.RunError(
                f"{source}: {name} has shape {tuple(t.shape)}, the parameter it belongs to "
                f"{tuple(params[idx].shape)}"
            )
        if not t.is_floating_point():
            raise ckpt.RunError(f"{source}: {name} has dtype {t.dtype}, expected a float")


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, t in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = t
    for name, val in meta.get("scalars", {}).items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = val
    groups = meta["param_groups"]
    for g in groups:
        g["betas"] = tuple(g["betas"])
    opt.load_state_dict({"state": state, "param_groups": groups})


def _b64(t: Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy())


def rng_state() -> dict:
    state = {"torch": _b64(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def recover_checkpoint(run_dir: str | Path) -> None:
    """Bring a run directory back to one whole checkpoint after a crash (see module docstring):
    finish installing a committed ``ckpt-ready/``, discard an uncommitted ``ckpt-tmp/``."""
    run_dir = Path(run_dir)
    ready = run_dir / READY
    if ready.is_dir():
        for name in CHECKPOINT_FILES:
            if (ready / name).exists():
                os.replace(ready / name, run_dir / name)
        ckpt.fsync_dir(run_dir)
        shutil.rmtree(ready)
    shutil.rmtree(run_dir / STAGING, ignore_errors=True)
    for tmp in list(run_dir.glob(".*.tmp")) + list((run_dir / "best").glob(".*.tmp")):
        tmp.unlink(missing_ok=True)  # a file whose atomic write was cut short


def check_writable(run_dir: str | Path) -> None:
    """Create ``run_dir`` if needed and prove a file can be written there (then remove it)."""
    d = Path(run_dir)
    try:
        if d.exists() and not d.is_dir():
            raise ckpt.RunError(f"{d}: exists and is not a directory")
        d.mkdir(parents=True, exist_ok=True)
        ckpt.atomic_write_text(d / ".write-test", "ok")
        (d / ".write-test").unlink()
    except OSError as e:
        raise ckpt.RunError(
            f"cannot write the run directory {d}: {e.strerror or e} "
            "(nothing was trained; choose another --out)"
        ) from None


def read_trainer_state(run_dir: str | Path) -> dict | None:
    path = Path(run_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ckpt.RunError(f"{path}: cannot read ({e})") from None
    if not isinstance(state, dict):
        raise ckpt.RunError(f"{path}: not a trainer state (expected a JSON object)")
    return state


# ---------------------------------------------------------------------------------------------
# Fault injection (tests only)
# ---------------------------------------------------------------------------------------------


class _Faults:
    """Parsed from $ATTNLAB_FAULT, comma separated; used only by the tests:

    kill-during-checkpoint:N  SIGKILL itself while staging the N-th checkpoint of this process
                              (model written, optimizer half written, nothing committed)
    kill-during-install:N     SIGKILL itself while installing the N-th checkpoint (committed,
                              model moved into place, trainer_state.json not yet)
    disk-full-at-checkpoint:N the N-th checkpoint write fails with ENOSPC
    nan-at:S                  the loss of step S becomes NaN
    step-delay:SECONDS        sleep after every step (so a test can kill a run mid-way)
    """

    def __init__(self, spec: str | None):
        self.items: dict[str, float] = {}
        for part in filter(None, (spec or "").split(",")):
            name, _, value = part.partition(":")
            self.items[name.strip()] = float(value or 1)

    def at(self, name: str, value: float) -> bool:
        return self.items.get(name) == value

    def get(self, name: str) -> float | None:
        return self.items.get(name)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# The Trainer
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
    step: int
    train_loss: float | None
    val_loss: float | None
    best_val_loss: float | None
    interrupted: bool = False
    out_dir: Path | None = None
    history: list[dict] = dataclasses.field(default_factory=list)


class Trainer:
    """Train ``model`` by minimising ``loss_fn(model, batch)`` over ``train_batches``.

    ``out_dir=None`` trains without writing anything (handy in notebooks and tests).
    ``run_extra`` is merged into config.json (e.g. the data source and tokenizer kind).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Any], Tensor],
        train_batches: Iterator,
        config: TrainConfig,
        out_dir: str | Path | None = None,
        *,
        val_batches: list | None = None,
        train_eval_batches: list | None = None,
        eval_extras: Callable[[float], dict] | None = None,
        tokenizer=None,
        run_extra: dict | None = None,
        dist_info: DistInfo | None = None,
        quiet: bool = False,
        log: Callable[[str], None] | None = None,
    ):
        self.config = c = config
        self.device = resolve_device(c.device)
        self.amp_dtype = resolve_dtype(c.dtype, self.device)
        self.dist = dist_info or DistInfo()
        self.raw_model = model.to(self.device)
        self.loss_fn = loss_fn
        self.train_batches = train_batches
        self.val_batches = val_batches or []
        self.eval_extras = eval_extras
        self.tokenizer = tokenizer
        self.run_extra = run_extra or {}
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.quiet = quiet
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.optimizer = make_optimizer(self.raw_model, c, self.device)
        # listed once: model.parameters() walks every submodule (~0.6 ms a step for the baby GPT)
        self._params = [p for p in self.raw_model.parameters() if p.requires_grad]
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.step = 0
        self.best_val_loss: float | None = None
        self.best_step: int | None = None
        self.last_saved_step: int | None = None
        self.train_eval_batches = train_eval_batches or []
        self.history: list[dict] = []
        self._faults = _Faults(os.environ.get(FAULT_ENV))
        self._n_saves = 0
        self._stop = False
        self._resumed: bool | None = None  # None: load_checkpoint not called yet
        self.model = self._wrap(self.raw_model)

    # -- set-up --------------------------------------------------------------------------------

    @property
    def writes(self) -> bool:
        return self.out_dir is not None and self.dist.is_main

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.dist.local_rank] if self.device.type == "cuda" else None
            model = DDP(model, device_ids=ids)
        if self.config.compile:
            model = torch.compile(model)
        return model

    def _autocast(self):
        if self.amp_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _to_device(self, batch):
        non_blocking = self.device.type == "cuda"
        if torch.is_tensor(batch):
            return batch.to(self.device, non_blocking=non_blocking)
        return type(batch)(self._to_device(b) for b in batch)

    def _prepare_dir(self) -> None:
        """Create the run directory and write config.json, tokenizer.json and best/: this is
        where an unwritable directory or a full disk is found, before any training."""
        d = self.out_dir
        check_writable(d)
        try:
            extra = {**self.run_extra, "train_config": self.config.to_dict()}
            for target in (d, d / "best"):
                target.mkdir(exist_ok=True)
                ckpt.write_run_config(target, self.raw_model, extra)
                if self.tokenizer is not None:
                    ckpt.atomic_write_text(target / "tokenizer.json", self.tokenizer.to_json())
        except OSError as e:
            raise ckpt.RunError(
                f"cannot write the run directory {d}: {e.strerror or e} (nothing was trained)"
            ) from None

    # -- checkpoints ---------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Write model, optimizer and trainer state as one checkpoint (see module docstring)."""
        if not self.writes:
            return
        self._n_saves += 1
        n = self._n_saves
        d = self.out_dir
        staging, ready = d / STAGING, d / READY
        try:
            if self._faults.at("disk-full-at-checkpoint", n):
                raise OSError(28, "No space left on device (injected)")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            meta = {"format": "pt", "step": str(self.step)}
            ckpt.save_tensors(
                staging / MODEL_FILE, ckpt.state_dict_for_saving(self.raw_model), meta
            )
            opt_tensors, opt_meta = optimizer_tensors(self.optimizer)
            if self._faults.at("kill-during-checkpoint", n):
                (staging / OPTIMIZER_FILE).write_bytes(b"\0" * 100)  # half a file, then die
                _kill_self()
            ckpt.save_tensors(staging / OPTIMIZER_FILE, opt_tensors)
            state = {
                "step": self.step,
                "train_config": self.config.to_dict(),
                "optimizer": opt_meta,
                "rng": rng_state(),
                "data": self.train_batches.state_dict()
                if hasattr(self.train_batches, "state_dict")
                else None,
                "best_val_loss": self.best_val_loss,
                "best_step": self.best_step,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "world_size": self.dist.world_size,
            }
            ckpt.atomic_write_json(staging / STATE_FILE, state)
            ckpt.fsync_dir(staging)
            os.replace(staging, ready)  # the commit point
            ckpt.fsync_dir(d)
            for name in CHECKPOINT_FILES:
                os.replace(ready / name, d / name)
                if name == MODEL_FILE and self._faults.at("kill-during-install", n):
                    _kill_self()
            ckpt.fsync_dir(d)
            ready.rmdir()
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            kept = (
                f"the last good checkpoint (step {self.last_saved_step}) is kept"
                if self.last_saved_step is not None
                else "no checkpoint had been written yet"
            )
            raise TrainingError(
                f"could not write the checkpoint of step {self.step} in {d}: "
                f"{e.strerror or e}; {kept}"
            ) from None
        self.last_saved_step = self.step

    def save_best(self, val_loss: float) -> None:
        if not self.writes:
            return
        meta = {"format": "pt", "step": str(self.step), "val_loss": repr(val_loss)}
        try:
            ckpt.save_tensors(
                self.out_dir / "best" / MODEL_FILE, ckpt.state_dict_for_saving(self.raw_model), meta
            )
        except OSError as e:
            raise TrainingError(
                f"could not write the best model of step {self.step}: {e.strerror or e}"
            ) from None

    def load_checkpoint(self) -> bool:
        """Restore model, optimizer, RNG and data position from ``out_dir``. False if none.

        Everything is read and checked before the run directory is written to; a checkpoint
        that cannot be continued from (corrupt, truncated, from another model or optimizer) is
        a ``RunError`` naming the file. Loading twice is a no-op (the CLI loads it early, so
        that a bad checkpoint is reported before anything else is printed).
        """
        if self._resumed is not None:
            return self._resumed
        d = self.out_dir
        if self.dist.is_main:
            recover_checkpoint(d)
        if self.dist.enabled:
            import torch.distributed as dist

            dist.barrier()
        state = read_trainer_state(d)
        if state is None:
            self._resumed = False
            return False
        state_path = d / STATE_FILE
        step = state.get("step") if isinstance(state, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ckpt.RunError(f"{state_path}: not a trainer state (no step number)")
        tensors = ckpt.load_tensors(d / MODEL_FILE)
        ckpt.check_state_dict(self.raw_model, tensors, str(d / MODEL_FILE))
        from safetensors import safe_open

        with safe_open(str(d / MODEL_FILE), "pt") as f:
            model_step = (f.metadata() or {}).get("step", "-1")
        if str(model_step) != str(step):
            raise ckpt.RunError(
                f"{d}: model.safetensors is from step {model_step} but "
                f"trainer_state.json from step {step}"
            )
        opt_tensors = ckpt.load_tensors(d / OPTIMIZER_FILE)
        check_optimizer_tensors(self.optimizer, opt_tensors, str(d / OPTIMIZER_FILE))
        self.raw_model.load_state_dict(tensors, strict=False)
        try:  # the model and optimizer are fresh: a failure here loses nothing
            load_optimizer(
                self.optimizer,
                {k: v.to(self.device) for k, v in opt_tensors.items()},
                state["optimizer"],
            )
            scratch = torch.Generator()
            scratch.set_state(_unb64(state["rng"]["torch"]))  # checked before it is used
            if state.get("data") is not None and hasattr(self.train_batches, "load_state_dict"):
                self.train_batches.load_state_dict(state["data"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            best = state.get("best_val_loss"), state.get("best_step")
            if not all(v is None or isinstance(v, (int, float)) for v in best):
                raise ValueError("best_val_loss and best_step must be numbers")
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as e:
            what = f"missing {e}" if isinstance(e, KeyError) else " ".join(str(e).split())[:200]
            raise ckpt.RunError(
                f"{state_path}: cannot continue from this checkpoint ({what})"
            ) from None
        self.step = self.last_saved_step = step
        self.best_val_loss, self.best_step = best
        if self.dist.is_main:  # said even with quiet: which step a run continues from matters
            self._log(f"resumed from the checkpoint of step {self.step} in {d}")
        self._resumed = True
        return True

    # -- evaluation ----------------------------------------------------------------------------

    @torch.no_grad()
    def mean_loss(self, batches: list) -> float:
        self.model.eval()
        total = 0.0
        for batch in batches:
            with self._autocast():
                total += float(self.loss_fn(self.model, self._to_device(batch)))
        self.model.train()
        return total / max(len(batches), 1)

    def evaluate(self) -> dict:
        """Mean loss on the fixed validation batches (and the fixed training batches)."""
        out: dict[str, float] = {}
        if self.train_eval_batches:
            out["train_loss"] = self.mean_loss(self.train_eval_batches)
        if self.val_batches:
            v = self.mean_loss(self.val_batches)
            out["val_loss"] = v
            out["val_ppl"] = math.exp(min(v, 700.0))
            if self.eval_extras is not None:
                out.update(self.eval_extras(v))
        return out

    # -- the loop ------------------------------------------------------------------------------

    def train_step(self) -> float:
        """One optimizer update over ``grad_accum`` micro-batches; returns the mean loss."""
        c, model = self.config, self.model
        lr = lr_at(self.step, c)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        total = torch.zeros((), device=self.device)
        for micro in range(c.grad_accum):
            batch = self._to_device(next(self.train_batches))
            last = micro == c.grad_accum - 1
            sync = contextlib.nullcontext() if (last or not self.dist.enabled) else self._no_sync()
            with sync:
                with self._autocast():
                    loss = self.loss_fn(model, batch) / c.grad_accum
                if self._faults.at("nan-at", self.step):
                    loss = loss * float("nan")
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
            self._tokens_per_step = batch[0].numel() * c.grad_accum * self.dist.world_size
        value = _all_mean(float(total), self.dist, self.device)
        if not math.isfinite(value):
            self._nan(value, "loss")
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if c.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self._params, c.grad_clip, foreach=True)
            if self.scaler is None and not math.isfinite(float(norm)):
                self._nan(float(norm), "gradient norm")
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return value

    def _no_sync(self):
        inner = getattr(self.model, "_orig_mod", self.model)
        return inner.no_sync()

    def _nan(self, value: float, what: str) -> None:
        kept = (
            f"the last good checkpoint (step {self.last_saved_step}) is kept in {self.out_dir}"
            if self.last_saved_step is not None and self.writes
            else "no checkpoint had been written yet"
        )
        dtype_hint = (
            ""
            if self.amp_dtype == torch.float32
            else f", or --dtype float32 (now {self.amp_dtype})"
        )
        raise TrainingError(
            f"the {what} became {value} at step {self.step + 1}: training stopped; {kept}. "
            f"Try a lower --lr (now {self.config.lr:g}){dtype_hint}, or more --warmup-iters"
        )

    def _write_metrics(self, row: dict) -> None:
        self.history.append(row)
        if self.writes:
            with open(self.out_dir / METRICS_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def _truncate_metrics(self) -> None:
        path = self.out_dir / METRICS_FILE
        if not self.writes or not path.is_file():
            return
        keep = [
            line
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= self.step
        ]
        ckpt.atomic_write_text(path, "".join(line + "\n" for line in keep))
        self.history = [json.loads(line) for line in keep]

    def fit(self, resume: bool = False) -> TrainResult:
        """Train to ``max_iters``, evaluating and checkpointing every ``eval_interval`` steps.

        SIGINT (Ctrl-C) saves a checkpoint and returns with ``interrupted=True``.
        """
        c = self.config
        resumed = False
        if self.out_dir is not None:
            if resume:  # read and check the checkpoint before writing anything
                resumed = self.load_checkpoint()
            if self.dist.is_main:
                self._prepare_dir()
            if (
                not resume and self.dist.is_main
            ):  # a fresh run replaces what an earlier run left here
                recover_checkpoint(self.out_dir)
                for name in (*CHECKPOINT_FILES, METRICS_FILE, CURVE_FILE):
                    (self.out_dir / name).unlink(missing_ok=True)
        if resumed:
            self._truncate_metrics()
        start = self.step
        previous = signal.getsignal(signal.SIGINT)
        in_main_thread = _in_main_thread()
        if in_main_thread:
            signal.signal(signal.SIGINT, self._on_sigint)
        progress = _Progress(
            c.max_iters, start, enabled=self.dist.is_main and not self.quiet, log=self._log
        )
        last_val = last_train = None
        window: list[float] = []
        t_window = time.perf_counter()
        try:
            with progress:
                while True:
                    at_eval = self.step % c.eval_interval == 0 or self.step >= c.max_iters
                    if at_eval and not (resumed and self.step == start):
                        ev = self.evaluate()
                        last_val = ev.get("val_loss", last_val)
                        row = {
                            "step": self.step,
                            "train_loss": ev.get("train_loss"),
                            **ev,
                            "lr": lr_at(self.step, c),
                            "tokens_per_s": None,
                        }
                        self._write_metrics(row)
                        progress.note(_eval_line(row))
                        if (
                            last_val is not None
                            and self.step > 0
                            and (self.best_val_loss is None or last_val < self.best_val_loss)
                        ):
                            self.best_val_loss, self.best_step = last_val, self.step
                            self.save_best(last_val)
                        if self.step > 0 and self.step != self.last_saved_step:
                            self.save_checkpoint()
                    if self.step >= c.max_iters:
                        break
                    if self._stop:
                        if self.last_saved_step != self.step:
                            self.save_checkpoint()
                        break
                    loss = self.train_step()
                    self.step += 1
                    last_train = loss
                    window.append(loss)
                    progress.advance(self.step, loss)
                    delay = self._faults.get("step-delay")
                    if delay:
                        time.sleep(delay)
                    if self.step % c.log_interval == 0 or self.step == c.max_iters:
                        dt = time.perf_counter() - t_window
                        tps = self._tokens_per_step * len(window) / dt if dt > 0 else None
                        row = {
                            "step": self.step,
                            "train_loss": sum(window) / len(window),
                            "lr": lr_at(self.step - 1, c),
                            "tokens_per_s": tps,
                            "ms_per_iter": 1000 * dt / len(window),
                        }
                        self._write_metrics(row)
                        progress.rate(tps)
                        if not progress.live:
                            progress.note(_log_line(row, c.max_iters))
                        window, t_window = [], time.perf_counter()
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, previous)
            if self.writes and self.history:
                with contextlib.suppress(Exception):  # a plot must never hide the real outcome
                    plot_metrics(self.out_dir / METRICS_FILE, self.out_dir / CURVE_FILE)
        return TrainResult(
            self.step,
            last_train,
            last_val,
            self.best_val_loss,
            self._stop,
            self.out_dir,
            self.history,
        )

    def _on_sigint(self, signum, frame) -> None:
        if self._stop:  # a second Ctrl-C: stop now (atomic writes keep the directory whole)
            raise KeyboardInterrupt
        self._stop = True
        self._log(
            f"\ninterrupted: saving a checkpoint at step {self.step} (Ctrl-C again to quit now)"
        )


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _eval_line(row: dict) -> str:
    parts = [f"step {row['step']}"]
    for key in ("train_loss", "val_loss", "val_ppl", "val_bpc", "val_accuracy"):
        if row.get(key) is not None:
            parts.append(f"{key} {row[key]:.4f}")
    return "eval  " + "  ".join(parts)


def _log_line(row: dict, max_iters: int) -> str:
    tps = row.get("tokens_per_s")
    return (
        f"step {row['step']}/{max_iters}  loss {row['train_loss']:.4f}  lr {row['lr']:.2e}  "
        f"{(tps or 0):,.0f} tok/s  {row.get('ms_per_iter', 0):.1f} ms/iter"
    )


class _Progress:
    """A rich progress bar on stderr (step, loss, tokens/s, ETA), or plain lines when stderr is
    not a terminal (CI logs, pipes)."""

    def __init__(self, total: int, start: int, enabled: bool, log: Callable[[str], None]):
        self.enabled, self.log = enabled, log
        self.live = False
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tps]} tok/s"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self.task = self.bar.add_task("train", total=total, completed=start, loss="-", tps="-")
            self.live = True

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def advance(self, step: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, loss=f"{loss:.4f}")

    def rate(self, tps: float | None) -> None:
        if self.bar is not None and tps:
            self.bar.update(self.task, tps=f"{tps:,.0f}")

    def note(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(line, highlight=False)
        else:
            self.log(line)


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def plot_metrics(metrics_path: str | Path, png_path: str | Path) -> Path:
    """Loss curve: training loss of every log line, training and validation loss of evals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    logs = [r for r in rows if "val_loss" not in r and r.get("train_loss") is not None]
    evals = [r for r in rows if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    if logs:
        ax.plot(
            [r["step"] for r in logs],
            [r["train_loss"] for r in logs],
            lw=1,
            alpha=0.6,
            label="train (batch)",
        )
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["val_loss"] for r in evals],
            "o-",
            ms=3,
            label="validation",
        )
        tr = [r for r in evals if r.get("train_loss") is not None]
        ax.plot(
            [r["step"] for r in tr],
            [r["train_loss"] for r in tr],
            "s--",
            ms=3,
            label="train (fixed batches)",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png_path = Path(png_path)
    ckpt.atomic_write(png_path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)
    return png_path
