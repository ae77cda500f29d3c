"""What if: one head's attention with one piece changed, to see what each piece is for.

Given a head's queries, keys and values (a real run's, recorded; or ``by_hand``'s Q = X W_Q,
K = X W_K, V = X W_V), the attention is computed as the model computes it (the baseline) and
again with one change at a time, all by attnlab's own ``reference_attention``:

    no scale       the scores Q K^T go into the softmax without the 1/sqrt(d_k)
                   (a model that does not scale gets it added instead)
    no causal mask every token reads the tokens after it too (a model without the mask gets
                   one); a cross-attention has none to take away and skips it
    temperature    the scores divided by t (and by 1/t): flatter and sharper weights
    padding        the text batched with one ``pad`` tokens longer, so ``pad`` padding
                   positions (zero vectors) follow it, and no padding mask hides them; with
                   the mask the weights are the text's own again, as the result says

For each change: the weights before and after, each row's entropy (bits) and largest weight
before and after, and how far each token's output (weights x V) moved, relative to its length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.attention import MultiHeadAttention
from attnlab.blocks import Block
from attnlab.inspect.by_hand import PAD, HandMatrices, Settings, attend, entropy_bits, indented
from attnlab.inspect.recording import InspectError, Recording
from attnlab.render.display import Result, heatmap_html, matrix_table, rounded

DEFAULT_TEMPERATURE = 2.0
DEFAULT_PAD = 2
AGREE = 1e-4  # the baseline must reproduce the recorded weights to this (float32 noise)


@dataclass
class Change:
    """One what-if: the weights ``before`` (the baseline) and ``after`` the change, over the
    same query rows; ``after`` may have more key columns (the padding)."""

    name: str  # no_scale (or with_scale), no_causal_mask (or causal_mask), temperature_flatter,
    #            temperature_sharper, padding
    title: str
    meaning: str  # what the piece is for
    finding: str  # what changed, in numbers
    after: np.ndarray  # (T, S')
    cols: list[str]  # the key labels of ``after``
    entropy_after: np.ndarray
    max_after: np.ndarray
    moved: np.ndarray  # (T,) ||z_after - z_before|| / ||z_before||
    extra: dict = field(default_factory=dict)

    def to_dict(self, entropy_before, max_before) -> dict:
        return {"name": self.name, "title": self.title, "meaning": self.meaning,
                "finding": self.finding, "cols": self.cols, "after": rounded(self.after, 5),
                "entropy_before": rounded(entropy_before, 4),
                "entropy_after": rounded(self.entropy_after, 4),
                "max_before": rounded(max_before, 4), "max_after": rounded(self.max_after, 4),
                "output_moved": rounded(self.moved, 4), **self.extra}  # fmt: skip


@dataclass
class WhatIf(Result):
    """The baseline weights (T, S) of one head and each ``Change``."""

    heading: str
    baseline: str  # what the model does, in words ("scaled by 1/sqrt(16), causal mask")
    rows: list[str]
    cols: list[str]
    before: np.ndarray
    changes: list[Change]
    about: dict = field(default_factory=dict)

    @property
    def entropy_before(self) -> np.ndarray:
        return entropy_bits(self.before)

    @property
    def max_before(self) -> np.ndarray:
        return self.before.max(-1)

    def change(self, name: str) -> Change:
        for c in self.changes:
            if c.name == name:
                return c
        raise KeyError(f"no change {name!r}; changes: {', '.join(c.name for c in self.changes)}")

    def to_dict(self) -> dict:
        eb, mb = self.entropy_before, self.max_before
        return {"heading": self.heading, "baseline": self.baseline, "rows": self.rows,
                "cols": self.cols, "before": rounded(self.before, 5),
                "changes": [c.to_dict(eb, mb) for c in self.changes]}  # fmt: skip

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        eb, mb = self.entropy_before, self.max_before
        table = FitTable(title="mean over the tokens, before -> after", keep=1)
        for col, justify in (("what if", "left"), ("entropy (bits)", "right"),
                             ("largest weight", "right"), ("output moved", "right")):  # fmt: skip
            table.add_column(col, justify)
        for c in self.changes:
            table.add_row(c.title, f"{eb.mean():.2f} -> {c.entropy_after.mean():.2f}",
                          f"{mb.mean():.2f} -> {c.max_after.mean():.2f}", f"{c.moved.mean():.0%}")  # fmt: skip
        parts = [Text(self.heading, style="bold"), Text(f"as it runs: {self.baseline}"),
                 matrix_table(self.before, self.rows, self.cols, "the weights as it runs",
                              row_name="queries", col_name="keys"), Text(""), table]  # fmt: skip
        for n, c in enumerate(self.changes, 1):
            parts += [Text(""), Text(f"[{n}] {c.title}", style="bold cyan"),
                      indented(c.meaning), indented(c.finding),
                      matrix_table(c.after, self.rows, c.cols, row_name="queries",
                                   col_name="keys")]  # fmt: skip
        return Group(*parts)

    def _repr_html_(self) -> str:
        import html

        out = [f"<h4>{html.escape(self.heading)}</h4><p>as it runs: "
               f"{html.escape(self.baseline)}</p>",
               heatmap_html(self.before, self.rows, self.cols, "the weights as it runs")]  # fmt: skip
        for c in self.changes:
            out.append(f"<div><b>{html.escape(c.title)}</b><br><i>{html.escape(c.meaning)}</i>"
                       f"<br>{html.escape(c.finding)}</div>")  # fmt: skip
            out.append(heatmap_html(c.after, self.rows, c.cols))
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The changes, on any Q, K, V
# ---------------------------------------------------------------------------------------------


def _mask(T: int, S: int, causal: bool, window: int | None, keys=None):
    """(T, S) True = may attend: causal (bottom-right aligned), a sliding window, and only the
    keys ``keys`` (a boolean (S,): the padding mask; None: every key); None when nothing is
    hidden."""
    from attnlab.attention import causal_mask, combine_masks, sliding_window_mask

    pad = keys[None, :] if keys is not None else None  # (1, S)
    return combine_masks(causal_mask(T, S) if causal else None,
                         sliding_window_mask(T, S, window) if window else None, pad)  # fmt: skip


def _moved(z0: torch.Tensor, z1: torch.Tensor) -> np.ndarray:
    """Each row's ||z1 - z0|| / ||z0|| (0 where both are zero)."""
    d = (z1 - z0).norm(dim=-1)
    n = z0.norm(dim=-1)
    return torch.where(n > 0, d / n.clamp_min(1e-300), d).numpy()


