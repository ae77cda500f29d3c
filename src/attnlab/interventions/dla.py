"""Direct logit attribution: split one logit into what each part of the model wrote.

A transformer's residual stream is a sum: the embeddings, plus every head's output
(z_h W_O^h, its slice of the output projection), plus each attention bias, plus each MLP's
output. The logit of token t at position p reads that sum through the final LayerNorm and the
unembedding. LayerNorm divides by the standard deviation sigma of the whole sum, so it is not
linear; with sigma FROZEN at its value on this input,

    LN(sum_c x_c) = sum_c gamma * (x_c - mean(x_c)) / sigma  +  beta

and the logit becomes an exact sum of parts: logit = sum_c W_U[t] . LN_frozen(x_c) + (biases).
Post-norm blocks (BERT, the paper's encoder-decoder) put a LayerNorm on the residual stream
after every sublayer: each of their scales is frozen the same way. A masked-LM head's
activation is frozen as its gate act(z)/z at this input (exactly act(z) here). The result
lists everything it froze; the parts sum to the model's logit (computed in float64) to
~1e-10, and the float32 model's logit is printed beside it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from attnlab import hooks
from attnlab.interventions.figures import figure_html, heat, new_figure, save_png
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.models.declare import Gate, Linear, Norm
from attnlab.models.graph import Parts, walk
from attnlab.norms import RMSNorm
from attnlab.render.display import Result, show_token

TOL = 1e-7  # the running sum must match each recorded residual point (float64)


@dataclass
class DLAResult(Result):
    text: str
    target: str
    foil: str | None
    position: int
    token: str  # the token at the position
    logit: float  # the model's (float64 run) logit or logit difference
    logit_float32: float
    components: list[tuple[str, float]]  # in forward order
    frozen: list[str]
    heads: dict[str, np.ndarray] = field(default_factory=dict)  # group -> (layers, heads)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return float(sum(v for _, v in self.components))

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        what = f"logit({self.target!r})" + (f" - logit({self.foil!r})" if self.foil else "")
        parts = [Text(f"direct logit attribution of {what} at position {self.position} "
                      f"({show_token(self.token)}) of {self.text!r}", style="bold"),
                 Text(f"logit {self.logit:.6f} (float32 model: {self.logit_float32:.6f}); parts "
                      f"sum to {self.total:.6f} (difference {abs(self.total - self.logit):.1e})"),
                 Text("frozen: " + "; ".join(self.frozen) + "\n", style="dim")]  # fmt: skip
        t = FitTable(title="largest parts")
        t.add_column("part")
        t.add_column("value", justify="right")
        t.add_column("", justify="left")
        top = max((abs(v) for _, v in self.components), default=1.0) or 1.0
        for name, v in sorted(self.components, key=lambda c: -abs(c[1]))[:20]:
            bar = ("+" if v > 0 else "-") * max(1, round(12 * abs(v) / top))
            t.add_row(name, f"{v:+.4f}", bar)
        parts.append(t)
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        return {"target": self.target, "foil": self.foil, "position": self.position,
                "token": self.token, "logit": self.logit, "logit_float32": self.logit_float32,
                "sum": self.total, "error": abs(self.total - self.logit), "frozen": self.frozen,
                "components": [{"name": n, "value": v} for n, v in self.components],
                "notes": self.notes}  # fmt: skip

    def figure(self):
        groups = list(self.heads.items())
        others = [(n, v) for n, v in self.components if ".head" not in n]
        fig, axes = new_figure(1, len(groups) + 1, squeeze=False,
                               figsize=(4.2 * (len(groups) + 1), 3.6))  # fmt: skip
        for ax, (g, m) in zip(axes[0], groups):
            heat(ax, m, [f"L{i}" for i in range(m.shape[0])],
                 [f"H{h}" for h in range(m.shape[1])], f"{g} heads: direct effect")  # fmt: skip
        ax = axes[0][-1]
        ax.barh(range(len(others)), [v for _, v in others],
                color=["#d62728" if v > 0 else "#1f77b4" for _, v in others])  # fmt: skip
        ax.set_yticks(range(len(others)), [n for n, _ in others], fontsize=6)
        ax.invert_yaxis()
        ax.set_title("embeddings, MLPs, biases", fontsize=9)
        what = f"logit({self.target!r})" + (f" - logit({self.foil!r})" if self.foil else "")
        fig.suptitle(f"DLA of {what} at {show_token(self.token)!r}@{self.position}: "
                     f"{self.logit:.3f} (red raises it)", fontsize=9)  # fmt: skip
        fig.tight_layout()
        return fig

    def save_png(self, path):
        return save_png(self.figure(), path)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>" + figure_html(self.figure())


def _root(stack: str) -> str:
    return f"{stack}.blocks." if stack else "blocks."


WHOSE = {"attn": "attention's", "cross": "cross-attention's", "mlp": "MLP's"}


def _frozen_words(froze: dict) -> list[str]:
    """What the walk froze, in words: the norms on sublayers' outputs (Gemma 2/3's), and the
    post-norm blocks' norms on the residual stream."""
    out = []
    if froze.get("post"):
        post = froze["post"]
        whose = " and ".join(WHOSE[s] for s in post)
        heads = ", the heads sharing the attention's" if "attn" in post else ""
        out.append(f"each block's norms on the {whose} outputs ({', '.join(post.values())}) "
                   f"at their scales{heads}")  # fmt: skip
    if froze.get("after"):
        kinds = set(froze["after"].values())
        kind = "LayerNorm" if kinds == {"LayerNorm"} else "norm"
        out.append(f"every post-norm {kind}'s scale on the residual stream (each block's "
                   f"{', '.join(sorted(froze['after']))})")  # fmt: skip
    return out


