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
from torch import Tensor, nn

from attnlab import hooks
from attnlab.interventions.figures import figure_html, heat, new_figure, save_png
from attnlab.interventions.subjects import InterventionError, Subject
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
        from rich.table import Table
        from rich.text import Text

        what = f"logit({self.target!r})" + (f" - logit({self.foil!r})" if self.foil else "")
        parts = [Text(f"direct logit attribution of {what} at position {self.position} "
                      f"({show_token(self.token)}) of {self.text!r}", style="bold"),
                 Text(f"logit {self.logit:.6f} (float32 model: {self.logit_float32:.6f}); parts "
                      f"sum to {self.total:.6f} (difference {abs(self.total - self.logit):.1e})"),
                 Text("frozen: " + "; ".join(self.frozen) + "\n", style="dim")]  # fmt: skip
        t = Table(title="largest parts", box=None)
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


class _Parts:
    """Named vectors (C,) whose sum is the residual stream at one position."""

    def __init__(self):
        self.v: dict[str, Tensor] = {}

    def add(self, name: str, x: Tensor) -> None:
        self.v[name] = x.double()

    def total(self) -> Tensor:
        return sum(self.v.values())

    def map(self, fn) -> None:
        self.v = {k: fn(x) for k, x in self.v.items()}

    def check(self, where: str, recorded: Tensor) -> None:
        err = float((self.total() - recorded.double()).abs().max())
        scale = float(recorded.abs().max()) + 1.0
        if err > TOL * scale:
            raise RuntimeError(f"DLA lost track of the residual stream at {where}: the parts "
                               f"differ from the recorded value by {err:.2e}")  # fmt: skip

    def layer_norm(self, ln: nn.Module, u: Tensor, bias_name: str) -> bool:
        """Apply ``ln`` to the parts with its scale frozen at ``u``'s (the pre-norm sum)."""
        if isinstance(ln, RMSNorm):
            self.map(lambda x: x * _rms_gain(ln, u))
            return True
        if not isinstance(ln, nn.LayerNorm):
            return False
        sigma = torch.sqrt(u.double().var(unbiased=False) + ln.eps)
        gamma = ln.weight.double() if ln.weight is not None else 1.0
        self.map(lambda x: gamma * (x - x.mean()) / sigma)
        if ln.bias is not None:
            self.add(bias_name, ln.bias)
        return True


def _rms_gain(ln: RMSNorm, u: Tensor) -> Tensor:
    """(C,) what an RMSNorm multiplies its input by, frozen at input ``u``: (offset + w) / rms."""
    u = u.double()
    return (ln.offset + ln.weight.double()) / torch.sqrt(u.pow(2).mean() + ln.eps)


def _gate(act, z: Tensor) -> Tensor:
    """act(z) / z, with 0 where z == 0 (act(0) = 0 for GELU, ReLU and tanh)."""
    nz = z != 0
    return torch.where(nz, act(z) / torch.where(nz, z, torch.ones_like(z)), torch.zeros_like(z))


def _blocks(model: nn.Module, subject: Subject) -> tuple[str, nn.ModuleList]:
    if subject.kind == "seq2seq":
        return "decoder.blocks.", model.decoder.blocks
    return "blocks.", model.blocks


