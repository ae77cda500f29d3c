"""Attention maps: the token x token matrix softmax(Q K^T / sqrt(d_k)) of one head (or the mean
over heads), as a terminal table, a notebook heatmap, JSON, or a PNG; and the grid of every
layer x head.

Row i is the query token, column j the key token; row i holds how much token i reads from each
token j, so every row sums to 1 (a causal model's row i is zero right of the diagonal); a model
with sigmoid or softmax1 attention (``GPTConfig.attention``) has rows that need not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.inspect.recording import AttentionInfo, InspectError, Recording
from attnlab.render.display import (
    Result,
    heatmap_html,
    matrix_table,
    rounded,
    table_html,
)
from attnlab.render.plots import heatmap, png_html, save_png, shared_colorbar, tiles


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
    start: int = 0  # first key shown in the terminal table (and first query, past its rows)
    limit: int | None = None  # rows of the terminal table (all if None)
    image: np.ndarray | None = None  # a ViT's input (H, W[, 3]): the PNG shows it too
    patch: int = 0  # its patch size in pixels
    # grouped-query attention: (K/V head this query head reads, how many K/V heads, heads a group)
    shares: tuple[int, int, int] | None = None
    masked: np.ndarray | None = None  # (T, S) True where the mask hid the key from the query

    @property
    def title(self) -> str:
        which = "mean over heads" if self.head is None else f"head {self.head}"
        if self.shares is not None:
            j, n_kv, g = self.shares
            which += (f" (reads K/V head {j} of {n_kv}, shared by query heads "
                      f"{j * g}..{j * g + g - 1})")  # fmt: skip
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
            more="--start {next} shows the keys from {next}; --png or --json has all of them",
            row_name="queries",
            col_name="keys",
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
        } | (
            {} if self.shares is None else {"kv_head": self.shares[0], "n_kv_heads": self.shares[1]}
        )

    def _repr_html_(self) -> str:
        return heatmap_html(self.weights, self.queries, self.keys, self.title)

    def save_png(self, path: str | Path) -> Path:
        """Write ``figure()`` as a PNG."""
        return save_png(self.figure(), path)

    def figure(self):
        """A heatmap of this matrix, labelled with the tokens (positions past 64 tokens), its
        colourbar as tall as the matrix drawn. A ViT's has its patches' thumbnails beside their
        labels, and next to it the image with [CLS]'s attention over the patches."""
        import matplotlib.pyplot as plt

        T, S = self.weights.shape
        size = min(12.0, max(3.0, 0.32 * max(T, S) + 1.5))
        vit = self.image is not None
        fig, axes = plt.subplots(1, 2 if vit else 1, squeeze=False,
                                 figsize=(size * (1.9 if vit else 1) + 1.0, size))  # fmt: skip
        ax = axes[0][0]
        heatmap(ax, self.weights, self.queries, self.keys, title=self.title,
                colorbar_label="attention weight", masked=self.masked)  # fmt: skip
        if vit:
            from attnlab.render.images import patch_ticks
            from attnlab.render.plots import overlay

            patch_ticks(ax, self.image, self.patch, self.queries, self.keys)
            ax.set_title(self.title, fontsize=9, pad=26)
            g = self.image.shape[0] // self.patch
            overlay(axes[0][1], self.image, self.weights[0][1:].reshape(g, g), vmin=0.0,
                    title="the image, each patch tinted by [CLS]'s attention to it",
                    colorbar_label="attention weight of [CLS]")  # fmt: skip
        return fig


