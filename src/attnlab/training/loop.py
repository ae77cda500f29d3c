"""The Trainer: the one training loop, for every task.

    trainer = Trainer(model, task, TrainConfig(...), out_dir="runs/x")
    result = trainer.fit()          # or fit(resume=True) to continue from out_dir

The task (see ``attnlab.tasks.base.Task``) says what is trained; the Trainer only calls it:
    task.train_batches(batch_size, seed, rank, world_size)  an endless, resumable batch source
    task.val_batches(batch_size, eval_iters)                fixed held-out batches
    task.train_eval_batches(batch_size, eval_iters)         fixed training batches (or [])
    task.loss(model, batch) -> scalar                       calls model(...), so that the DDP
                                                            and torch.compile wrappers see it
    task.count(batch) -> int                                throughput, in task.unit
    task.evaluate(model, val_loss) -> dict                  the task's own figures
    task.example(model) -> str | None                       shown at each evaluation
    task.metrics, task.best, task.loss_unit, task.title     its words, and what "best" means
    task.tokenizer, task.run_config()                       what goes into the run directory

Per step: the learning rate of the schedule (``attnlab.training.optim``); ``grad_accum``
micro-batches; optional bf16/fp16 autocast; gradient clipping; AdamW. The step never waits for
the device: the loss and the gradient norm stay device tensors, a step whose loss or norm is not
finite is skipped by the fused AdamW kernel itself (its ``found_inf``), and they are read back
(one host sync) only every ``log_interval`` steps and before an evaluation or a checkpoint,
where a non-finite value stops training naming its step. (Several processes agree on the loss
and on a signal at every step, so they read it back every step.) Every ``eval_interval``
steps (and at step 0 and the last step): an evaluation, best/ if it is the best so far, and a
checkpoint; also a checkpoint whenever ``checkpoint_seconds`` have passed since the last, so a
run killed early still leaves one. The run directory is one object, ``out_dir``'s
``attnlab.rundir.RunDir``, that the Trainer calls a handful of times: ``start``,
``append_metrics``, ``save_best``, ``save_checkpoint`` (whole or not at all), and
``read_checkpoint`` to resume; rank 0 alone writes.

Callbacks (``callbacks=``) see the run without the loop knowing what they do: each may define
    on_open(trainer, resumed)   once the run directory is open (resumed: continuing a checkpoint)
    on_step(trainer)            at every step, before its update (``trainer.step`` updates done,
                                ``trainer.raw_model`` the model); also at the last step
    on_loss(trainer, loss)      each micro-batch's loss before its backward pass; returns the
                                loss to use (a test's fault injection makes it NaN)
    on_step_end(trainer)        once a step's update is done (``trainer.step`` counts it)
    on_save(trainer, point, staging)  while a checkpoint is written: at "start", "optimizer"
                                (the model staged) and "installed-model" (committed, the model
                                in place); where a test injects a full disk or a crash
    on_metrics(trainer, row)    each row as it is added to metrics.jsonl (a log line or an
                                evaluation; every process, written or not)
    on_close(trainer)           once the loop has ended, however it ended
A callback may end the run early, cleanly (early stopping): ``trainer.finish_early(why)`` during
an evaluation (``on_metrics`` of its row) makes that evaluation the run's last, as if
``max_iters`` had been reached there: it is saved and the run is finished, not interrupted.
Training snapshots (``attnlab.training.snapshots``), the TensorBoard log
(``attnlab.training.tracking``) and the tests' fault injection (``attnlab.training.faults``)
are three. A callback must not draw from the global RNGs, so that a run with callbacks trains
exactly as one without.

SIGINT (Ctrl-C) and SIGTERM finish the step in progress, save it, and return with
``interrupted`` set to the signal's name; the same signal again stops at once. A NaN loss or
gradient stops with a TrainingError; the last good checkpoint stays.

``compile=None`` (the default) compiles the model once the run has shown, by the time its first
steps took, that the steps left would repay the compilation (``compile_pays``); True compiles
from the start, False never. ``fsdp`` under torchrun shards the model (``distributed.shard``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.files import RunError
from attnlab.heartbeat import count as count_done
from attnlab.metrics import Metric, val_loss_metric
from attnlab.modes import evaluating
from attnlab.rundir import RunDir
from attnlab.runtime import resolve_device, resolve_dtype, thread_choice
from attnlab.safetensors_io import nonfinite
from attnlab.train_config import TrainConfig
from attnlab.training.distributed import (
    DistInfo,
    all_sum,
    full_optimizer_state_dict,
    full_state_dict,
    held_bytes,
    load_full_state_dicts,
    set_gradient_sync,
    shard,
    unsharded,
)
from attnlab.training.optim import (
    check_optimizer_tensors,
    load_optimizer,
    lr_at,
    make_optimizer,
    optimizer_state_dict,
    optimizer_tensors,
    set_lr,
)
from attnlab.training.plots import loss_png_wanted, plot_metrics
from attnlab.training.progress import Progress, eval_line, log_line
from attnlab.training.state import check_rng_state, rng_state, set_rng_state

SIGNALS = (signal.SIGINT, signal.SIGTERM)

# torch.compile, when not chosen (compile=None): by device type, (seconds a first compilation
# takes, how many times that the eager steps left must take for it to pay). Measured on the baby
# GPT: on 2 CPU cores inductor takes ~55 s and makes a step 5-8% faster; on a GPU it takes
# ~40 s and makes a small model's step several times faster (benchmarks/bench.py).
COMPILE_COST = {"cpu": (60.0, 20.0), "cuda": (45.0, 3.0)}
COMPILE_DECIDE_AFTER = 20  # steps timed before deciding


def compile_pays(device_type: str, steps_left: int, seconds_per_step: float) -> bool:
    """Whether compiling now pays: the eager steps left take at least ``factor`` times the
    compilation (COMPILE_COST)."""
    cost, factor = COMPILE_COST.get(device_type, COMPILE_COST["cpu"])
    return steps_left * seconds_per_step >= factor * cost


class TrainingError(RuntimeError):
    """Training had to stop (NaN loss, a failed write); the message says why and what to do."""


@dataclasses.dataclass
class TrainResult:
    step: int  # the last step trained (and saved, when there is a run directory)
    train_loss: float | None
    val_loss: float | None
    best: dict | None  # {"metric", "value", "val_loss", "step"} of the best evaluation
    interrupted: str | None = None  # "SIGINT" or "SIGTERM" when a signal stopped the run
    out_dir: Path | None = None
    history: list[dict] = dataclasses.field(default_factory=list)
    last_eval: dict = dataclasses.field(default_factory=dict)
    val_on: str = ""  # what val_loss is computed on (Task.val_source)


class Trainer:
    """Train ``model`` on ``task`` with ``config`` into ``out_dir`` (a path, or a ``RunDir``
    whose lock the caller holds); ``out_dir=None`` writes nothing (notebooks, tests)."""

    def __init__(
        self,
        model: nn.Module,
        task,
        config: TrainConfig,
        out_dir: str | Path | RunDir | None = None,
        *,
        dist_info: DistInfo | None = None,
        quiet: bool = False,
        log: Callable[[str], None] | None = None,
        callbacks: Sequence[Any] = (),
    ):
        self.config = c = config
        self.callbacks = list(callbacks)
        self.task = task
        self.device = resolve_device(c.device)
        self.amp_dtype = resolve_dtype(c.dtype, self.device)
        self.threads = thread_choice()  # made by the caller (training.run.train, a CLI verb)
        self.dist = dist_info or DistInfo()
        self.raw_model = model.to(self.device)
        self._owns_run = out_dir is not None and not isinstance(out_dir, RunDir)
        if self._owns_run:  # a RunDir given is its caller's to lock (training.run.train's)
            out_dir = RunDir(out_dir, writer=self.dist.is_main)
        self.run: RunDir | None = out_dir
        self.out_dir = out_dir.path if out_dir is not None else None
        self._loss_hooks = [cb.on_loss for cb in self.callbacks if hasattr(cb, "on_loss")]
        self.quiet = quiet
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.train_batches = task.train_batches(c.batch_size, c.seed, self.dist.rank,
                                                self.dist.world_size)  # fmt: skip
        rows = c.eval_batch_size or c.batch_size
        self.val_batches = task.val_batches(rows, c.eval_iters)
        self.val_on = task.val_source(self.val_batches) if self.val_batches else ""
        self.train_eval_batches = task.train_eval_batches(rows, c.eval_iters)
        self.metrics: tuple[Metric, ...] = (val_loss_metric(task.loss_unit), *task.metrics)
        self.best_metric = next(m for m in self.metrics if m.name == task.best)
        self.sharded = c.fsdp and self.dist.enabled
        if self.sharded:  # before the optimizer: it must hold the sharded parameters
            shard(self.raw_model, self.device)
        self.optimizer = make_optimizer(self.raw_model, c)
        # listed once: model.parameters() walks every submodule (~0.6 ms a step for the baby GPT)
        self._params = [p for p in self.raw_model.parameters() if p.requires_grad]
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        # a fused AdamW skips a non-finite step on the device: nothing waits for the device
        fused = bool(self.optimizer.defaults.get("fused"))
        self.defers_readback = fused and self.scaler is None and not self.dist.enabled
        self._pending: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []
        self._window: list[float] = []  # losses read back since the last log line
        self._last_loss: float | None = None
        self._due_all = False  # several processes: a time-based checkpoint all agreed on
        self._compiled = bool(c.compile)
        self._timed: tuple[int, float] | None = None  # (step, time) where timing began
        self.step = 0
        self.best: dict | None = None
        self.last_saved_step: int | None = None
        self.history: list[dict] = []
        self._last_save_at, self._last_save_cost = time.monotonic(), 0.0
        self._eval_seconds = 0.0  # how long the last evaluation took (the time left counts it)
        self._stop: str | None = None  # the signal that asked to stop (this process)
        self._stop_all: str | None = None  # ... as agreed by every process
        self.finished_early: str | None = None  # why a callback ended the run (finish_early)
        self._counted = 0  # items (task.unit) trained since the last log line
        self._resumed: bool | None = None  # None: load_checkpoint not called yet
        self._fit_began = time.perf_counter()  # reset when fit starts (elapsed)
        self._elapsed_before = 0.0  # fit's wall seconds in the runs a resumed one continues
        self.model = self._wrap(self.raw_model)

    # -- set-up --------------------------------------------------------------------------------

    @property
    def writes(self) -> bool:
        return self.out_dir is not None and self.dist.is_main

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.dist.enabled and not self.sharded:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.dist.local_rank] if self.device.type == "cuda" else None
            model = DDP(model, device_ids=ids)
        if self.config.compile:
            model = torch.compile(model, backend=self.config.compile_backend)
        return model

    def held_bytes(self) -> int:
        """Bytes of parameters, gradients and optimizer state this process holds (its shards
        under FSDP)."""
        return held_bytes(self.raw_model, self.optimizer)

    def unsharded(self):
        """A context in which every method of the raw model runs (FSDP: all processes enter
        it together and every parameter is whole inside); a no-op otherwise."""
        return unsharded(self.raw_model) if self.sharded else contextlib.nullcontext()

    def _maybe_compile(self) -> None:
        """compile=None: once COMPILE_DECIDE_AFTER steps are timed, compile if it pays."""
        c = self.config
        if c.compile is not None or self._compiled or self._timed is None:
            return
        first, t0 = self._timed
        if self.step - first < COMPILE_DECIDE_AFTER:
            return
        per_step = (time.perf_counter() - t0) / (self.step - first)
        pays = compile_pays(self.device.type, c.max_iters - self.step, per_step)
        if self.dist.enabled:  # every process decides alike
            pays = all_sum([float(pays)], self.dist, self.device)[0] > 0
        self._compiled = True  # decided, either way
        if not pays:
            return
        if self.dist.is_main and not self.quiet:
            self._log(f"compiling the model (torch.compile): {c.max_iters - self.step} steps of "
                      f"{1000 * per_step:.0f} ms are left, enough to repay it")  # fmt: skip
        self.model = torch.compile(self.model, backend=c.compile_backend)

    def _autocast(self):
        if self.amp_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _to_device(self, batch):
        non_blocking = self.device.type == "cuda"
        if torch.is_tensor(batch):
            return batch.to(self.device, non_blocking=non_blocking)
        return type(batch)(self._to_device(b) for b in batch)

    def _open_run(self, resume: bool) -> bool:
        """Load the checkpoint (resume) or refuse to replace one; write config.json and the
        tokenizer, in the run directory and best/. True if training continues a checkpoint."""
        if self.run is None:
            return False
        resumed = self.load_checkpoint() if resume else False
        tokenizer = getattr(self.task, "tokenizer", None)
        self.history = self.run.start(self.raw_model, tokenizer, self.run_record(),
                                      resumed=resumed, step=self.step)  # fmt: skip
        return resumed

    def run_record(self) -> dict:
        """What config.json says about this run besides the model: the task's options, the
        train config, and where it ran (device, CPU threads and why)."""
        where = {"device": str(self.device), **self.threads.to_dict()}
        return {**self.task.run_config(), "train_config": self.config.to_dict(), "runtime": where}

    # -- checkpoints ---------------------------------------------------------------------------

    def _gathered(self) -> tuple[dict, dict | None]:
        """The whole model state dict and optimizer state dict of this process, or gathered
        from every process's shards (FSDP: all of them call this). The run directory stores
        tied copies once (``RunDir.save_checkpoint``'s ``model``)."""
        if not self.sharded:
            return self.raw_model.state_dict(), None
        model_sd = full_state_dict(self.raw_model)
        opt_sd = full_optimizer_state_dict(self.raw_model, self.optimizer)
        return model_sd, opt_sd

    def save_checkpoint(self, rows: list[dict] | None = None) -> None:
        """Write model, optimizer and trainer state of this step as one checkpoint (with the
        metrics row taken from ``rows``, an evaluation's row not yet written: see
        ``RunDir.save_checkpoint``)."""
        if self.run is None or not (self.writes or self.sharded):
            return
        self._flush()  # a step that was not finite is never saved
        t0 = time.monotonic()
        model_tensors, opt_sd = self._gathered()
        if not self.writes:
            return
        self._refuse_nonfinite(model_tensors)
        opt_tensors, opt_meta = optimizer_tensors(self.optimizer, opt_sd)
        data = self.train_batches
        state = {
            "step": self.step,
            "train_config": self.config.to_dict(),
            "optimizer": opt_meta,
            "rng": rng_state(),
            "data": data.state_dict() if hasattr(data, "state_dict") else None,
            "best": self.best,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "world_size": self.dist.world_size,
            "elapsed_s": self.elapsed(),
        }
        try:
            self.run.save_checkpoint(model_tensors, opt_tensors, state, fault=self._on_save,
                                     model=self.raw_model,
                                     metrics=rows.pop() if rows else None)  # fmt: skip
        except OSError as e:
            raise TrainingError(
                f"could not write the checkpoint of step {self.step} in {self.out_dir}: "
                f"{e.strerror or e}; {self._kept()}"
            ) from None
        self.last_saved_step = self.step
        self._last_save_at = time.monotonic()
        self._last_save_cost = self._last_save_at - t0

    def _refuse_nonfinite(self, model_tensors: dict) -> None:
        """Weights that are not finite are never written over the last finite checkpoint:
        training stops, as for a NaN loss, naming the step (tied copies counted once, as
        they are stored)."""
        once, seen = {}, set()  # a tied weight is one tensor under two names: count it once
        for name, t in model_tensors.items():
            if (t.data_ptr(), t.shape) not in seen:
                seen.add((t.data_ptr(), t.shape))
                once[name] = t
        found = nonfinite(once)
        if found is not None:
            self._nan(float("nan"), f"weights ({found[1]:,} values, first in {found[0]})",
                      self.step)  # fmt: skip

    def _on_save(self, point: str, staging: Path) -> None:
        self._notify("on_save", point, staging)

    def _kept(self) -> str:
        if self.last_saved_step is not None and self.writes:
            return f"the last good checkpoint (step {self.last_saved_step}) is kept"
        return "no checkpoint had been written yet"

    def _checkpoint_due(self) -> bool:
        """Time-based: ``checkpoint_seconds`` since the last save (and at least ten times what
        the last save took, so that a big model does not spend its time saving). Sharded, by
        rank 0's clock, as all processes agreed at this step (they all gather it)."""
        if self.sharded:
            return self._due_all
        return self.writes and self._due_here()

    def _due_here(self) -> bool:
        every = self.config.checkpoint_seconds
        since = time.monotonic() - self._last_save_at
        return every > 0 and since >= max(every, 10 * self._last_save_cost)

    def save_best(self) -> None:
        if self.run is None or not (self.writes or self.sharded):
            return
        model_tensors = self._gathered()[0] if self.sharded else None
        if not self.writes:
            return
        if model_tensors is None:
            model_tensors = self.raw_model.state_dict()
        self._refuse_nonfinite(model_tensors)
        try:
            self.run.save_best(model_tensors, self.best, model=self.raw_model)
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
        run = self.run
        sync = None
        if self.dist.enabled:  # the others read once rank 0 has recovered the checkpoint
            import torch.distributed as dist

            sync = dist.barrier
        found = run.read_checkpoint(sync, model=self.raw_model)  # checked against the model
        if found is None:
            self._resumed = False
            return False
        state, tensors, opt_tensors = found
        check_optimizer_tensors(self.optimizer, opt_tensors, str(run.optimizer_file))
        if not self.sharded:
            self.raw_model.load_state_dict(tensors, strict=False)
        state_path = run.state_file
        try:  # the model and optimizer are fresh: a failure here loses nothing
            opt_tensors = {k: v.to(self.device) for k, v in opt_tensors.items()}
            if self.sharded:  # each process keeps its shard of the whole checkpoint
                opt_sd = optimizer_state_dict(opt_tensors, state["optimizer"])
                load_full_state_dicts(self.raw_model, self.optimizer, tensors, opt_sd)
            else:
                load_optimizer(self.optimizer, opt_tensors, state["optimizer"])
            check_rng_state(state["rng"])
            data = state.get("data")
            if data is not None and hasattr(self.train_batches, "load_state_dict"):
                self.train_batches.load_state_dict(data)
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            best = _read_best(state)
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as e:
            what = f"missing {e}" if isinstance(e, KeyError) else " ".join(str(e).split())[:200]
            raise RunError(f"{state_path}: cannot continue from this checkpoint ({what})") from None
        self.step = self.last_saved_step = state["step"]
        self.best = best
        self._elapsed_before = float(state.get("elapsed_s") or 0.0)
        if self.dist.is_main:  # said even with quiet: which step a run continues from matters
            self._log(f"resumed from the checkpoint of step {self.step} in {run.path}")
        self._resumed = True
        return True

    # -- evaluation ----------------------------------------------------------------------------

    def mean_loss(self, batches: list, name: str = "") -> float:
        """The mean loss over ``batches``; a Heartbeat around it shows ``12/20 <name> batches``
        (each pass its own name: one shared label made the count run 20/20, then 4/20)."""
        unit = f"{name} batches".strip()
        total = 0.0
        with evaluating(self.model), torch.no_grad():
            for i, batch in enumerate(batches):
                with self._autocast():
                    total += float(self.task.loss(self.model, self._to_device(batch)))
                count_done(i + 1, len(batches), unit)
        return total / max(len(batches), 1)

    def evaluate(self) -> dict:
        """Mean loss on the fixed validation (and training) batches, and the task's figures."""
        out: dict[str, float] = {}
        if self.train_eval_batches:
            out["train_loss"] = self.mean_loss(self.train_eval_batches, "train")
        if self.val_batches:
            out["val_loss"] = self.mean_loss(self.val_batches, "val")
            with evaluating(self.raw_model), torch.no_grad(), self.unsharded():
                out.update(self.task.evaluate(self.raw_model, out["val_loss"]))
        return out

    def _evaluate_and_save(self, progress: Progress) -> dict:
        self._flush()
        t0 = time.perf_counter()
        with progress.evaluating(self.step, first=not self.history, on=self.val_on):
            ev = self.evaluate()
        self._eval_seconds = time.perf_counter() - t0
        row = {"step": self.step, **ev, "lr": lr_at(self.step, self.config)}
        self._write_metrics(row, to_disk=False)
        unwritten = [row]  # on disk with the checkpoint below, one hand-off; else on its own
        try:
            self._judge_evaluation(ev, row, progress, unwritten)
        finally:
            if unwritten and self.writes:
                self.run.append_metrics(unwritten.pop())
        return ev

    def _judge_evaluation(self, ev: dict, row: dict, progress: Progress,
                          unwritten: list[dict]) -> None:  # fmt: skip
        """After an evaluation: its line and example, a stop if its loss is not finite, best/ if
        it improved, and the checkpoint of this step (which takes the ``unwritten`` row)."""
        progress.note(eval_line(row, self.metrics))
        if progress.enabled or self.sharded:  # sharded: every process gathers the weights
            with evaluating(self.raw_model), torch.no_grad(), self.unsharded():
                example = self.task.example(self.raw_model) if progress.enabled else None
            if example:
                progress.note(f"      {example}")
        for key in ("val_loss", "train_loss"):  # weights gone to NaN: never saved
            if ev.get(key) is not None and not math.isfinite(ev[key]):
                self._nan(ev[key], key.replace("_", " ").replace("val", "validation"), self.step)
        value = ev.get(self.best_metric.name)
        better = value is not None and self.step > 0 and self._improves(value, ev.get("val_loss"))
        if self.sharded:  # all processes gather best/ or none
            better = all_sum([float(better)], self.dist, self.device)[0] > 0
        if better:
            self.best = {"metric": self.best_metric.name, "value": value,
                         "val_loss": ev.get("val_loss"), "step": self.step}  # fmt: skip
            self.save_best()
        if self.step != self.last_saved_step:
            self.save_checkpoint(unwritten)

    def _improves(self, value: float, val_loss: float | None) -> bool:
        """Better by the task's best metric; on a tie (e.g. 100% exact match), by val loss."""
        if self.best is None:
            return True
        m, best = self.best_metric, self.best["value"]
        if value == best and val_loss is not None and self.best.get("val_loss") is not None:
            return val_loss < self.best["val_loss"]
        return m.better(value, best)

    # -- the loop ------------------------------------------------------------------------------

    def train_step(self) -> torch.Tensor:
        """One optimizer update over ``grad_accum`` micro-batches; returns the mean loss, a
        device tensor (read back by ``_flush``)."""
        c = self.config
        set_lr(self.optimizer, self.step, c)  # each group's share of the schedule's rate
        total = torch.zeros((), device=self.device)
        for micro in range(c.grad_accum):
            batch = self._to_device(next(self.train_batches))
            last = micro == c.grad_accum - 1
            sync = contextlib.nullcontext() if (last or not self.dist.enabled) else self._no_sync()
            with sync:
                with self._autocast():
                    loss = self.task.loss(self.model, batch) / c.grad_accum
                for hook in self._loss_hooks:  # none unless a callback asks (tests' faults)
                    loss = hook(self, loss)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
            self._counted += self.task.count(batch) * self.dist.world_size
        step = self.step + 1
        if not self.defers_readback:  # read back now: several processes agree on it every step
            value = self._agree(float(total))
            if not math.isfinite(value):
                self._nan(value, "loss", step)
            total = torch.tensor(value)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = None
        if c.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self._params, c.grad_clip, foreach=True)
            if hasattr(norm, "full_tensor"):  # FSDP: a DTensor, the same in every process
                norm = norm.full_tensor()
            if self.scaler is not None:
                norm = None  # fp16: an overflow is the scaler's to skip, not an error
            elif not self.defers_readback and not math.isfinite(float(norm)):
                self._nan(float(norm), "gradient norm", step)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            if self.defers_readback:  # the fused kernel skips the update if the step is not finite
                bad = ~torch.isfinite(total) if norm is None else ~torch.isfinite(total + norm)
                self.optimizer.found_inf = bad.float()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending.append((step, total.detach(), None if norm is None else norm.detach()))
        return total

    def read_back(self) -> list[float]:
        """The losses of the steps since the last log line, read back from the device now."""
        self._flush()
        return list(self._window)

    def _flush(self) -> None:
        """Read back the losses (and gradient norms) of the steps since the last flush, in one
        host sync; a value that is not finite stops training, naming its step."""
        if not self._pending:
            return
        steps = [s for s, _, _ in self._pending]
        losses = torch.stack([loss.float().cpu() for _, loss, _ in self._pending]).tolist()
        norms = [n for _, _, n in self._pending]
        if any(n is None for n in norms):
            norm_values = [None] * len(norms)
        else:
            norm_values = torch.stack([n.float().cpu() for n in norms]).tolist()
        self._pending = []
        for s, loss, norm in zip(steps, losses, norm_values):
            if not math.isfinite(loss):
                self._nan(loss, "loss", s)
            if norm is not None and not math.isfinite(norm):
                self._nan(norm, "gradient norm", s)
        self._window.extend(losses)
        self._last_loss = losses[-1]

    def _agree(self, loss: float) -> float:
        """The mean loss over every process, whether any of them was asked to stop, and
        (sharded) whether rank 0's clock says a checkpoint is due."""
        if not self.dist.enabled:
            self._stop_all = self._stop
            return loss
        due = float(self.sharded and self.dist.is_main and self.out_dir is not None
                    and self._due_here())  # fmt: skip
        total, stops, dues = all_sum([loss, float(self._stop is not None), due], self.dist,
                                     self.device)  # fmt: skip
        if stops > 0:
            self._stop_all = self._stop or "SIGINT"
        self._due_all = dues > 0
        return total / self.dist.world_size

    @contextlib.contextmanager
    def _no_sync(self):
        """Gradients of this micro-batch are accumulated, not yet averaged over processes."""
        if self.sharded:
            set_gradient_sync(self.raw_model, False)
            try:
                yield
            finally:
                set_gradient_sync(self.raw_model, True)
            return
        dynamo = sys.modules.get("torch._dynamo")  # loaded once anything has been compiled
        inner = self.model  # DistributedDataParallel, maybe inside torch.compile's wrapper
        if dynamo is not None and isinstance(inner, dynamo.eval_frame.OptimizedModule):
            inner = inner._orig_mod
        with inner.no_sync():
            yield

    def _nan(self, value: float, what: str, step: int) -> None:
        kept = f"{self._kept()} in {self.out_dir}" if self.writes else "nothing was written"
        dtype_hint = "" if self.amp_dtype == torch.float32 else f", or --dtype float32 (now {self.amp_dtype})"  # fmt: skip
        raise TrainingError(
            f"the {what} became {value} at step {step}: training stopped; {kept}. "
            f"Try a lower --lr (now {self.config.lr:g}){dtype_hint}, or more --warmup-iters"
        )

    def elapsed(self) -> float:
        """Wall seconds spent in ``fit`` so far, those of the runs it resumed included."""
        return self._elapsed_before + time.perf_counter() - self._fit_began

    def _write_metrics(self, row: dict, to_disk: bool = True) -> None:
        row["elapsed_s"] = round(self.elapsed(), 3)  # when it was measured: evaluations included
        self.history.append(row)
        if self.writes and to_disk:
            self.run.append_metrics(row)
        self._notify("on_metrics", row)  # e.g. attnlab.training.tracking.TensorBoardLog

    def _log_row(self, seconds: float, progress: Progress) -> None:
        self._flush()
        window, self._window = self._window, []
        unit = self.task.unit
        rate = self._counted / seconds if seconds > 0 else None
        row = {"step": self.step, "train_loss": sum(window) / len(window),
               "lr": lr_at(self.step - 1, self.config), f"{unit}_per_s": rate,
               "ms_per_iter": 1000 * seconds / len(window),
               "threads": self.threads.threads}  # fmt: skip
        self._write_metrics(row)
        progress.rate(rate, row["train_loss"])
        if not progress.live:
            progress.note(log_line(row, self.config.max_iters, unit, self._time_left(row)))
        self._counted = 0

    def _time_left(self, row: dict) -> float | None:
        """Seconds to max_iters: the steps left at the pace of the last window, and the
        evaluations left at the length of the last one."""
        c, step = self.config, self.step
        per_step = row["ms_per_iter"] / 1000
        evals = c.max_iters // c.eval_interval - step // c.eval_interval
        evals += 0 if c.max_iters % c.eval_interval == 0 else 1  # the one at the end
        return (c.max_iters - step) * per_step + evals * self._eval_seconds

    def fit(self, resume: bool = False) -> TrainResult:
        """Train to ``max_iters``: evaluate, keep the best, checkpoint; stop on a signal. The
        run directory's writer lock is held throughout (by the caller when it gave a ``RunDir``,
        as ``training.run.train`` does)."""
        if not self._owns_run:
            return self._fit(resume)
        with self.run:
            return self._fit(resume)

    def _fit(self, resume: bool) -> TrainResult:
        c = self.config
        self._fit_began = time.perf_counter()
        resumed = self._open_run(resume)
        self._notify("on_open", resumed)
        start = self.step
        progress = Progress(c.max_iters, start, self.task.unit, self.threads.threads,
                            enabled=self.dist.is_main and not self.quiet, log=self._log)  # fmt: skip
        t_window = time.perf_counter()
        try:
            with self._signals(), progress:
                progress.note(f"training on {self.device.type}, {self.threads}")
                while True:
                    if self._stop_all:
                        if self.last_saved_step != self.step:
                            self.save_checkpoint()
                        break
                    self._notify("on_step")
                    at_eval = self.step % c.eval_interval == 0 or self.step >= c.max_iters
                    if at_eval and not (resumed and self.step == start):
                        self._evaluate_and_save(progress)
                        self._timed = None  # an evaluation is not a training step's time
                    if self.step >= c.max_iters or (at_eval and self.finished_early):
                        break
                    self._maybe_compile()
                    if self._timed is None:
                        self._timed = (self.step, time.perf_counter())
                    self.train_step()
                    self.step += 1
                    progress.advance(self.step)
                    self._notify("on_step_end")
                    if self.step % c.log_interval == 0 or self.step == c.max_iters:
                        self._log_row(time.perf_counter() - t_window, progress)
                        t_window = time.perf_counter()
                    if self._checkpoint_due():
                        self.save_checkpoint()
            self._flush()
        finally:
            self._plot()
            self._notify("on_close")
        if self._stop_all and self.writes:
            self._log(f"saved the checkpoint of step {self.step} in {self.out_dir}")
        last_eval = next((r for r in reversed(self.history) if "val_loss" in r), {})
        return TrainResult(self.step, self._last_loss, last_eval.get("val_loss"), self.best,
                           self._stop_all, self.out_dir, self.history, last_eval,
                           self.val_on)  # fmt: skip

    def finish_early(self, why: str) -> None:
        """End the run at the evaluation now under way (a callback's ``on_metrics``), saved and
        finished as if it were the last step; ``why`` is logged. Every process must call it at
        the same evaluation (a callback that reads the evaluation's figures does)."""
        if self.finished_early is None:
            self.finished_early = why
            if self.dist.is_main and not self.quiet:
                self._log(f"finishing early at step {self.step}: {why}")

    def _notify(self, event: str, *args) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self, *args)

    def _plot(self) -> None:
        if not (self.writes and self.history and loss_png_wanted()):
            return
        headline = None if self.best_metric.name == "val_loss" else self.best_metric
        with contextlib.suppress(Exception):  # a plot must never hide the real outcome
            plot_metrics(self.run.metrics_file, self.run.curve_file,
                         self.task.loss_unit, headline, getattr(self.task, "title", ""))  # fmt: skip

    @contextlib.contextmanager
    def _signals(self):
        """SIGINT and SIGTERM ask the loop to save and stop (in the main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._on_signal)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum, frame) -> None:
        if self._stop:  # the second time: stop now (atomic writes keep the directory whole)
            raise KeyboardInterrupt
        self._stop = signal.Signals(signum).name
        if not self.dist.enabled:  # several processes agree at the next step (see _agree)
            self._stop_all = self._stop
        again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
        if self.dist.is_main:
            self._log(f"\n{self._stop}: finishing this step, then saving a checkpoint "
                      f"({again} again to quit now)")  # fmt: skip


def _read_best(state: dict) -> dict | None:
    """The best evaluation so far, from a trainer state (older ones: best_val_loss/best_step)."""
    best: Any = state.get("best")
    if best is None and state.get("best_val_loss") is not None:
        best = {"metric": "val_loss", "value": state["best_val_loss"],
                "val_loss": state["best_val_loss"], "step": state.get("best_step")}  # fmt: skip
    if best is None:
        return None
    if not isinstance(best, dict) or not isinstance(best.get("value"), (int, float)):
        raise ValueError("best must hold a metric value")
    return best