def compare(q, k, v, rows: list[str], cols: list[str], *, scale: float, causal: bool,
            cross: bool = False, window: int | None = None, bias=None, cap: float | None = None,
            temperature: float = DEFAULT_TEMPERATURE, pad: int = DEFAULT_PAD,
            heading: str = "what if", recorded=None) -> WhatIf:  # fmt: skip
    """The baseline and every change (module doc) for one head: ``q`` (T, d_k), ``k`` (S, d_k),
    ``v`` (S, d_v); ``scale`` is the model's factor on Q K^T; ``bias`` (T, S) is added to the
    scaled scores, ``cap`` softcaps them. ``recorded`` (T, S): the weights the model recorded,
    which the baseline must reproduce (else an InspectError: a piece this does not model)."""
    if not (math.isfinite(temperature) and temperature > 0 and temperature != 1):
        raise InspectError(f"the what-if temperature must be a positive number other than 1, "
                           f"got {temperature:g}")  # fmt: skip
    q, k, v = (torch.as_tensor(np.asarray(a), dtype=torch.float64) for a in (q, k, v))
    bias = None if bias is None else torch.as_tensor(np.asarray(bias), dtype=torch.float64)
    T, d_k = q.size(0), q.size(-1)

    def run(factor=scale, is_causal=causal, b=bias, qq=q, kk=k, vv=v, keys=None):
        m = _mask(qq.size(0), kk.size(0), is_causal, window, keys)
        out, w, _ = attend(qq, kk, vv, m, factor, bias=b, cap=cap)
        return out, w

    z0, w0 = run()
    if recorded is not None:
        diff = float(np.abs(w0.numpy() - np.asarray(recorded, dtype=np.float64)).max())
        if diff > AGREE:
            raise InspectError(f"what-if could not reproduce this head's weights from its Q, K "
                               f"and V (they differ by {diff:.2g}): its attention has a piece "
                               "what-if does not model")  # fmt: skip
    w0n = w0.numpy()
    e0, m0 = entropy_bits(w0n), w0n.max(-1)
    changes = []

    def change(name, title, meaning, z, w, cols_after=cols, finding=None, rows=slice(0, T),
               **extra):  # fmt: skip
        wn = w.numpy()[rows]  # the text's own query rows
        e1, m1 = entropy_bits(wn), wn.max(-1)
        moved = _moved(z0, z[rows])
        if finding is None:
            finding = (f"each row's largest weight goes from {m0.mean():.2f} to {m1.mean():.2f} "
                       f"on average, its entropy from {e0.mean():.2f} to {e1.mean():.2f} bits; "
                       f"the outputs move by {moved.mean():.0%} of their length.")  # fmt: skip
        changes.append(Change(name, title, meaning, finding, wn, list(cols_after), e1, m1,
                              moved, extra))  # fmt: skip

    unit = 1 / math.sqrt(d_k)
    if abs(scale - 1.0) > 1e-12:
        z, w = run(factor=1.0)
        change("no_scale", "no 1/sqrt(d_k) scale", (
            f"the scores are Q K^T x {scale:.4g} as it runs; without it the softmax reads "
            f"numbers about sqrt(d_k) = {math.sqrt(d_k):.2f} times larger and puts more weight "
            "on fewer keys: the scale keeps the weights from saturating as d_k grows."), z, w)  # fmt: skip
    else:
        z, w = run(factor=unit)
        change("with_scale", f"with 1/sqrt(d_k) = {unit:.4f}", (
            "this attention does not scale its scores (T5 folds the scale into W_Q); with "
            "1/sqrt(d_k) the scores shrink and the weights flatten."), z, w)  # fmt: skip
    if cross:
        pass  # a cross-attention reads the whole source: no causal mask to take away
    elif causal:
        z, w = run(is_causal=False)
        later = float(np.triu(w.numpy(), 1).sum(-1).mean())
        change("no_causal_mask", "no causal mask", (
            "the causal mask keeps each token from reading the tokens after it, which a model "
            "generating text has not seen yet; without it every token reads the whole text."),
            z, w, finding=(f"on average {later:.0%} of a row's weight goes to later tokens; "
                           f"the outputs move by {_moved(z0, z).mean():.0%} of their length."),
            weight_on_later=round(later, 4))  # fmt: skip
    else:
        z, w = run(is_causal=True)
        change("causal_mask", "with a causal mask", (
            "this attention reads both ways; a causal mask would hide every later token, as a "
            "decoder's does."), z, w)  # fmt: skip
    for t in (temperature, 1 / temperature):
        z, w = run(factor=scale / t)
        how = "flatter" if t > 1 else "sharper"
        change(f"temperature_{how}", f"temperature {t:.3g} ({how})", (
            f"the scores divided by {t:.3g} before the softmax: a temperature above 1 spreads "
            "the weight over more keys, below 1 concentrates it (at 0 it would be the argmax)."),
            z, w, temperature=t)  # fmt: skip
    if pad:
        args, extra = _padding(run, q, k, v, bias, w0n, pad, causal, cross, cols)
        change(*args, **extra)
    return WhatIf(heading, _baseline_words(scale, d_k, causal, cross, window, bias, cap),
                  list(rows), list(cols), w0n, changes)  # fmt: skip