def _gate(act, z: Tensor) -> Tensor:
    """act(z) / z, with 0 where z == 0 (act(0) = 0 for GELU, ReLU and tanh)."""
    nz = z != 0
    return torch.where(nz, act(z) / torch.where(nz, z, torch.ones_like(z)), torch.zeros_like(z))


@torch.no_grad()
def direct_logit_attribution(
    subject: Subject,
    text: str,
    target: str,
    foil: str | None = None,
    position: int | None = None,
) -> DLAResult:
    """Split logit(target) (minus logit(foil)) at ``position`` into embeddings, every head, every
    MLP and every bias, with the LayerNorm scales frozen (see module doc). Every part comes from
    the model's declaration: its embeddings (``dla_embeddings``, ``embed_norm``), each block's
    sublayers, its final norm and its head (``dla_readout``)."""
    if not subject.model.residual:
        raise InterventionError("direct logit attribution splits a residual stream into parts; "
                                "an LSTM has none (its state is rewritten, not added to)")  # fmt: skip
    t = subject.token_id(target)
    f = subject.token_id(foil) if foil is not None else None
    p = subject.prepare(text)
    pos = subject.metric_position(p, position, t)
    logit32 = subject.logits(p)[0, pos].double()
    model = copy.deepcopy(subject.model).double().eval()
    args = tuple(a.double() if a.is_floating_point() else a for a in p.args)
    with hooks.record(model) as c:
        logits = model.forward_logits(*args)[0, pos]  # (V,)
    parts, frozen = Parts(), []
    for name, x in model.dla_embeddings(c, pos):
        parts.add(name, x)
    embed_ln, embed_bias, embed_note = model.embed_norm()
    embed_frozen = embed_ln is not None and parts.freeze_norm(embed_ln, parts.total(), embed_bias)
    stack = model.output_stack
    froze: dict = {}  # the norms on the stream frozen by the walk through the blocks
    walk(model, stack, parts, c, lambda x: x[0, pos], tol=TOL, frozen=froze)
    last = c[f"{_root(stack)}{len(model.stack_blocks(stack)) - 1}.resid_post"][0, pos]
    prefix = f"{stack}." if stack else ""
    if parts.freeze_norm(model.final_norm(), last, prefix + "ln_f.bias"):
        kind = "RMSNorm" if isinstance(model.final_norm(), RMSNorm) else "LayerNorm"
        frozen.append(f"the final {kind}'s scale ({prefix}ln_f)")
    frozen += _frozen_words(froze)
    if embed_frozen:
        frozen.append(embed_note)
    w, extra = _readout(parts, model.dla_readout(), t, f, frozen)
    comps = [(n, float(x @ w)) for n, x in parts.v.items()] + extra
    value = float(logits[t] - (logits[f] if f is not None else 0.0))
    value32 = float(logit32[t] - (logit32[f] if f is not None else 0.0))
    lookup, root = dict(comps), _root(stack)
    grids = {}  # each attention's heads (layers, heads): self-attention, then cross-attention
    for i, block in enumerate(model.stack_blocks(stack)):
        for step in block.residual:
            if step.sublayer != "mlp":
                sub = step.sublayer
                group = sub if not stack else (f"{stack} self" if sub == "attn" else sub)
                H = block.get_submodule(sub).n_heads
                grids.setdefault(group, []).append(
                    [lookup[f"{root}{i}.{sub}.head{h}"] for h in range(H)]
                )
    grids = {g: np.array(rows) for g, rows in grids.items()}
    return DLAResult(text, subject.decode(t), subject.decode(f) if f is not None else None, pos,
                     p.tokens[pos], value, value32, comps, frozen, grids, list(subject.notes))  # fmt: skip


def _readout(parts: Parts, steps: list, t: int, f: int | None, frozen: list[str]):
    """Carry the parts through the head's declared steps to the vector w with
    logit = sum_c part_c . w; returns (w, extra bias parts that do not go through w)."""

    def diff(W: Tensor) -> Tensor:
        W = W.double()
        return W[t] - (W[f] if f is not None else 0.0)

    extra = []
    cur = parts.total()  # the vector the next step reads, computed exactly
    for step in steps:
        if isinstance(step, Linear):
            W, b = step.module.weight.double(), step.module.bias
            cur = W @ cur + (b.double() if b is not None else 0)
            parts.map(lambda x, W=W: W @ x)
            if b is not None:
                parts.add(step.bias_name, b)
        elif isinstance(step, Gate):
            gate = _gate(step.act, cur)
            parts.map(lambda x, gate=gate: gate * x)
            cur = step.act(cur)
            frozen.append(step.frozen)
        elif isinstance(step, Norm):
            parts.freeze_norm(step.module, cur, step.bias_name)
            cur = parts.total()
            if step.frozen:
                frozen.append(step.frozen)
        else:  # Unembed: the last step
            if step.bias is not None:
                extra.append((step.bias_name, float(diff(step.bias[:, None])[0])))
            W = step.weight.double()
            if step.softcap is not None:  # Gemma 2: capped logits, the cap frozen as a gate
                cap = step.softcap
                W = _gate(lambda z, cap=cap: cap * torch.tanh(z / cap), W @ cur)[:, None] * W
                frozen.append(f"the final logit softcap as its gate softcap(z)/z (cap {cap:g})")
            return diff(W), extra
    raise ValueError("a model's dla_readout must end with an Unembed step")