@dataclass
class AttentionGrid(Result):
    """Every map (rows: layers, self and cross) x every head (columns). ``title`` names what
    was read (the run and the text); the picture says it above the grid."""

    maps: list[AttentionInfo]
    weights: list[np.ndarray]  # per map: (H, T, S)
    labels: list[tuple[list[str], list[str]]]
    title: str = ""
    masked: list[np.ndarray | None] | None = None  # per map: (T, S), True where the mask hid

    @property
    def n_heads(self) -> int:
        return max(w.shape[0] for w in self.weights)

    def summary(self) -> str:
        """``2 maps x 4 heads (layer 0 self, layer 1 self), 20 x 20 tokens``: the grid's shape."""
        sizes = dict.fromkeys(f"{w.shape[1]} x {w.shape[2]}" for w in self.weights)
        return (f"{len(self.maps)} maps x {self.n_heads} heads "
                f"({', '.join(i.label for i in self.maps)}), {', '.join(sizes)} tokens")  # fmt: skip

    def entropies(self) -> list[np.ndarray]:
        """Per map: each head's mean entropy over its rows (nats), (H,)."""
        return [-(w * np.log(np.clip(w, 1e-12, None))).sum(-1).mean(-1) for w in self.weights]

    def __rich__(self):
        from attnlab.render.tables import FitTable

        table = FitTable(title="attention maps: mean entropy (nats) of each head's rows")
        table.add_column("map", style="bold")
        for h in range(self.n_heads):
            table.add_column(f"head {h}", justify="right")
        for info, ent in zip(self.maps, self.entropies()):
            table.add_row(info.label, *[f"{e:.2f}" for e in ent])
        return table

    def to_dict(self) -> dict:
        return {
            "title": self.title,
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
            ],
        }

    def _repr_html_(self) -> str:
        """The grid picture, then each head's mean entropy as a table."""
        header = ["map", *[f"head {h}" for h in range(self.n_heads)]]
        rows = [[i.label, *[f"{e:.2f}" for e in ent]]
                for i, ent in zip(self.maps, self.entropies())]  # fmt: skip
        return png_html(self.figure()) + table_html(
            header, rows, "mean entropy (nats) of each head's rows"
        )

    def figure(self):
        """Rows: the maps (labelled "layer 1 self", "decoder layer 0 cross"); columns: the heads
        ("head 0", ...); one colour range (0 to the largest weight) and one colourbar for all;
        the tokens on the ticks while they fit (about 8 points per label). Where they do not,
        the maps are tiles of one image (``tiled_figure``), far quicker to draw."""
        import matplotlib.pyplot as plt

        rows, H = len(self.maps), self.n_heads
        n = max(max(w.shape[1], w.shape[2]) for w in self.weights)  # tokens on the longest side
        cell = 2.2 if n <= 24 else 1.8
        cell = min(cell, 11.5 / H)  # many heads: smaller cells, the picture at most ~13 inches
        fontsize = 6
        # labels along a side: 72 pt/inch, 6.5 pt a label, along the ~0.35 inch less than a
        # cell its axes get once the tick labels and the gap between axes have theirs
        room = int((cell - 0.35) * 72 / (fontsize + 0.5))
        if n > room:
            return self.tiled_figure()
        fig, axes = plt.subplots(
            rows, H, figsize=(cell * H + 1.4, cell * rows + 1.0), squeeze=False
        )
        vmax = self._vmax()
        drawn, im = [], None
        for r, (info, w, (q, k)) in enumerate(zip(self.maps, self.weights, self.labels)):
            for h in range(H):
                ax = axes[r][h]
                if h >= w.shape[0]:
                    ax.axis("off")
                    continue
                hidden = self.masked[r] if self.masked else None
                im = heatmap(ax, w[h], q, k, colorbar=False, fontsize=fontsize, vmin=0.0,
                             vmax=vmax, xlabel="", ylabel="", masked=hidden)  # fmt: skip
                drawn.append(ax)
                if r == 0:
                    ax.set_title(f"head {h}", fontsize=8)
                if h == 0:
                    ax.set_ylabel(f"{info.label}\nquery", fontsize=8)
                if r == rows - 1 or h >= self.weights[r + 1].shape[0]:
                    ax.set_xlabel("key", fontsize=8)
        title = self.title or "attention"
        fig.suptitle(f"{title}\nattention weights, every layer x head (row = query, column = key)",
                     fontsize=9)  # fmt: skip
        # tight_layout leaves the suptitle out: keep its two lines (~0.45 inch) free on top
        fig.tight_layout(rect=(0, 0, 0.93, 1 - 0.45 / fig.get_figheight()))
        label = self._bar_label()
        shared_colorbar(fig, drawn, im, label, fontsize=7)
        return fig

    def _vmax(self) -> float:
        """The top of the one colour range every map and head shares."""
        return max(1e-9, max(float(np.nanmax(w)) for w in self.weights))

    def _bar_label(self) -> str:
        masked = any(m is not None and m.any() for m in (self.masked or []))
        return "attention weight" + ("  (grey: masked, may not attend)" if masked else "")

    def tiled_figure(self):
        """The grid as tiles of one image: a row of tiles per map, a column per head, each tile
        the map's (T, S) weights (rows = queries, columns = keys), masked cells grey; heads and
        maps named on the axes, one colour bar."""
        import matplotlib.pyplot as plt

        rows, H = len(self.maps), self.n_heads
        t = max(w.shape[1] for w in self.weights)
        s = max(w.shape[2] for w in self.weights)
        # inches a tile's width, as a cell of the grid of axes; the picture at most ~14 inches
        tile = min(2.2 if max(t, s) <= 24 else 1.8, 10.5 / H)
        height = tile * t / s
        fig, ax = plt.subplots(figsize=(tile * 1.1 * H + 2.4, height * 1.1 * rows + 1.3))
        vmax = self._vmax()
        grid = [[w[h] if h < w.shape[0] else None for h in range(H)] for w in self.weights]
        bar, ys, xs = tiles(ax, grid, vmax, self.masked)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(h) for h in range(H)], fontsize=7)
        ax.set_yticks(ys)
        ax.set_yticklabels([i.label for i in self.maps], fontsize=7)
        ax.tick_params(length=0)
        ax.set_xlabel("head (in each tile: a column per key)", fontsize=8)
        ax.set_ylabel("attention map (in each tile: a row per query)", fontsize=8)
        title = self.title or "attention"
        ax.set_title(f"{title}\nattention weights, every layer x head ({t} x {s} tokens a tile)",
                     fontsize=9)  # fmt: skip
        fig.tight_layout(rect=(0, 0, 0.93, 1))
        label = self._bar_label()
        shared_colorbar(fig, [ax], bar, label, fontsize=7)
        return fig

    def save_png(self, path: str | Path) -> Path:
        return save_png(self.figure(), path)