def _padding(run, q, k, v, bias, w0, pad: int, causal: bool, cross: bool, cols):
    """The padding what-if's arguments to ``change``: ``pad`` zero vectors batched beside the
    text's Q, K and V, attended without a padding mask, and with it (which must restore w0). A
    causal self-attention is padded on the left, as a batch is for generation: pads on the
    right come after every token, and the causal mask hides them already."""
    T, S = q.size(0), k.size(0)
    left = causal and not cross
    zeros = lambda a: a.new_zeros(pad, a.size(-1))  # noqa: E731  a pad's query, key, value
    join = (lambda a: torch.cat([zeros(a), a])) if left else (lambda a: torch.cat([a, zeros(a)]))  # noqa: E731
    qp, kp, vp = (q if cross else join(q)), join(k), join(v)  # (T + pad, d), (S + pad, d)
    bp = None
    if bias is not None:  # the pads' bias: 0
        edges = (pad, 0, 0 if cross else pad, 0) if left else (0, pad, 0, 0 if cross else pad)
        bp = torch.nn.functional.pad(bias, edges)
    real = torch.arange(S + pad) >= pad if left else torch.arange(S + pad) < S  # (S + pad,)
    rows = slice(0, T) if cross else (slice(pad, pad + T) if left else slice(0, T))
    z, w = run(qq=qp, kk=kp, vv=vp, b=bp)
    _, wm = run(qq=qp, kk=kp, vv=vp, b=bp, keys=real)
    on_pads = float(w.numpy()[rows][:, ~real.numpy()].sum(-1).mean())
    restored = float(np.abs(wm.numpy()[rows][:, real.numpy()] - w0).max())
    where = (
        "before it (left padding, as a batch is padded to generate from)" if left else "after it"
    )
    finding = (f"without a padding mask the tokens give {on_pads:.0%} of their weight to the "
               f"{pad} pads on average; with the mask the weights are the text's own again "
               f"(they differ by {restored:.1g}).")  # fmt: skip
    meaning = (f"batched with a text {pad} tokens longer, this one is filled out with {pad} pad "
               f"positions {where}, their Q, K and V zero vectors here. The padding mask hides "
               "them from every query, so a text's attention does not depend on what it is "
               "batched with" + ("; pads on the right would come after every token, where the "
                                 "causal mask hides them anyway." if left else "."))  # fmt: skip
    labels = [PAD] * pad + list(cols) if left else list(cols) + [PAD] * pad
    return ("padding", f"{pad} pads, no padding mask", meaning, z, w, labels, finding, rows), (
            {"weight_on_pads": round(on_pads, 4), "padding_mask_restores": round(restored, 8),
             "padded": "left" if left else "right"})  # fmt: skip


