"""Experiment tracking: the rows of metrics.jsonl, also written where a tracker reads them.

    attnlab train ... --log tensorboard      # event files beside metrics.jsonl
    tensorboard --logdir runs/                # every run's curves, side by side

From Python, pass the callback to the Trainer: ``Trainer(..., callbacks=[TensorBoardLog()])``.

Each row the Trainer writes to metrics.jsonl becomes scalars at its step, tagged by where the
row comes from and its key as metrics.jsonl names it: a log line's keys under ``train/``
(``train/train_loss``: the mean loss of the batches since the last line, ``train/lr``,
``train/tokens_per_s``, ...), an evaluation's under ``eval/`` (``eval/val_loss``,
``eval/train_loss`` on fixed batches, and the task's own figures: ``eval/val_ppl`` for a
language model, ``eval/accuracy``, ``eval/exact_match``, ...). The step is the optimizer step.
TensorBoard is an optional extra (``pip install 'attnlab[tensorboard]'``); ``require`` says so
in one line before any training starts.
"""

from __future__ import annotations

import math

from attnlab.config import ConfigError

LOGGERS = ("tensorboard",)
NOT_SCALARS = {"step", "threads"}  # metrics.jsonl keys that are not curves


def require(name: str) -> None:
    """Raise a one-line ConfigError if logger ``name`` is unknown or its package is missing."""
    if name not in LOGGERS:
        raise ConfigError(f"--log must be one of {', '.join(LOGGERS)}, got {name!r}")
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--log tensorboard needs the tensorboard package, which is not installed: "
            "pip install 'attnlab[tensorboard]' (or pip install tensorboard)"
        ) from None


def scalars(row: dict) -> dict[str, float]:
    """The curves of one metrics.jsonl row: {tag: value}, tag = "eval/" or "train/" + key."""
    where = "eval" if "val_loss" in row else "train"
    out = {}
    for key, value in row.items():
        if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[f"{where}/{key}"] = float(value)
    return out


class TensorBoardLog:
    """A Trainer callback writing TensorBoard event files into ``log_dir`` (default: the run
    directory, beside metrics.jsonl). Only the process that writes the run writes them."""

    def __init__(self, log_dir=None):
        self.log_dir = log_dir
        self.writer = None

    def on_open(self, trainer, resumed: bool) -> None:
        if not trainer.writes and self.log_dir is None:
            return
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events past its checkpoint, as metrics.jsonl does
        self.writer = SummaryWriter(log_dir=str(self.log_dir or trainer.out_dir),
                                    purge_step=trainer.step + 1 if resumed else None)  # fmt: skip

    def on_metrics(self, trainer, row: dict) -> None:
        if self.writer is None:
            return
        for tag, value in scalars(row).items():
            self.writer.add_scalar(tag, value, global_step=row["step"])

    def on_close(self, trainer) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
