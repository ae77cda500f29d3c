"""Token x token similarity of the representations before and after each block: as cosines,
and as the raw dot products the notes' similarity table starts from.

    dot[i, j] = h_i . h_j                          h = the residual stream (T, C) of one block
    sim[i, j] = h_i . h_j / (||h_i|| ||h_j||)      (the cosine: the dot product of unit vectors)

Before the first block h is embedding + position; as context is mixed in, the representations
of related tokens usually move together (and, in many trained models, all of them drift toward
a common direction, which shows as a higher mean off-diagonal similarity).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnlab.inspect.recording import LAYER_RE, InspectError, Recording
from attnlab.render.display import Result, heatmap_html, matrix_table, rounded
from attnlab.render.tables import FitTable


def cosine_matrix(h: np.ndarray) -> np.ndarray:
    """(T, C) -> (T, T) cosine similarity of every pair of rows (a zero row has similarity 0)."""
    h = np.asarray(h, dtype=np.float64)
    norms = np.linalg.norm(h, axis=-1, keepdims=True)  # (T, 1)
    u = h / np.where(norms == 0, 1.0, norms)
    return u @ u.T  # (T, T)


def dot_matrix(h: np.ndarray) -> np.ndarray:
    """(T, C) -> (T, T) dot product of every pair of rows: h h^T."""
    h = np.asarray(h, dtype=np.float64)
    return h @ h.T  # (T, T)


def mean_off_diagonal(m: np.ndarray) -> float:
    T = m.shape[0]
    if T < 2:
        return float("nan")
    return float((m.sum() - np.trace(m)) / (T * (T - 1)))


@dataclass
class SimilarityLayer:
    prefix: str  # "blocks.0."
    label: str  # "layer 0"
    tokens: list[str]
    before: np.ndarray  # (T, T) cosine similarity of the block's input
    after: np.ndarray  # (T, T) ... of its output
    dot_before: np.ndarray | None = None  # (T, T) raw dot products of the block's input
    dot_after: np.ndarray | None = None  # ... of its output

    def matrices(self, measure: str) -> tuple[np.ndarray, np.ndarray]:
        """(before, after) as ``measure``: "cosine" or "dot"."""
        if measure == "dot":
            return self.dot_before, self.dot_after
        return self.before, self.after


@dataclass
class Similarity(Result):
    layers: list[SimilarityLayer]
    show: int | None = (
        None  # index into layers whose matrices the terminal shows; None = first/last
    )
    start: int = 0  # first column of the terminal's matrices (they page on from there)
    measure: str = "cosine"  # what the terminal shows: "cosine" or "dot" (JSON holds both)

    def __rich__(self):
        from rich.console import Group

        dot = self.measure == "dot"
        what = "dot product" if dot else "cosine similarity"
        summary = FitTable(title=f"mean {what} between different tokens")
        for col in ("layer", "before", "after", "change"):
            summary.add_column(col, justify="right")
        for ly in self.layers:
            before, after = ly.matrices(self.measure)
            b, a = mean_off_diagonal(before), mean_off_diagonal(after)
            summary.add_row(ly.label, f"{b:.3f}", f"{a:.3f}", f"{a - b:+.3f}")
        if self.show is None:
            first, last = self.layers[0], self.layers[-1]
            mats = [
                (first.matrices(self.measure)[0], first,
                 f"before {first.label} (embedding + position)"),
                (last.matrices(self.measure)[1], last, f"after {last.label}"),
            ]  # fmt: skip
        else:
            ly = self.layers[self.show]
            before, after = ly.matrices(self.measure)
            mats = [(before, ly, f"before {ly.label}"), (after, ly, f"after {ly.label}")]
        tables = [
            matrix_table(
                m,
                ly.tokens,
                ly.tokens,
                f"{what} {t}",
                heat=True,
                start=self.start,
                row_name="tokens",
                col_name="tokens",
                more="--start {next} shows the tokens from {next}; --json has every value",
            )  # fmt: skip
            for m, ly, t in mats
        ]
        return Group(summary, *tables)

    def to_dict(self) -> dict:
        return {
            "layers": [
                {
                    "prefix": ly.prefix,
                    "label": ly.label,
                    "tokens": ly.tokens,
                    "mean_before": mean_off_diagonal(ly.before),
                    "mean_after": mean_off_diagonal(ly.after),
                    "before": rounded(ly.before),
                    "after": rounded(ly.after),
                    "mean_dot_before": mean_off_diagonal(ly.dot_before),
                    "mean_dot_after": mean_off_diagonal(ly.dot_after),
                    "dot_before": rounded(ly.dot_before, 6),  # small: more decimals
                    "dot_after": rounded(ly.dot_after, 6),
                }
                for ly in self.layers
            ]
        }

    def _repr_html_(self) -> str:
        parts = []
        what = "dot product" if self.measure == "dot" else "cosine"
        for ly in self.layers:
            before, after = ly.matrices(self.measure)
            parts.append(
                '<div style="display:flex;gap:1em">'
                + heatmap_html(
                    before, ly.tokens, ly.tokens, f"{what} before {ly.label}", diverging=True
                )
                + heatmap_html(
                    after, ly.tokens, ly.tokens, f"{what} after {ly.label}", diverging=True
                )  # fmt: skip
                + "</div>"
            )
        return "\n".join(parts)


def layer_label(prefix: str) -> str:
    """'blocks.3.' -> 'layer 3'; 'decoder.blocks.1.' -> 'decoder layer 1'."""
    m = LAYER_RE.search(prefix)
    stack = prefix.split(".blocks.")[0] if ".blocks." in prefix else ""
    where = f"layer {m.group(1)}" if m else prefix.rstrip(".")
    return f"{stack} {where}".strip()


def no_layers(rec: Recording, verb: str) -> InspectError:
    """The one-line refusal of a verb that compares each token's vector before and after a
    layer, on a model with no such layers (an LSTM's recurrence), naming the verbs that work."""
    works = "`trace`" + (" or `attention`" if rec.maps() else "")
    return InspectError(
        f"{verb} compares each token's vector before and after each layer, and this "
        f"{rec.about['kind']} run has no layers with a residual stream; try {works}"
    )


MEASURES = ("cosine", "dot")


def similarity(rec: Recording, layer: int | None = None, measure: str = "cosine") -> Similarity:
    """Cosine similarity and dot products (T, T) of the residual stream before and after every
    block; ``measure`` is what the terminal shows (the JSON holds both)."""
    if measure not in MEASURES:
        raise InspectError(f"unknown measure {measure!r}: cosine or dot")
    prefixes = rec.blocks()
    if not prefixes:
        raise no_layers(rec, "similarity")
    layers = []
    for p in prefixes:
        before = rec.cache[p + "resid_pre"][0].float().numpy()  # (T, C)
        after = rec.cache[p + "resid_post"][0].float().numpy()  # (T, C)
        layers.append(SimilarityLayer(p, layer_label(p), list(rec.tokens_of(p)),
                                      cosine_matrix(before), cosine_matrix(after),
                                      dot_matrix(before), dot_matrix(after)))  # fmt: skip
    show = None
    if layer is not None:
        hits = [i for i, ly in enumerate(layers) if ly.label.endswith(f"layer {layer}")]
        if not hits:
            raise InspectError(f"no layer {layer}; this model has layers 0..{len(layers) - 1}")
        show = hits[0]
    result = Similarity(layers, show, measure=measure)
    result.about = rec.about
    return result