def _baseline_words(scale, d_k, causal, cross, window, bias, cap) -> str:
    unit = 1 / math.sqrt(d_k)
    words = [f"scaled by 1/sqrt({d_k}) = {unit:.4f}" if abs(scale - unit) < 1e-9
             else "not scaled" if scale == 1 else f"scaled by {scale:.4g}"]  # fmt: skip
    if bias is not None:
        words.append("plus a position bias")
    if cap:
        words.append(f"softcapped at {cap:g}")
    words.append("cross-attention over the source" if cross else
                 "causal mask" if causal else "no causal mask")  # fmt: skip
    if window:
        words.append(f"sliding window of {window}")
    return ", ".join(words)


# ---------------------------------------------------------------------------------------------
# By hand, and on a run's head
# ---------------------------------------------------------------------------------------------


def what_if_by_hand(matrices: HandMatrices, settings: Settings | None = None,
                    temperature: float = DEFAULT_TEMPERATURE, pad: int | None = None,
                    **switches) -> WhatIf:  # fmt: skip
    """``compare`` on hand-sized matrices (``attnlab.inspect.by_hand``): the baseline is the
    walk's settings (``scale``, ``causal``, ``temperature``; not its padding), ``pad`` the
    padding what-if (default: the settings' pad, else 2)."""
    s = settings or Settings(**switches)
    m = matrices
    X = torch.as_tensor(m.x)
    q, k, v = X @ torch.as_tensor(m.w_q), X @ torch.as_tensor(m.w_k), X @ torch.as_tensor(m.w_v)
    return compare(q, k, v, m.tokens, m.tokens, scale=s.factor(m.d_k), causal=s.causal,
                   temperature=temperature, pad=(s.pad or DEFAULT_PAD) if pad is None else pad,
                   heading=f"what if, by hand: {' '.join(m.tokens)}")  # fmt: skip


def what_if(rec: Recording, model, layer: int | None = None, head: int = 0,
            name: str | None = None, temperature: float = DEFAULT_TEMPERATURE,
            pad: int = DEFAULT_PAD, text: str | None = None) -> WhatIf:  # fmt: skip
    """``compare`` on one head of a recorded forward pass: its recorded Q, K and V (after any
    rotary or QK-norm), the model's own scale, masks, position bias and softcap, checked to
    reproduce the recorded weights before anything is changed."""
    info = rec.select(layer=layer, name=name)
    if not 0 <= head < info.n_heads:
        where = f"layer {info.layer}" if info.layer is not None else info.label
        raise InspectError(f"no head {head}; {where} has heads 0..{info.n_heads - 1}")
    path, c = info.module_path, rec.cache
    if f"{path}.q" not in c or f"{path}.k" not in c:
        raise InspectError(f"what-if recomputes a head from its recorded Q, K and V, and "
                           f"{info.name} records none: this {rec.about.get('kind', 'model')}'s "
                           "attention is not a dot product of queries and keys (attnlab trace "
                           "walks it)")  # fmt: skip
    attn = model.get_submodule(path)
    cross = info.kind == "cross"
    H, Hkv = c[f"{path}.q"].size(1), c[f"{path}.k"].size(1)
    kv = head // max(1, H // Hkv)  # grouped-query: the K/V head this query head reads
    q = c[f"{path}.q"][0, head].double()  # (T, d_k)
    k, v = c[f"{path}.k"][0, kv].double(), c[f"{path}.v"][0, kv].double()  # (S, d)
    d_k = q.size(-1)
    mha = attn if isinstance(attn, MultiHeadAttention) else None  # its settings, where it has them
    scale = mha.scale if mha is not None and mha.scale is not None else 1 / math.sqrt(d_k)
    prefix = path.rsplit(".", 1)[0]
    block = model.get_submodule(prefix) if prefix else model
    causal = not cross and (block.causal if isinstance(block, Block) else model.causal)
    stack_bias = f"{path.split('.')[0]}.position_bias"
    bias = c[stack_bias][0, head].double() if not cross and stack_bias in c else None
    q_lab, k_lab = rec.labels(info.name)
    where = f"layer {info.layer}" if info.layer is not None else info.label
    text = text if text is not None else " ".join(rec.tokens.get(info.query_stack, []))
    result = compare(q, k, v, q_lab, k_lab, scale=float(scale), causal=causal, cross=cross,
                     window=mha.window if mha is not None else None, bias=bias,
                     cap=mha.softcap if mha is not None else None, temperature=temperature, pad=pad,
                     heading=f"what if: {info.kind}-attention {where}, head {head}, on "
                     f"{text!r}", recorded=c[info.name][0, head].double().numpy())  # fmt: skip
    result.about = rec.about
    return result
