"""What ``attnlab eval`` reports: a task's figures on the data it scored, as text, JSON and (for a
classifier) a confusion-matrix PNG.

Every task returns an ``Evaluation`` from ``Task.score``: the figures in the task's own words
(loss, perplexity, bits per character; masked accuracy; accuracy with per-class precision,
recall and F1 and the confusion matrix; exact match, token accuracy, BLEU and chrF), and what was
scored (the run's held-out split, or a file given with ``--data``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np


@dataclasses.dataclass
class Figure:
    key: str  # its JSON name, e.g. "perplexity"
    label: str  # its words, e.g. "perplexity"
    value: float
    unit: str = ""  # "%": a fraction shown as a percentage; "count": a whole number; "/100": a
    # score out of 100 (BLEU, chrF); anything else is printed after the value

    def text(self) -> str:
        if self.unit == "%":
            return f"{100 * self.value:.2f}%"
        if self.unit == "count":
            return f"{int(self.value):,}"
        if self.unit == "/100":
            return f"{self.value:.2f}"
        return f"{self.value:.4f}" + (f"  {self.unit}" if self.unit else "")


@dataclasses.dataclass
class Evaluation:
    """A task's figures on one data set. ``report``: a classifier's per-class table and
    confusion matrix (``attnlab.metrics.classification_report``); ``mistakes``: the first few
    examples it got wrong (a translation and its target, a misclassified text)."""

    task: str  # the task's name: lm, mlm, classify, seq2seq, vision
    data: str  # what was scored, in words
    figures: list[Figure]
    report: dict | None = None
    mistakes: list[dict] = dataclasses.field(default_factory=list)

    def __getitem__(self, key: str) -> float:
        for f in self.figures:
            if f.key == key:
                return f.value
        raise KeyError(f"no figure {key!r}; figures: {', '.join(f.key for f in self.figures)}")

    def to_dict(self) -> dict:
        out = {"task": self.task, "data": self.data, **{f.key: f.value for f in self.figures}}
        if self.report is not None:
            out["per_class"] = self.report["per_class"]
            out["classes"] = self.report["classes"]
            out["confusion"] = self.report["confusion"]
        if self.mistakes:
            out["mistakes"] = self.mistakes
        return out

    def lines(self) -> list[str]:
        """The evaluation as terminal lines: the figures (one per line, label then value), what
        was scored, then a classifier's per-class table and confusion matrix."""
        width = max(len(f.label) for f in self.figures)
        out = [f"{f.label:<{width}}  {f.text()}" for f in self.figures]
        out.append(f"(scored on {self.data})")
        if self.report is not None:
            out += [""] + per_class_lines(self.report) + [""] + confusion_lines(self.report)
        if self.mistakes:
            out += ["", "  first mistakes:"]
        for ex in self.mistakes:
            out.append("    " + "  ".join(f"{k} {v!r}" for k, v in ex.items()))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __rich__(self):
        """The terminal's rendering: ``lines()``, with the confusion matrix laid out for the
        width it is printed at (its columns page; no count is ever cut)."""
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.display import matrix_table

        if self.report is None:
            return Text("\n".join(self.lines()))
        lines = self.lines()
        table = lines.index(CONFUSION_TITLE)  # the text matrix: its title, header and rows
        rest = lines[table + 2 + len(self.report["classes"]) :]
        classes = self.report["classes"]
        matrix = matrix_table(np.asarray(self.report["confusion"]), classes, classes,
                              CONFUSION_TITLE.strip(), digits=0, heat=False, col_tokens=False,
                              row_name="true classes", col_name="predicted classes",
                              max_lines=4 * len(classes))  # fmt: skip
        return Group(Text("\n".join(lines[:table])), matrix, Text("\n".join(rest)))

    def _repr_html_(self) -> str:
        """In a notebook: the figures as a table, then a classifier's per-class table and
        confusion matrix and the first mistakes as the terminal prints them."""
        import html

        from attnlab.render.display import table_html

        page = table_html(["figure", "value"], [[f.label, f.text()] for f in self.figures],
                          caption=f"scored on {self.data}")  # fmt: skip
        rest = self.lines()[len(self.figures) + 1 :]
        return page + (f"<pre>{html.escape(chr(10).join(rest))}</pre>" if rest else "")

    def save_png(self, path: str | Path) -> Path:
        """The confusion matrix as a heatmap (rows = true class, columns = predicted), written
        atomically; only a classifier's evaluation has one."""
        if self.report is None:
            raise ValueError(f"a {self.task} evaluation has no confusion matrix to draw")
        return confusion_png(self.report, path)


def per_class_lines(report: dict) -> list[str]:
    rows = report["per_class"]
    w = max(8, *(len(r["label"]) for r in rows))
    out = [f"  {'class':<{w}}  precision  recall      F1  support"]
    for r in rows:
        out.append(f"  {r['label']:<{w}}  {r['precision']:9.3f}  {r['recall']:6.3f}  "
                   f"{r['f1']:6.3f}  {r['support']:7d}")  # fmt: skip
    out.append(f"  {'macro':<{w}}  {report['macro_precision']:9.3f}  "
               f"{report['macro_recall']:6.3f}  {report['macro_f1']:6.3f}  "
               f"{report['examples']:7d}")  # fmt: skip
    return out


CONFUSION_TITLE = "  confusion matrix (row = true class, column = predicted)"


def confusion_lines(report: dict) -> list[str]:
    """The confusion matrix as a table: row = true class, column = predicted class."""
    classes, m = report["classes"], np.asarray(report["confusion"])
    w = max(4, *(len(c) for c in classes), len(str(int(m.max(initial=0)))))
    head = "  " + " " * w
    out = [CONFUSION_TITLE, head + "".join(f"  {c:>{w}}" for c in classes)]
    for c, row in zip(classes, m):
        out.append(f"  {c:<{w}}" + "".join(f"  {int(v):>{w}d}" for v in row))
    return out


def confusion_png(report: dict, path: str | Path) -> Path:
    """The confusion matrix drawn by the one heatmap renderer (``attnlab.render.plots``): rows
    are the true classes, columns the predicted ones, each cell its count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.render.plots import heatmap, save_png

    classes, m = report["classes"], np.asarray(report["confusion"], dtype=np.int64)
    n = len(classes)
    size = min(14.0, max(3.5, 0.45 * n + 2.0))
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    heatmap(ax, m, classes, classes, cmap="Blues", vmin=0.0, annotate=n <= 20, fmt="{:.0f}",
            xlabel="predicted class", ylabel="true class",
            colorbar_label="examples", fontsize=9,
            title=f"confusion matrix: accuracy {100 * report['accuracy']:.1f}% "
            f"of {report['examples']}")  # fmt: skip
    return save_png(fig, path)
