"""Attention rollout and attention flow (Abnar & Zuidema, "Quantifying Attention Flow in
Transformers", 2020): how much of an output position comes from each input token.

Raw attention says what a layer's query reads from its keys, but a block also passes its
input on through the residual connection. Both methods therefore use, per layer l,

    A'_l = 0.5 * A_l + 0.5 * I          (the residual identity term, weight ``residual``)

with A_l the layer's attention averaged over its heads (rows sum to 1, so rows of A'_l do too;
a model whose rows need not, sigmoid or softmax1 attention, has each row divided by its sum
first: the share of the row on each key).

Rollout multiplies them: R = A'_L ... A'_2 A'_1, and R[i, j] is the share of output i that
comes from input j along all paths, each path weighted by the product of its edges.

Flow reads the same layered graph as a flow network: node (l, j) is token j after l layers;
the edge from (l - 1, j) to (l, i) has capacity A'_l[i, j]. The flow from input j to output i
is the maximum flow from (0, j) to (L, i). Computed per output position: one max-flow per
input token on the layered graph (scipy's Dinic on integer capacities, scaled by 2^30, so the
rounding changes no flow by more than (edges) / 2^30 ~ 1e-4 at 128 tokens and 6 layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.interventions.edits import edited
from attnlab.interventions.figures import figure_html, heat, new_figure, save_png, token_ticks
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.render.display import Result, matrix_table, show_token
from attnlab.render.plots import image, overlay

SCALE = 1 << 30  # integer capacities for scipy's max-flow


def with_residual(attn: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """A' = (1 - residual) A + residual I, for a (L, T, T) stack of head-averaged maps."""
    T = attn.shape[-1]
    return (1.0 - residual) * attn + residual * np.eye(T)


