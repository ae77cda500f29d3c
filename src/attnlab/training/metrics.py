"""Metric: a figure a task reports at each evaluation, with its words, unit and direction.

The Trainer keeps the best checkpoint by the task's declared best metric, and the progress
lines, metrics.jsonl and loss.png name each figure as the task does (a language model reports
perplexity and bits per character; a classifier, accuracy; an encoder-decoder, exact match).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # its key in metrics.jsonl, e.g. "val_exact"
    label: str  # its words in logs and plots, e.g. "exact match"
    unit: str = ""  # e.g. "nats/token", "bits/char"; "%" shows a fraction as a percentage
    higher_is_better: bool = False

    def format(self, value: float) -> str:
        if self.unit == "%":
            return f"{100 * value:.1f}%"
        return f"{value:.4f}"

    def better(self, a: float, b: float | None) -> bool:
        """Is ``a`` better than ``b`` (None: nothing yet)?"""
        if b is None:
            return True
        return a > b if self.higher_is_better else a < b


def val_loss_metric(loss_unit: str) -> Metric:
    return Metric("val_loss", "val loss", loss_unit)