def attention(
    rec: Recording,
    layer: int | None = None,
    head: int | None = None,
    mean: bool = False,
    name: str | None = None,
    start: int = 0,
    limit: int | None = None,
) -> AttentionMap:
    """The attention matrix (T, S) of one head of one map, or the mean over heads (``mean``).

    ``layer`` picks the block (default 0); ``name`` picks a map by cache key or substring
    ("cross", "decoder"). Without ``head`` and without ``mean`` head 0 is shown. ``start``:
    the first key column of the terminal table (it pages on from there).
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
    if not 0 <= start < len(k):
        raise InspectError(f"--start {start}: the keys are tokens 0..{len(k) - 1}")
    amap = AttentionMap(m, list(q), list(k), info.name, info.layer, head, info.kind, start, limit)
    amap.masked = masked_cells(rec, info.name)
    keys = rec.cache.get(info.name.removesuffix("weights") + "k")  # (B, n_kv, S, d_k)
    if head is not None and keys is not None and keys.dim() == 4 and keys.size(1) < w.shape[0]:
        g = w.shape[0] // keys.size(1)  # query heads per K/V head
        amap.shares = (head // g, keys.size(1), g)
    amap.about = rec.about
    if rec.extra.get("image") is not None and len(q) == len(k) == m.shape[0]:
        from attnlab.render.images import as_hwc

        amap.image, amap.patch = as_hwc(rec.extra["image"]), int(rec.extra["patch_size"])
    return amap


def attention_grid(
    rec: Recording, name: str | None = None, title: str | None = None
) -> AttentionGrid:
    """Every attention map (optionally those whose name contains ``name``) with all heads;
    ``title`` (default: the recorded text) heads the picture."""
    maps = [m for m in rec.maps() if not name or name in m.name or name == m.kind]
    if not maps:
        raise InspectError(
            f"no attention map matches {name!r}" if name else "no attention maps recorded"
        )
    grid = AttentionGrid(
        maps,
        [rec.weights(m.name).numpy() for m in maps],
        [rec.labels(m.name) for m in maps],
        title if title is not None else (repr(rec.text) if rec.text else ""),
        [masked_cells(rec, m.name) for m in maps],
    )
    grid.about = rec.about
    return grid


def masked_cells(rec: Recording, name: str) -> np.ndarray | None:
    """(T, S) True where the mask hid key j from query i in map ``name`` (every head), read
    from the recording: the weights there are exactly 0, while the softmax of the recorded
    scores (taken before the mask) over the row's visible keys would give them a weight a
    float holds. None when nothing is hidden, or the scores were not recorded.

    For a row with a visible key k (weight w_k > 0), log Z = s_k - log w_k, and key j would
    weigh exp(s_j - log Z); a weight below 1e-30 is 0 whether or not it was masked, and is
    left as a weight."""
    scores = rec.cache.get(name.removesuffix("weights") + "scores")
    if scores is None:
        return None
    w = rec.weights(name).double().numpy()  # (H, T, S)
    s = scores[0].double().numpy()
    if s.shape != w.shape:
        return None
    k = w.argmax(-1)[..., None]  # (H, T, 1) a visible key of each row (if any)
    wk = np.take_along_axis(w, k, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_z = np.take_along_axis(s, k, -1) - np.log(wk)
        would = s - log_z  # (H, T, S) log of the weight each key would have
    hidden = (w == 0) & ((wk == 0) | (would > np.log(1e-30)))
    hidden = hidden.all(0)  # (T, S): hidden from every head
    return hidden if hidden.any() else None