def rollout(attn: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """R = A'_L ... A'_1 for head-averaged maps ``attn`` (L, T, T): (T, T), row = output."""
    mats = with_residual(np.asarray(attn, dtype=np.float64), residual)
    R = np.eye(mats.shape[-1])
    for A in mats:
        R = A @ R
    return R


def flow(attn: np.ndarray, output: int, residual: float = 0.5) -> np.ndarray:
    """Max flow from every input (0, j) to the output node (L, ``output``): (T,)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    mats = with_residual(np.asarray(attn, dtype=np.float64), residual)
    L, T, _ = mats.shape
    rows, cols, caps = [], [], []
    for layer, A in enumerate(mats):  # edge (layer, j) -> (layer + 1, i), capacity A[i, j]
        i, j = np.nonzero(A > 0)
        rows.append(layer * T + j)
        cols.append((layer + 1) * T + i)
        caps.append(np.floor(A[i, j] * SCALE).astype(np.int64))
    n = (L + 1) * T
    graph = csr_matrix((np.concatenate(caps).astype(np.int32),
                        (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))  # fmt: skip
    sink = L * T + output
    out = np.zeros(T)
    for j in range(T):
        out[j] = maximum_flow(graph, j, sink, method="dinic").flow_value / SCALE
    return out


@dataclass
class RolloutResult(Result):
    method: str  # rollout | flow
    text: str
    stack: str
    position: int
    queries: list[str]  # output tokens
    keys: list[str]  # input tokens
    row: np.ndarray  # (S,) what output ``position`` draws from each input
    matrix: np.ndarray | None = None  # (T, S) rollout of every output (rollout only)
    residual: float = 0.5
    image: np.ndarray | None = None  # (H, W) or (C, H, W) for a ViT
    grid: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def definition(self) -> str:
        base = (f"A' = {1 - self.residual:g} A + {self.residual:g} I per layer (A = mean over "
                "heads; the identity is the residual connection)")  # fmt: skip
        if self.method == "rollout":
            return base + "; R = A'_L ... A'_1"
        return base + "; flow = max flow from input j to the output in the layered graph"

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [Text(f"attention {self.method} of {self.text!r}" +
                      (f" ({self.stack})" if self.stack else ""), style="bold"),
                 Text(self.definition, style="dim")]  # fmt: skip
        q = show_token(self.queries[self.position])
        parts.append(matrix_table(self.row[None], [f"{q}@{self.position}"], self.keys,
                                  f"{self.method}: what output {self.position} draws from each "
                                  "input"))  # fmt: skip
        total = float(np.nansum(self.row))
        if self.method == "flow":  # each input's own maximum: shared paths count for each
            parts.append(Text(f"the row sums to {total:.2f}: each input's flow is the most "
                              "that could pass from it alone, and inputs share paths, so the "
                              "row need not sum to 1 (rollout's divides the output between the "
                              "inputs and does)", style="dim"))  # fmt: skip
        else:
            parts.append(Text(f"the row sums to {total:.2f}: the output divided between the "
                              "inputs", style="dim"))  # fmt: skip
        if self.matrix is not None and len(self.queries) <= 32:
            parts.append(
                matrix_table(self.matrix, self.queries, self.keys, "rollout, every output")
            )
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        d = {"method": self.method, "text": self.text, "stack": self.stack,
             "position": self.position, "residual": self.residual,
             "definition": self.definition, "queries": self.queries, "keys": self.keys,
             "row": np.round(self.row, 6).tolist(), "notes": self.notes}  # fmt: skip
        if self.matrix is not None:
            d["matrix"] = np.round(self.matrix, 6).tolist()
        return d

    def figure(self):
        if self.image is not None:
            return self._image_figure()
        if self.matrix is not None:
            R, C = self.matrix.shape
            tall = max(4.5, 0.13 * R + 1.6)  # a row of tick labels (7 points) per output
            fig, (a, b) = new_figure(1, 2, figsize=(min(14.0, max(11.0, 0.26 * C + 6)), tall))
            heat(a, self.matrix, [show_token(t) for t in self.queries],
                 [show_token(t) for t in self.keys], "rollout (row = output)", diverging=False,
                 annotate=False, xlabel="input (its token)", ylabel="output (its token)",
                 colorbar_label="share the output draws from the input",
                 row_tokens=True)  # fmt: skip
        else:
            fig, b = new_figure(figsize=(6, 3.5))
        b.bar(range(len(self.row)), self.row)
        token_ticks(b, self.keys, "input (its token)")
        b.set_ylabel(f"{self.method}: share drawn", fontsize=8)
        b.set_title(f"{self.method} into {show_token(self.queries[self.position])!r}@"
                    f"{self.position}", fontsize=9)  # fmt: skip
        fig.tight_layout()
        return fig

    def _image_figure(self):
        img = self.image if self.image.ndim == 2 else np.moveaxis(self.image, 0, -1)
        g = self.grid
        patch = self.row[1:].reshape(g, g)  # [CLS] -> patches, row by row
        fig, (a, b) = new_figure(1, 2, figsize=(8, 3.8))
        image(a, img, "image")
        overlay(b, img, patch, title=f"[CLS] {self.method} to each patch",
                colorbar_label=f"{self.method}: share [CLS] draws from the patch")  # fmt: skip
        return fig

    def save_png(self, path):
        return save_png(self.figure(), path)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>" + figure_html(self.figure())


@torch.no_grad()
def attention_paths(
    subject: Subject,
    text: str,
    method: str = "rollout",
    position: int | None = None,
    stack: str | None = None,
    residual: float = 0.5,
) -> RolloutResult:
    """Rollout or flow of ``text`` into output ``position`` (default: the metric position; a
    ViT's [CLS]), over one stack's self-attention (an encoder-decoder: ``stack`` decoder, the
    default, or encoder; cross-attention is not a token-to-token map of one sequence)."""
    if method not in ("rollout", "flow"):
        raise InterventionError(f"unknown method {method!r}: rollout or flow")
    if not subject.stacks:
        raise InterventionError(f"{method} composes self-attention across layers; an LSTM has "
                                "one cross-attention and no layers of it")  # fmt: skip
    if not 0.0 <= residual <= 1.0:
        raise InterventionError(f"the residual weight must be in [0, 1], got {residual}")
    stack = subject.output_stack if stack is None else stack
    if stack not in subject.stacks:
        raise InterventionError(f"no stack {stack!r}; this model has "
                                f"{', '.join(s or 'one stack' for s in subject.stacks)}")  # fmt: skip
    p = subject.prepare(text)
    root = f"{stack}.blocks" if stack else "blocks"
    names = [f"{root}.{i}.attn.weights" for i in range(subject.n_layers(stack))]
    with edited(subject.model, {}, names) as (cache, _):
        subject.logits(p)
    attn = np.stack([cache[n][0].double().mean(0).numpy() for n in names])  # (L, T, T)
    sums = attn.sum(-1, keepdims=True)  # 1 for softmax rows; anything for sigmoid or softmax1
    attn = np.divide(attn, sums, out=np.zeros_like(attn), where=sums > 0)
    tokens = p.stack_tokens[stack]  # a classifier's output is one position of its input
    T = attn.shape[-1]
    if position is None:
        position = p.position if stack == subject.output_stack else T - 1
    if not -T <= position < T:
        raise InterventionError(f"--position {position}: the sequence has positions 0..{T - 1}")
    position %= T
    notes = []
    if any(g.kind == "cross" for g in subject.head_groups()):
        notes.append(f"{stack} self-attention only; cross-attention is not part of these paths")
    if method == "rollout":
        R = rollout(attn, residual)
        res = RolloutResult(method, text, stack, position, tokens, tokens, R[position], R,
                            residual, notes=notes)  # fmt: skip
    else:
        res = RolloutResult(method, text, stack, position, tokens, tokens,
                            flow(attn, position, residual), None, residual, notes=notes)  # fmt: skip
    if "image" in p.extra:  # an image's patches: the result can draw over it
        res.image = p.extra["image"].numpy()
        res.grid = p.extra["grid"]
    return res
