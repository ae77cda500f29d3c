"""Attention maps: the token x token matrix softmax(Q K^T / sqrt(d_k)) of one head (or the mean
over heads), as a terminal table, a notebook heatmap, JSON, or a PNG; and the grid of every
layer x head.

Row i is the query token, column j the key token; row i holds how much token i reads from each
token j, so every row sums to 1 (a causal model's row i is zero right of the diagonal).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.inspect.display import (
    TERMINAL_TOKENS,
    Result,
    heatmap_html,
    matrix_table,
    rounded,
    show_token,
)
from attnlab.inspect.recording import AttentionInfo, InspectError, Recording


@dataclass
class AttentionMap(Result):
    """One attention matrix (T, S) with its labels: ``weights[i, j]`` = query i -> key j."""

    weights: np.ndarray  # (T, S)
    queries: list[str]
    keys: list[str]
    name: str  # cache key of the map
    layer: int | None
    head: int | None  # None = mean over heads
    kind: str = "self"
    start: int = 0  # first token shown in the terminal table
    limit: int = TERMINAL_TOKENS

    @property
    def title(self) -> str:
        which = "mean over heads" if self.head is None else f"head {self.head}"
        where = f"layer {self.layer}" if self.layer is not None else self.name
        prefix = self.name.split(".blocks.")[0] + " " if ".blocks." in self.name else ""
        return f"{prefix}{where} {self.kind}-attention, {which}"

    def __rich__(self):
        return matrix_table(
            self.weights,
            self.queries,
            self.keys,
            f"{self.title}  (row = query, column = key)",
            limit=self.limit,
            start=self.start,
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "layer": self.layer,
            "head": self.head,
            "kind": self.kind,
            "queries": self.queries,
            "keys": self.keys,
            "shape": list(self.weights.shape),
            "weights": rounded(self.weights, 5),
        }

    def _repr_html_(self) -> str:
        return heatmap_html(self.weights, self.queries, self.keys, self.title)

    def save_png(self, path: str | Path) -> Path:
        """A heatmap of this matrix, labelled with the tokens (labels dropped past 64 tokens)."""
        import matplotlib.pyplot as plt

        T, S = self.weights.shape
        size = min(12.0, max(3.0, 0.32 * max(T, S) + 1.5))
        fig, ax = plt.subplots(figsize=(size + 1.0, size))
        im = ax.imshow(
            self.weights, cmap="viridis", vmin=0.0, vmax=max(1e-9, float(self.weights.max()))
        )
        _label_axes(ax, self.queries, self.keys)
        ax.set_title(self.title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        return _save(fig, path)


@dataclass
class AttentionGrid(Result):
    """Every map (rows: layers, self and cross) x every head (columns)."""

    maps: list[AttentionInfo]
    weights: list[np.ndarray]  # per map: (H, T, S)
    labels: list[tuple[list[str], list[str]]]

    def __rich__(self):
        from rich.table import Table

        table = Table(title="attention maps: mean entropy (nats) of each head's rows", box=None)
        table.add_column("map", style="bold")
        H = max(w.shape[0] for w in self.weights)
        for h in range(H):
            table.add_column(f"head {h}", justify="right")
        for info, w in zip(self.maps, self.weights):
            ent = -(w * np.log(np.clip(w, 1e-12, None))).sum(-1).mean(-1)  # (H,)
            table.add_row(info.label, *[f"{e:.2f}" for e in ent])
        return table

    def to_dict(self) -> dict:
        return {
            "maps": [
                {
                    "name": i.name,
                    "layer": i.layer,
                    "kind": i.kind,
                    "queries": q,
                    "keys": k,
                    "weights": rounded(w, 4),
                }
                for i, w, (q, k) in zip(self.maps, self.weights, self.labels)
            ]
        }

    def _repr_html_(self) -> str:
        return self._figure_html()

    def _figure_html(self) -> str:
        import base64
        import io

        buf = io.BytesIO()
        fig = self.figure()
        fig.savefig(buf, format="png", dpi=80)
        import matplotlib.pyplot as plt

        plt.close(fig)
        return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"/>'

    def figure(self):
        import matplotlib.pyplot as plt

        rows, H = len(self.maps), max(w.shape[0] for w in self.weights)
        T = max(w.shape[1] for w in self.weights)
        cell = 2.2 if T <= 24 else 1.8
        fig, axes = plt.subplots(
            rows, H, figsize=(cell * H + 0.6, cell * rows + 0.6), squeeze=False
        )
        for r, (info, w, (q, k)) in enumerate(zip(self.maps, self.weights, self.labels)):
            for h in range(H):
                ax = axes[r][h]
                if h >= w.shape[0]:
                    ax.axis("off")
                    continue
                ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=max(1e-9, float(w[h].max())))
                if T <= 16:
                    _label_axes(ax, q, k, fontsize=6)
                else:
                    ax.set_xticks([])
                    ax.set_yticks([])
                if r == 0:
                    ax.set_title(f"head {h}", fontsize=8)
                if h == 0:
                    ax.set_ylabel(info.label, fontsize=8)
        fig.tight_layout()
        return fig

    def save_png(self, path: str | Path) -> Path:
        return _save(self.figure(), path)


def attention(
    rec: Recording,
    layer: int | None = None,
    head: int | None = None,
    mean: bool = False,
    name: str | None = None,
    start: int = 0,
    limit: int = TERMINAL_TOKENS,
) -> AttentionMap:
    """The attention matrix (T, S) of one head of one map, or the mean over heads (``mean``).

    ``layer`` picks the block (default 0); ``name`` picks a map by cache key or substring
    ("cross", "decoder"). Without ``head`` and without ``mean`` head 0 is shown.
    """
    info = rec.select(layer=0 if layer is None and name is None else layer, name=name)
    w = rec.weights(info.name).numpy()  # (H, T, S)
    if mean:
        m, head = w.mean(axis=0), None
    else:
        head = 0 if head is None else head
        if not 0 <= head < w.shape[0]:
            raise InspectError(f"no head {head}; layer {info.layer} has heads 0..{w.shape[0] - 1}")
        m = w[head]
    q, k = rec.labels(info.name)
    return AttentionMap(m, list(q), list(k), info.name, info.layer, head, info.kind, start, limit)


def attention_grid(rec: Recording, name: str | None = None) -> AttentionGrid:
    """Every attention map (optionally those whose name contains ``name``) with all heads."""
    maps = [m for m in rec.maps() if not name or name in m.name]
    if not maps:
        raise InspectError(
            f"no attention map matches {name!r}" if name else "no attention maps recorded"
        )
    return AttentionGrid(
        maps, [rec.weights(m.name).numpy() for m in maps], [rec.labels(m.name) for m in maps]
    )


def _label_axes(ax, rows: list[str], cols: list[str], fontsize: int = 8) -> None:
    if max(len(rows), len(cols)) > 64:
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        return
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([show_token(c) for c in cols], rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([show_token(r) for r in rows], fontsize=fontsize)
    ax.set_xlabel("key (attended to)", fontsize=fontsize)
    ax.set_ylabel("query", fontsize=fontsize)


def _save(fig, path: str | Path) -> Path:
    """Write a figure as PNG atomically (never a half-written file) and close it."""
    import matplotlib.pyplot as plt

    from attnlab.checkpoint import atomic_write

    path = Path(path)
    if path.suffix.lower() != ".png":
        plt.close(fig)
        raise InspectError(f"{path}: heatmaps are written as PNG; name the file *.png")
    if not path.parent.exists():
        plt.close(fig)
        raise InspectError(f"{path.parent}: no such directory")
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)
    return path
