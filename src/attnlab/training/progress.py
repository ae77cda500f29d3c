"""Progress on stderr, in the task's words: a rich bar (step, loss, throughput, ETA) on a
terminal, plain lines otherwise (CI logs, pipes); both show the CPU threads torch uses. Throughput is counted in the task's unit:
tokens/s for language models, pairs/s, images/s or examples/s for the others.

An evaluation runs inside a ``Heartbeat`` (attnlab.heartbeat): a line every two seconds it
goes on with nothing else said, so a long one is never silent."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

from attnlab.heartbeat import Heartbeat, duration, stamped
from attnlab.metrics import Metric


def eval_line(row: dict, metrics: tuple[Metric, ...]) -> str:
    """``eval  step 250  train loss 1.8822  val loss 1.8912  perplexity 6.62 ...``"""
    parts = [f"step {row['step']}"]
    if row.get("train_loss") is not None:
        parts.append(f"train loss {row['train_loss']:.4f}")
    for m in metrics:
        if row.get(m.name) is not None:
            parts.append(f"{m.label} {m.format(row[m.name])}")
    line = "eval  " + "  ".join(parts)
    return line if len(line) <= 80 else "eval " + " ".join(parts)  # closer, to fit 80


def log_line(row: dict, max_iters: int, unit: str, left: float | None = None) -> str:
    """``step 530/1100  loss 2.0608  lr 1.95e-03  2,187 tokens/s  1 thr  3m20s left``: at most
    80 columns (the time per step is in metrics.jsonl, ``ms_per_iter``). ``left``: seconds
    to the end, at the pace of the steps since the last line (evaluations included)."""
    rate = row.get(f"{unit}_per_s") or 0
    parts = [f"step {row['step']}/{max_iters}", f"loss {row['train_loss']:.4f}",
             f"lr {row['lr']:.2e}", f"{rate:,.0f} {unit}/s", f"{row.get('threads', '?')} thr"]  # fmt: skip
    if left is not None and row["step"] < max_iters:
        parts.append(f"{duration(left)} left")
    line = "  ".join(parts)
    return line if len(line) <= 80 else " ".join(parts)  # big numbers: closer together


class Progress:
    def __init__(
        self,
        total: int,
        start: int,
        unit: str,
        threads: int,
        enabled: bool,
        log: Callable[[str], None],
    ):
        self.enabled, self.log, self.unit = enabled, stamped(log), unit
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
                TextColumn("{task.fields[what]}"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[rate]} " + unit + "/s"),
                TextColumn(f"{threads} thr"),
                TimeRemainingColumn(),
                TextColumn("left"),
                console=Console(stderr=True),
                transient=False,
            )
            self.task = self.bar.add_task(
                "train", total=total, completed=start, loss="-", rate="-", what="step"
            )

    @property
    def live(self) -> bool:
        return self.bar is not None

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def advance(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step)

    def rate(self, per_s: float | None, loss: float | None = None) -> None:
        """At each log line: throughput and the mean loss since the last one (the loss is read
        back from the device only then, so a step never waits for it)."""
        if self.bar is None:
            return
        if per_s:
            self.bar.update(self.task, rate=f"{per_s:,.0f}")
        if loss is not None:
            self.bar.update(self.task, loss=f"{loss:.4f}")

    @contextlib.contextmanager
    def evaluating(self, step: int, first: bool, on: str = ""):
        """Around an evaluation: the first one is announced, saying what the val loss is
        computed ``on`` (it can take seconds before any step is shown); on a terminal the bar
        says so while each one runs. One that runs on says how far it is every two seconds (a
        Heartbeat: batches done of all)."""
        if not self.enabled:
            yield
            return
        what = f"evaluating at step {step}"
        if self.bar is not None:
            bar, task = self.bar, self.task
            bar.update(task, what=what + " ...")
            try:
                with Heartbeat(what, show=lambda line: bar.update(task, what=line)):
                    yield
            finally:
                bar.update(task, what="step")
            return
        if first:
            self.log(f"{what} ..." + (f" (val loss: on {on})" if on else ""))
        with Heartbeat(what, show=self.log):
            yield

    def note(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(line, highlight=False, markup=False)
        else:
            self.log(line)