@torch.no_grad()
def direct_logit_attribution(
    subject: Subject,
    text: str,
    target: str,
    foil: str | None = None,
    position: int | None = None,
) -> DLAResult:
    """Split logit(target) (minus logit(foil)) at ``position`` into embeddings, every head, every
    MLP and every bias, with the LayerNorm scales frozen (see module doc)."""
    if subject.kind == "rnn":
        raise InterventionError("direct logit attribution splits a residual stream into parts; "
                                "an LSTM has none (its state is rewritten, not added to)")  # fmt: skip
    t = subject.token_id(target)
    f = subject.token_id(foil) if foil is not None else None
    p = subject.prepare(text)
    pos = subject.metric_position(p, position, t)
    logit32 = subject.logits(p)[0, pos].double()
    model = copy.deepcopy(subject.model).double().eval()
    sub = Subject(model, subject.tokenizer, subject.classes)
    args = tuple(a.double() if a.is_floating_point() else a for a in p.args)
    with hooks.record(model) as c:
        logits = sub.forward(*args)[0, pos]  # (V,)
    parts, frozen = _Parts(), []
    stream_pos = 0 if subject.kind == "vit" else pos
    _embeddings(parts, model, subject.kind, c, stream_pos)
    root, blocks = _blocks(model, subject)
    post_norm = post_norm_out = False
    heads: dict[str, list] = {}
    at = lambda name: c[name][0, stream_pos]  # noqa: E731
    for i, block in enumerate(blocks):
        P = f"{root}{i}."
        parts.check(P + "resid_pre", at(P + "resid_pre"))
        u = at(P + "resid_pre")
        for kind, attn, ln, point in (("attn", block.attn, block.ln1, "resid_mid"),
                                      ("cross", block.cross, getattr(block, "ln_cross", None),
                                       "resid_cross")):  # fmt: skip
            if attn is None:
                continue
            z = c[f"{P}{kind}.z"][0, :, stream_pos]  # (H, d_v)
            H, dv = z.shape
            W = attn.out_proj.weight.double().view(-1, H, dv)  # (C, H, d_v): W_O^h per head
            # four-norm blocks (Gemma 2/3) norm the attention's output before adding it: its
            # RMSNorm, frozen at the whole output, scales each head's part
            gain = _rms_gain(block.ln1_post, at(f"{P}{kind}.out")) if block.post_norms else 1.0
            for h in range(H):
                parts.add(f"{P}{kind}.head{h}", gain * (W[:, h] @ z[h]))
            if attn.out_proj.bias is not None:
                parts.add(f"{P}{kind}.bias", gain * attn.out_proj.bias.double())
            group = kind if subject.kind != "seq2seq" else ("decoder self" if kind == "attn"
                                                            else "cross")  # fmt: skip
            heads.setdefault(group, []).append((i, kind, H))
            if not block.norm_first:
                post_norm = True
                parts.layer_norm(
                    ln,
                    u + at(f"{P}{kind}.out"),
                    f"{P}{'ln1' if kind == 'attn' else 'ln_cross'}.bias",
                )
            parts.check(P + point, at(P + point))
            u = at(P + point)
        if block.post_norms:
            post_norm_out = True
        parts.add(P + "mlp_out", at(P + ("mlp_post" if block.post_norms else "mlp_out")))
        if not block.norm_first:
            parts.layer_norm(block.ln2, u + at(P + "mlp_out"), P + "ln2.bias")
        parts.check(P + "resid_post", at(P + "resid_post"))
    last = at(f"{root}{len(blocks) - 1}.resid_post")
    stack = model.decoder if subject.kind == "seq2seq" else model
    prefix = "decoder." if subject.kind == "seq2seq" else ""
    if parts.layer_norm(stack.ln_f, last, prefix + "ln_f.bias"):
        frozen.append(f"the final norm's scale ({prefix}ln_f)")
    if post_norm_out:
        frozen.append("each block's norms on the attention's and MLP's outputs (ln1_post, "
                      "ln2_post) at their scales, the heads sharing the attention's")  # fmt: skip
    if post_norm:
        frozen.append("every post-norm LayerNorm's scale on the residual stream (each block's "
                      "ln1, ln2" + (", ln_cross" if subject.kind == "seq2seq" else "") + ")")  # fmt: skip
    if subject.kind in ("mlm", "encoder", "classify") and isinstance(model.embed_ln, nn.LayerNorm):
        frozen.append("the embedding LayerNorm's scale (embed_ln)")
    w, extra = _readout(parts, model, subject.kind, t, f, frozen)
    comps = [(n, float(x @ w)) for n, x in parts.v.items()] + extra
    value = float(logits[t] - (logits[f] if f is not None else 0.0))
    value32 = float(logit32[t] - (logit32[f] if f is not None else 0.0))
    lookup = dict(comps)
    grids = {g: np.array([[lookup[f"{root}{i}.{kind}.head{h}"] for h in range(H)]
                          for i, kind, H in rows]) for g, rows in heads.items()}  # fmt: skip
    return DLAResult(text, subject.decode(t), subject.decode(f) if f is not None else None, pos,
                     p.tokens[pos], value, value32, comps, frozen, grids, list(subject.notes))  # fmt: skip


