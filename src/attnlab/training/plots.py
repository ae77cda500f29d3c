"""loss.png: the training curve in the task's words.

Left: the training loss of every log line (one batch each), and the training and validation loss
of every evaluation, in the task's loss unit (nats per token, per target token, per image...).
Right, for tasks whose best metric is not a loss (accuracy, exact match): that metric at every
evaluation.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from attnlab.files import atomic_write
from attnlab.metrics import Metric
from attnlab.rundir import read_metrics

LOSS_PNG_ENV = "ATTNLAB_LOSS_PNG"  # "0": training writes no loss.png (sweeps, test suites)


def loss_png_wanted() -> bool:
    """Whether training draws loss.png: unless ATTNLAB_LOSS_PNG is "0". A run's numbers are in
    metrics.jsonl either way; the picture is 0.13-0.3 s of CPU a run, which a
    sweep of hundreds of small runs (or a test suite) may not want to spend."""
    return os.environ.get(LOSS_PNG_ENV, "1").strip() != "0"


def loss_figure(rows: list[dict], loss_unit: str, headline: Metric | None = None, title: str = ""):
    """A matplotlib Figure of ``rows`` (metrics.jsonl); ``headline`` adds its own panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [r for r in rows if "val_loss" not in r and r.get("train_loss") is not None]
    evals = [r for r in rows if r.get("val_loss") is not None]
    panels = 2 if headline is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 3.6), dpi=100, squeeze=False)
    ax = axes[0, 0]
    if logs:
        steps = [r["step"] for r in logs]
        ax.plot(steps, [r["train_loss"] for r in logs], lw=1, alpha=0.6, label="train (batch)")
    if evals:
        steps = [r["step"] for r in evals]
        ax.plot(steps, [r["val_loss"] for r in evals], "o-", ms=3, label="validation")
        tr = [r for r in evals if r.get("train_loss") is not None]
        if tr:
            ax.plot([r["step"] for r in tr], [r["train_loss"] for r in tr], "s--", ms=3,
                    label="train (fixed batches)")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss ({loss_unit})")
    ax.grid(alpha=0.3)
    ax.legend()
    if headline is not None:
        ax2 = axes[0, 1]
        pts = [r for r in evals if r.get(headline.name) is not None]
        scale = 100.0 if headline.unit == "%" else 1.0
        ax2.plot([r["step"] for r in pts], [scale * r[headline.name] for r in pts], "o-", ms=3,
                 color="tab:green")  # fmt: skip
        ax2.set_xlabel("step")
        ax2.set_ylabel(f"{headline.label} (validation{', %' if headline.unit == '%' else ''})")
        ax2.grid(alpha=0.3)
    if title:  # a long data path folds rather than run past the picture's edge
        width = 55 * panels  # characters of a 12-point title across 6 inches per panel
        fig.suptitle(textwrap.fill(title, width))
    fig.tight_layout()
    return fig


def plot_metrics(
    metrics_path: str | Path,
    png_path: str | Path,
    loss_unit: str = "nats / token",
    headline: Metric | None = None,
    title: str = "",
) -> Path:
    """Draw metrics.jsonl into ``png_path`` (written atomically)."""
    import matplotlib.pyplot as plt

    fig = loss_figure(read_metrics(metrics_path), loss_unit, headline, title)
    png_path = Path(png_path)
    atomic_write(png_path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)
    return png_path
