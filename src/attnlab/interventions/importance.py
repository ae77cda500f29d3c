"""Head importance: how much the loss rises when each head is ablated, then pruning by it.

    importance(head) = loss(head ablated) - loss(intact)

Heads are then removed cumulatively, least important first, and the loss is measured after
each removal: the pruning curve shows how many heads the model can lose before it breaks
(Michel et al., "Are Sixteen Heads Really Better than One?", 2019, ranked by this direct
measure instead of their gradient proxy).

Mean ablation replaces a head's output by its mean over the batch and positions of each forward
pass of the intact run: the intact evaluation records every head's means first, pass by pass,
and each ablated evaluation replays them. So a head in a later layer keeps its clean mean when
heads in earlier layers are already removed (the pruning curve), as in ``attnlab ablate``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.interventions.edits import clean_means, edited, head_edits, replayed_means
from attnlab.interventions.figures import figure_html, heat, new_figure, save_png
from attnlab.interventions.subjects import HeadRef, InterventionError, Subject
from attnlab.render.display import Result, heatmap_html, matrix_table

MEAN_FROM = "the clean run of the measured inputs, each forward pass's batch and positions"


@dataclass
class ImportanceResult(Result):
    metric: str
    source: str  # what the loss was measured on
    mode: str
    baseline: float
    heads: list[tuple[str, str, int, int, float]]  # (label, group, layer, head, loss change)
    pruning: list[tuple[int, str, float]]  # (heads removed, the last one removed, loss)
    notes: list[str] = field(default_factory=list)
    values_changed: int = 0  # by every ablation, over every forward pass
    mean_from: str | None = None  # mode mean: where every head's mean comes from

    def grids(self) -> dict[str, np.ndarray]:
        out = {}
        for group in dict.fromkeys(h[1] for h in self.heads):
            rows = [h for h in self.heads if h[1] == group]
            L, H = max(r[2] for r in rows) + 1, max(r[3] for r in rows) + 1
            m = np.full((L, H), np.nan)
            for _, _, layer, head, d in rows:
                m[layer, head] = d
            out[group] = m
        return out

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [Text(f"head importance: {self.metric} change when each head is ablated "
                      f"({self.mode}), on {self.source}; intact {self.baseline:.4f}", style="bold")]  # fmt: skip
        for group, m in self.grids().items():
            parts.append(matrix_table(m, [f"L{i}" for i in range(m.shape[0])],
                                      [f"H{h}" for h in range(m.shape[1])], group, digits=3, sign=True,
                                      col_tokens=False))  # fmt: skip
        curve = ", ".join(f"{n}:{v:.3f}" for n, _, v in self.pruning)
        parts.append(
            Text(f"\npruning least important first (heads removed: {self.metric}): {curve}")
        )
        parts.append(Text(f"the ablations changed {self.values_changed:,} values", style="dim"))
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        return {"metric": self.metric, "source": self.source, "mode": self.mode,
                "baseline": self.baseline,
                "heads": [{"head": lab, "group": g, "layer": ly, "index": h, "loss_change": d}
                          for lab, g, ly, h, d in self.heads],
                "pruning": [{"removed": n, "head": lab, "loss": v} for n, lab, v in self.pruning],
                "values_changed": self.values_changed, "notes": self.notes,
                **({"mean_from": self.mean_from} if self.mean_from else {})}  # fmt: skip

    def figure(self):
        grids = self.grids()
        n = len(grids) + 1  # a panel per kind of head, then the pruning curve
        cols = min(n, 3)
        rows = -(-n // cols)
        fig, axes = new_figure(rows, cols, squeeze=False, figsize=(4.3 * cols, 3.6 * rows))
        panels = [ax for row in axes for ax in row]
        for ax in panels[n:]:
            ax.axis("off")
        for ax, (group, m) in zip(panels, grids.items()):
            heat(ax, m, [f"L{i}" for i in range(m.shape[0])], [f"H{h}" for h in range(m.shape[1])],
                 f"{group}: {self.metric} change when ablated", fmt="{:+.2f}", xlabel="head",
                 ylabel="layer", colorbar_label=f"{self.metric} change")  # fmt: skip
        ax = panels[n - 1]
        ax.plot([k for k, _, _ in self.pruning], [v for _, _, v in self.pruning], marker=".")
        ax.set_xlabel("heads removed (least important first)")
        ax.set_ylabel(self.metric)
        ax.set_title("pruning curve", fontsize=9)
        fig.tight_layout()
        return fig

    def save_png(self, path):
        return save_png(self.figure(), path)

    def _repr_html_(self) -> str:
        first = next(iter(self.grids().items()))
        return heatmap_html(first[1], [f"L{i}" for i in range(first[1].shape[0])],
                            [f"H{h}" for h in range(first[1].shape[1])], first[0],
                            diverging=True) + figure_html(self.figure())  # fmt: skip


def check_rankable(subject: Subject, own_loss: bool = False) -> None:
    """An InterventionError, naming what works instead, when ``subject`` has no heads to rank
    or no loss to rank them by (read from its declarations: ``predicts``, its head groups).
    ``own_loss``: the caller measures the model its own way (a probe on an encoder with no
    head), so only the heads are checked."""
    model = subject.model
    if model.predicts == "nothing" and not own_loss:  # its "loss" would read the embedding
        raise InterventionError(
            f"this {model.kind} predicts nothing (no prediction head), so it has no loss to rank "
            "heads by (a loss read through its token embedding falls as heads are removed): "
            "`attnlab heads RUN` scores what each head attends to instead"
        )
    if subject.head_groups() and model.residual:
        return
    try:
        subject.parse_heads("context")
    except InterventionError:  # no attention at all
        raise InterventionError(f"this {model.kind} model has no attention heads to rank: "
                                "`attnlab eval RUN` scores it whole") from None  # fmt: skip
    raise InterventionError("this model's attention is one context vector, not heads: "
                            "`attnlab eval RUN --ablate context` scores the run without it")  # fmt: skip


def text_loss(subject: Subject, texts: list[str]) -> Callable[[], float]:
    """The mean loss over ``texts`` (see ``Subject.loss``), as a function to call repeatedly."""
    prepared = [subject.prepare(t) for t in texts]

    def evaluate() -> float:
        return float(sum(float(subject.mean_loss(subject.logits(p), p)[0]) for p in prepared)
                     / len(prepared))  # fmt: skip

    return evaluate


def inputs_loss(subject: Subject, path: str) -> tuple[Callable[[], float], int]:
    """``text_loss`` over the non-blank lines of the file ``path`` (one input per line), and
    how many there are."""
    from pathlib import Path

    texts = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines()]
    texts = [t for t in texts if t]
    if not texts:
        raise InterventionError(f"{path}: no inputs (one per line)")
    return text_loss(subject, texts), len(texts)


def corpus_loss(subject: Subject, data: str, windows: int = 16, encoding: str = "utf-8",
                seed: int = 0) -> Callable[[], float]:  # fmt: skip
    """A GPT's next-token loss on ``windows`` windows of its block size drawn from ``data``
    (a text file, a directory of .txt files or a built-in corpus), the same ones every call."""
    from attnlab import data as corpora

    if subject.model.predicts != "next-token":
        raise InterventionError("--data windows are for a GPT; give an encoder, encoder-decoder "
                                "or ViT run one input per line of --inputs FILE, or a TEXT")  # fmt: skip
    corpus = corpora.open_corpus(data, encoding)
    T = subject.model.config.block_size
    ids: list[int] = []
    for chunk in corpus.chunks():
        ids.extend(subject.tokenizer.encode(chunk, add_special_tokens=False))
        if len(ids) > 200 * T * windows:
            break
    if len(ids) < T + 2:
        raise InterventionError(f"{data}: shorter than one window of {T + 1} tokens")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - T - 1, (windows,), generator=g).numpy()
    x, y = corpora.windows(np.asarray(ids), starts, T, subject.tokenizer.bos_id)  # (N, T) each
    x, y = x.to(subject.device), y.to(subject.device)

    def evaluate() -> float:
        logits = subject.model(x)
        return float(F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1)))

    return evaluate


@torch.no_grad()
def head_importance(
    subject: Subject,
    evaluate: Callable[[], float],
    mode: str = "zero",
    source: str = "",
    prune: bool = True,
    quiet: bool = True,
) -> ImportanceResult:
    """Loss change per ablated head, then the pruning curve (module doc). ``evaluate`` returns
    the loss of the model as it runs now (``text_loss``, ``corpus_loss``, or your own: the
    callers that pass the model's own loss refuse a model that predicts nothing first)."""
    check_rankable(subject, own_loss=True)
    groups = subject.head_groups()
    refs = [HeadRef(g, h) for g in groups for h in range(g.n_heads)]
    means = None
    if mode == "mean":  # every mean from the intact run, recorded before any ablation
        names = sorted({r.group.path + ".z" for r in refs})
        base, means = clean_means(subject.model, evaluate, names)
    else:
        base = evaluate()

    def edits(heads: list[HeadRef]) -> dict:
        return replayed_means(heads, means) if means else head_edits(subject, heads, mode)

    rows, changed = [], 0
    for k, ref in enumerate(refs):
        with edited(subject.model, edits([ref])) as (_, log):
            d = evaluate() - base
        changed += log.changed
        group = "heads" if ref.group.kind == "attn" else f"{ref.group.kind} heads"
        rows.append((ref.label, group, ref.group.layer, ref.head, d))
        if not quiet:
            print(f"importance: {k + 1}/{len(refs)} heads", file=sys.stderr)
    curve = [(0, "", base)]
    if prune:
        order = sorted(range(len(refs)), key=lambda i: rows[i][4])
        for n in range(1, len(order) + 1):
            removed = [refs[i] for i in order[:n]]
            with edited(subject.model, edits(removed)) as (_, log):
                curve.append((n, refs[order[n - 1]].label, evaluate()))
            changed += log.changed
            if not quiet:
                print(f"pruning: {n}/{len(order)} heads removed", file=sys.stderr)
    mean_from = MEAN_FROM if mode == "mean" else None
    return ImportanceResult("loss", source, mode, base, rows, curve, list(subject.notes), changed,
                            mean_from)  # fmt: skip