def _embeddings(parts: _Parts, model: nn.Module, kind: str, c, pos: int) -> None:
    """The embedding parts of the residual stream at ``pos`` (before block 0)."""

    def row(name):
        x = c[name]
        return x[0, pos] if x.dim() == 3 else x[pos]

    if kind == "gpt":
        parts.add("embed", row("embed"))
        if "pos" in c:
            parts.add("pos", row("pos"))
    elif kind in ("mlm", "encoder", "classify"):
        parts.add("embed", row("embed"))
        parts.add("pos", row("pos"))
        if "type" in c:
            parts.add("type", row("type"))
        u = parts.total()
        parts.layer_norm(model.embed_ln, u, "embed_ln.bias")
    elif kind == "seq2seq":
        parts.add("decoder.embed", row("decoder.embed"))  # token * sqrt(C) + position
    elif kind == "vit":
        parts.add("cls_token", model.cls_token[0, 0])
        parts.add("pos", model.pos_embed[0, 0])


def _readout(parts: _Parts, model, kind: str, t: int, f: int | None, frozen: list[str]):
    """Carry the parts through the head to the vector w with logit = sum_c part_c . w; returns
    (w, extra bias parts that do not go through w)."""

    def diff(W: Tensor) -> Tensor:
        W = W.double()
        return W[t] - (W[f] if f is not None else 0.0)

    extra = []
    if kind == "gpt" and model.config.final_softcap is not None:  # Gemma 2: a capped readout
        cap, W = model.config.final_softcap, model.lm_head.weight.double()
        gate = _gate(lambda z: cap * torch.tanh(z / cap), W @ parts.total())  # (V,)
        frozen.append(f"the final logit softcap as its gate softcap(z)/z (cap {cap:g})")
        return diff(gate[:, None] * W), extra
    if kind == "gpt":
        return diff(model.lm_head.weight), extra
    if kind == "seq2seq":
        return diff(model.decoder.lm_head.weight), extra
    if kind == "encoder":
        return diff(model.tok_embed.weight), extra
    if kind == "vit":
        extra.append(("head.bias", float(diff(model.head.bias[:, None])[0])))
        return diff(model.head.weight), extra
    if kind == "mlm":
        head = model.mlm
        h = parts.total()
        z = head.dense.weight.double() @ h + (
            head.dense.bias.double() if head.dense.bias is not None else 0
        )
        parts.map(lambda x: head.dense.weight.double() @ x)
        if head.dense.bias is not None:
            parts.add("mlm.dense.bias", head.dense.bias)
        gate = _gate(head.act, z)
        parts.map(lambda x: gate * x)
        parts.layer_norm(head.ln, head.act(z), "mlm.ln.bias")
        frozen.append("the masked-LM head's activation as its gate act(z)/z, and its "
                      "LayerNorm's scale (mlm.ln)")  # fmt: skip
        extra.append(("mlm.decoder.bias", float(diff(head.decoder.bias[:, None])[0])))
        return diff(head.decoder.weight), extra
    # classify: [CLS] -> (tanh pooler) -> classifier
    if model.pooler is not None:
        h = parts.total()
        z = model.pooler.weight.double() @ h + model.pooler.bias.double()
        parts.map(lambda x: model.pooler.weight.double() @ x)
        parts.add("pooler.bias", model.pooler.bias)
        gate = _gate(torch.tanh, z)
        parts.map(lambda x: gate * x)
        frozen.append("the pooler's tanh as its gate tanh(z)/z")
    extra.append(("classifier.bias", float(diff(model.classifier.bias[:, None])[0])))
    return diff(model.classifier.weight), extra
