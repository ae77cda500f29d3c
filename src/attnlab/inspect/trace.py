"""Trace one forward pass step by step, the way the notes walk through "I like to eat apples".

Every number comes from the recorded activations (``Recording.cache``) and the model's weights;
nothing is recomputed by a second implementation, except the raw scores Q K^T, which are
shown before the 1/sqrt(d_k) scaling that the recorded ``scores`` already include. For the
chosen layer and head:

    X (N, M) -> Q = X W_Q, K = X W_K, V = X W_V        (N, d_k), (N, d_k), (N, d_v)
    scores = Q K^T / sqrt(d_k) (N, N) -> mask -> softmax over keys -> weights (N, N)
    z = weights V (N, d_v); concat heads (N, H d_v); out = concat W_O (N, M)
    h = x + out; FFN(LN(h)); ...; logits (N, vocab) -> next-token probabilities
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.attention import causal_mask
from attnlab.inspect.display import (
    Result,
    heatmap_html,
    matrix_table,
    preview,
    preview_text,
    rounded,
    show_token,
)
from attnlab.inspect.recording import InspectError, Recording, record

FULL_VALUES = 16384  # steps with at most this many numbers carry all of them in --json


@dataclass
class Step:
    """One step of the forward pass: what it is, its shape, what it means, its numbers."""

    name: str
    title: str
    shape: tuple[int, ...]
    meaning: str
    value: np.ndarray | None = None
    rows: list[str] | None = None  # token labels when the matrix is token x token
    cols: list[str] | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {
            "name": self.name,
            "title": self.title,
            "shape": list(self.shape),
            "meaning": self.meaning,
        }
        if self.value is not None:
            d["preview"] = preview(self.value)
            if self.value.size <= FULL_VALUES:
                d["values"] = rounded(self.value, 5)
        d.update(self.extra)
        return d


@dataclass
class Trace(Result):
    """The steps of one forward pass for one layer and head."""

    text: str
    tokens: list[str]
    ids: list[int]
    layer: int
    head: int
    steps: list[Step]

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; steps: {', '.join(s.name for s in self.steps)}")

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [
            Text(f"trace of {self.text!r}: layer {self.layer}, head {self.head}\n", style="bold")
        ]
        for n, s in enumerate(self.steps, 1):
            shape = " x ".join(map(str, s.shape)) if s.shape else "-"
            parts.append(Text(f"[{n}] {s.title}   shape ({shape})", style="bold cyan"))
            parts.append(Text(f"    {s.meaning}"))
            if s.name == "tokens":
                parts.append(
                    Text(
                        "    "
                        + "  ".join(f"{show_token(t)}={i}" for t, i in zip(self.tokens, self.ids))
                    )
                )
            elif s.name == "predictions":
                for p in s.extra["predictions"]:
                    parts.append(Text(f"    {show_token(p['token']):>8}  p={p['prob']:.3f}"))
            elif s.rows is not None and s.value is not None and s.value.ndim == 2:
                parts.append(matrix_table(s.value, s.rows, s.cols or s.rows, limit=12, heat=False))
            elif s.value is not None:
                parts.append(
                    Text("\n".join("    " + line for line in preview_text(s.value).splitlines()))
                )
            parts.append(Text(""))
        return Group(*parts)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "ids": self.ids,
            "layer": self.layer,
            "head": self.head,
            "steps": [s.to_dict() for s in self.steps],
        }

    def _repr_html_(self) -> str:
        import html

        out = [
            f"<h4>trace of {html.escape(repr(self.text))}: layer {self.layer}, "
            f"head {self.head}</h4>"
        ]
        for n, s in enumerate(self.steps, 1):
            shape = " x ".join(map(str, s.shape))
            out.append(
                f"<div><b>[{n}] {html.escape(s.title)}</b> <code>({shape})</code><br>"
                f"<i>{html.escape(s.meaning)}</i></div>"
            )
            if s.name == "predictions":
                rows = "".join(
                    f"<tr><td>{html.escape(show_token(p['token']))}</td><td>{p['prob']:.3f}</td></tr>"
                    for p in s.extra["predictions"]
                )
                out.append(f"<table>{rows}</table>")
            elif s.rows is not None and s.value is not None and s.value.ndim == 2:
                out.append(
                    heatmap_html(s.value, s.rows, s.cols or s.rows, limit=24, diverging=True)
                )
            elif s.value is not None:
                out.append(f"<pre>{html.escape(preview_text(s.value))}</pre>")
        return "\n".join(out)


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _head_slice(w: torch.Tensor, h: int, d: int) -> np.ndarray:
    """The rows of a (H * d, M) projection weight that make head h, as the (M, d) matrix W."""
    return _np(w[h * d : (h + 1) * d].T)


@torch.no_grad()
def trace(
    model,
    tokenizer,
    text: str,
    layer: int = 0,
    head: int = 0,
    top_k: int = 5,
    rec: Recording | None = None,
) -> Trace:
    """Explain one forward pass of ``model`` over ``text`` step by step (see module docstring)."""
    rec = rec or record(model, tokenizer, text)
    c = rec.cache
    info = rec.select(layer=layer, name="attn.weights")
    stack = info.stack
    toks, ids = rec.tokens[stack], rec.ids.get(stack, [])
    N = len(toks)
    H = info.n_heads
    if not 0 <= head < H:
        raise InspectError(f"no head {head}; layer {info.layer} has heads 0..{H - 1}")
    path = info.module_path  # e.g. "blocks.0.attn"
    prefix = path[: -len("attn")]  # "blocks.0."
    attn = model.get_submodule(path)
    root = stack + "." if stack else ""
    steps: list[Step] = []
    add = steps.append

    add(
        Step(
            "tokens",
            "tokens and ids",
            (N,),
            f"the text split into N = {N} tokens, each mapped to its integer id in the vocabulary.",
        )
    )
    if root + "embed" in c:
        e = _np(c[root + "embed"][0])
        add(
            Step(
                "embedding",
                "embedding matrix",
                e.shape,
                f"each token looks up a learned vector of M = "
                f"{e.shape[1]} numbers: the N x M embedding matrix (one row per token).",
                e,
            )
        )
    if root + "pos" in c:
        p = _np(c[root + "pos"])
        p = p[0] if p.ndim == 3 else p
        add(
            Step(
                "positional",
                "positional encoding",
                p.shape,
                "attention alone is blind to order, so a "
                "vector for each position is added to its token's embedding.",
                p,
            )
        )
    elif getattr(attn, "rotary", None) is not None:
        add(
            Step(
                "positional",
                "positional encoding (rotary)",
                (),
                "positions are not added here: they "
                "rotate pairs of channels of Q and K inside attention, by position x frequency.",
            )
        )
    x_in = _np(c[prefix + "resid_pre"][0]) if prefix + "resid_pre" in c else None
    if x_in is not None:
        what = (
            "embedding + position"
            if info.layer in (0, None)
            else f"the output of layer {info.layer - 1}"
        )
        add(
            Step(
                "block_input",
                f"input to layer {info.layer}",
                x_in.shape,
                f"the residual stream entering this layer: {what}, one M-vector per token.",
                x_in,
            )
        )
    if prefix + "ln1" in c:
        x = _np(c[prefix + "ln1"][0])
        add(
            Step(
                "ln1",
                "layer norm before attention",
                x.shape,
                "each row is normalised to mean 0 and "
                "variance 1, then scaled and shifted by learned weights: X, the input to "
                "attention.",
                x,
            )
        )
    dk, dv = attn.d_k, attn.d_v
    wq, wk, wv = (
        _head_slice(m.weight, head, d)
        for m, d in ((attn.q_proj, dk), (attn.k_proj, dk), (attn.v_proj, dv))
    )
    add(
        Step(
            "W_Q",
            f"W_Q of head {head}",
            wq.shape,
            f"learned projection M -> d_k = {dk}: Q = X W_Q asks 'what am I looking for?'",
            wq,
        )
    )
    add(
        Step(
            "W_K",
            f"W_K of head {head}",
            wk.shape,
            "K = X W_K says 'what do I contain?'; a query meets keys through dot products.",
            wk,
        )
    )
    add(
        Step(
            "W_V",
            f"W_V of head {head}",
            wv.shape,
            f"V = X W_V (d_v = {dv}) is what a token passes on when it is attended to.",
            wv,
        )
    )
    q, k, v = (_np(c[f"{path}.{n}"][0, head]) for n in ("q", "k", "v"))
    add(Step("Q", "Q = X W_Q (+ bias)", q.shape, "one query vector per token.", q))
    add(Step("K", "K = X W_K (+ bias)", k.shape, "one key vector per token.", k))
    add(Step("V", "V = X W_V (+ bias)", v.shape, "one value vector per token.", v))
    raw = q @ k.T  # (N, S) raw similarities
    q_lab, k_lab = rec.labels(info.name)
    add(
        Step(
            "raw_scores",
            "raw scores Q K^T",
            raw.shape,
            "entry (i, j) is the dot product of query i and key "
            "j: how well token j matches what token i is looking for.",
            raw,
            q_lab,
            k_lab,
        )
    )
    scaled = _np(c[f"{path}.scores"][0, head])
    add(
        Step(
            "scaled_scores",
            f"scaled by 1/sqrt(d_k) = 1/sqrt({dk}) = {1 / math.sqrt(dk):.4f}",
            scaled.shape,
            "dividing by sqrt(d_k) keeps the scores' spread near 1 so the softmax does not "
            "saturate.",
            scaled,
            q_lab,
            k_lab,
        )
    )
    block = model.get_submodule(prefix.rstrip(".")) if prefix else model
    causal = bool(getattr(block, "causal", getattr(model, "causal", False)))
    if causal:
        T, S = scaled.shape
        allowed = causal_mask(T, S).numpy()
        masked = np.where(allowed, scaled, -np.inf)
        add(
            Step(
                "masked_scores",
                "causal mask",
                masked.shape,
                "a token may not look at later tokens: "
                "scores right of the diagonal become -inf, so after the softmax they weigh 0.",
                masked,
                q_lab,
                k_lab,
            )
        )
    w = _np(c[f"{path}.weights"][0, head])
    sums = w.sum(-1)
    add(
        Step(
            "weights",
            "softmax over the keys",
            w.shape,
            f"each row becomes probabilities: row sums are "
            f"{sums.min():.6f}..{sums.max():.6f}, i.e. every row sums to 1.",
            w,
            q_lab,
            k_lab,
            extra={"row_sums": rounded(sums, 6)},
        )
    )
    z = _np(c[f"{path}.z"][0, head])
    add(
        Step(
            "z",
            "weights x V",
            z.shape,
            "each token's new vector is the weighted average of the value vectors it attends to.",
            z,
        )
    )
    zall = c[f"{path}.z"][0]  # (H, N, d_v)
    concat = _np(zall.transpose(0, 1).reshape(zall.size(1), -1))  # (N, H * d_v)
    add(
        Step(
            "concat",
            f"concatenate the {H} heads",
            concat.shape,
            f"the {H} heads' outputs side by side: "
            f"H x d_v = {H} x {dv} = {concat.shape[1]} numbers per token.",
            concat,
        )
    )
    out = _np(c[f"{path}.out"][0])
    add(
        Step(
            "attn_out",
            "output projection W_O",
            out.shape,
            "W_O mixes the heads' outputs back to the "
            "model width M: attention's update to each token.",
            out,
        )
    )
    if prefix + "resid_mid" in c:
        h = _np(c[prefix + "resid_mid"][0])
        norm_first = getattr(block, "norm_first", True)
        how = "x + attention(LN(x))" if norm_first else "LN(x + attention(x))"
        add(
            Step(
                "resid_mid",
                "residual connection",
                h.shape,
                f"the update is added to the token's own "
                f"vector ({how}): attention refines, it does not replace.",
                h,
            )
        )
    if prefix + "ln2" in c:
        h = _np(c[prefix + "ln2"][0])
        add(
            Step(
                "ln2",
                "layer norm before the feed-forward network",
                h.shape,
                "normalised again before the position-wise MLP.",
                h,
            )
        )
    if prefix + "mlp.hidden" in c:
        hid = _np(c[prefix + "mlp.hidden"][0])
        add(
            Step(
                "ffn_hidden",
                "feed-forward: widen + activation",
                hid.shape,
                f"each token on its own goes "
                f"through W_1 (M -> {hid.shape[1]}) and a non-linearity.",
                hid,
            )
        )
    if prefix + "mlp_out" in c:
        f = _np(c[prefix + "mlp_out"][0])
        add(
            Step(
                "ffn_out",
                "feed-forward: back to M",
                f.shape,
                "W_2 maps back to the model width: the FFN's update to each token.",
                f,
            )
        )
    if prefix + "resid_post" in c:
        r = _np(c[prefix + "resid_post"][0])
        add(
            Step(
                "block_output",
                f"output of layer {info.layer}",
                r.shape,
                "residual plus FFN update: the token vectors handed to the next layer.",
                r,
            )
        )
    n_blocks = len(rec.blocks(stack))
    if info.layer is not None and info.layer + 1 < n_blocks:
        add(
            Step(
                "more_layers",
                f"layers {info.layer + 1}..{n_blocks - 1}",
                (N, x_in.shape[1] if x_in is not None else 0),
                "the remaining layers repeat the same steps with their own weights.",
            )
        )
    if root + "ln_f" in c:
        hf = _np(c[root + "ln_f"][0])
        add(Step("ln_f", "final layer norm", hf.shape, "the last residual stream, normalised.", hf))
    logits = c.get(root + "logits", rec.logits)
    if logits is not None:
        lg = _np(logits[0])
        add(
            Step(
                "logits",
                "logits",
                lg.shape,
                f"each position scores all {lg.shape[-1]} vocabulary entries "
                "(the LM head: a dot product with every token's embedding).",
                lg,
            )
        )
        probs = torch.softmax(torch.as_tensor(lg[-1], dtype=torch.float64), -1)
        top = torch.topk(probs, min(top_k, probs.numel()))
        preds = [
            {
                "id": int(i),
                "token": tokenizer.decode([int(i)]) if tokenizer else str(int(i)),
                "prob": float(p),
            }
            for p, i in zip(top.values, top.indices)
        ]
        add(
            Step(
                "predictions",
                f"top {len(preds)} next-token predictions after {show_token(toks[-1])!r}",
                (lg.shape[-1],),
                "softmax of the last position's logits: the model's guess for the next token.",
                extra={"predictions": preds},
            )
        )
    return Trace(text, list(toks), list(ids), info.layer or 0, head, steps)
