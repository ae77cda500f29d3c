"""Contextual influence: how far each block moves each token's representation, and who moved it.

For token i and block l, with h_before = resid_pre[i] and h_after = resid_post[i]:

    relative change  ||h_after - h_before|| / ||h_before||
    cosine           cos(h_before, h_after)
    shares           the update splits into sublayer updates, attention a = resid_mid - resid_pre,
                     (cross-attention c = resid_cross - resid_mid), feed-forward
                     f = resid_post - resid_mid|cross; share_a = ||a|| / (||a|| + ||c|| + ||f||)
    sources          contribution of key j to query i: sum over heads h of
                     weight_h[i, j] * ||W_O^h v_h[j]||, with W_O^h the columns of the output
                     projection that read head h (the size of what j actually sends to i);
                     reported as shares of row i's total.

    context          what the other tokens wrote into token i, relative to its residual stream:
                     ||sum_h W_O^h sum_{j != i} weight_h[i, j] v_h[j]  (+ cross-attention's
                     update, every part of which reads another sequence)||
                     / ||h_before + attention's update (+ cross-attention's)||
                     Token i's attention to itself and the feed-forward network are per-token
                     work, not context: they are left out, and the FFN's share is reported
                     apart. The ranking of "tokens moved most by their context" is by this.

A small change means the token kept its meaning; a large one means the block reshaped it, but
not necessarily through context: the FFN works on each token alone, and an early layer's
relative change is a ratio against a small embedding. ``context`` is the notes' "contextual
influence". With post-norm blocks the sublayer updates include the layer norm's rescaling, so
the shares describe the change of the residual stream across each sublayer.
"""

from __future__ import annotations

import csv
import io
import math
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnlab.inspect.recording import Recording
from attnlab.inspect.similarity import layer_label, no_layers
from attnlab.render.display import (
    Result,
    heatmap_html,
    matrix_table,
    rounded,
    show_token,
    table_html,
)


@dataclass
class InfluenceRow:
    layer: str  # "layer 0"
    block: int  # index into Influence.layers
    position: int
    token: str
    rel_change: float
    cosine: float
    attn_share: float
    ffn_share: float
    cross_share: float | None = None
    context: float = float("nan")  # see CONTEXT_DEFINITION
    sources: list[tuple[int, str, float]] = field(default_factory=list)  # (position, token, share)

    def to_dict(self) -> dict:
        d = {
            "layer": self.layer,
            "position": self.position,
            "token": self.token,
            "context": self.context,
            "rel_change": self.rel_change,
            "cosine": self.cosine,
            "attn_share": self.attn_share,
            "ffn_share": self.ffn_share,
        }
        if self.cross_share is not None:
            d["cross_share"] = self.cross_share
        d["sources"] = [{"position": j, "token": t, "share": s} for j, t, s in self.sources]
        return d


CONTEXT_DEFINITION = (
    "context = ||what attention brought from the other tokens (each token's attention to itself "
    "left out; cross-attention counted whole)|| / ||the residual stream plus attention's "
    "update||, at that layer; the FFN works on each token alone, so its share of the change is "
    "reported apart (ffn)"
)


@dataclass
class Influence(Result):
    rows: list[InfluenceRow]  # ranked: most moved by context first (CONTEXT_DEFINITION)
    layers: list[str]  # block labels in order
    tokens: dict[str, list[str]]  # layer label -> its tokens
    top: int = 20  # rows the terminal shows

    def matrix(self) -> np.ndarray:
        """(L, T) relative change per block and token (T of the first block's stack)."""
        T = max(len(t) for t in self.tokens.values())
        m = np.full((len(self.layers), T), np.nan)
        for r in self.rows:
            m[r.block, r.position] = r.rel_change
        return m

    def __rich__(self):
        from rich.console import Group

        from attnlab.render.tables import FitTable

        first = self.tokens[self.layers[0]]
        same = all(self.tokens[ly] == first for ly in self.layers)
        parts = []
        if same:
            from rich.text import Text

            parts.append(
                Text(
                    "relative change ||h_after - h_before|| / ||h_before|| (row = token)",
                    style="italic",
                )
            )
            parts.append(matrix_table(self.matrix().T, first, self.layers, col_tokens=False,
                                      limit=None, max_lines=len(first) * 4, row_name="tokens",
                                      col_name="layers"))  # fmt: skip
            parts.append(Text(""))
        has_cross = any(r.cross_share is not None for r in self.rows)
        table = FitTable(
            title=f"tokens moved most by their context (top {min(self.top, len(self.rows))} "
            f"of {len(self.rows)})",
            caption=CONTEXT_DEFINITION,
        )
        cols = [
            "layer",
            "pos",
            "token",
            "context",
            "rel change",
            "cos",
            "attn",
            *(["cross"] if has_cross else []),
            "ffn",
            "top sources (share)",
        ]
        for c in cols:
            table.add_column(
                c,
                justify="left" if c in ("layer", "token", "top sources (share)") else "right",
                wrap=c == "top sources (share)",
            )
        for r in self.rows[: self.top]:
            src = ", ".join(f"{show_token(t)}@{j} {s:.2f}" for j, t, s in r.sources)
            cross = (
                [f"{r.cross_share:.2f}" if r.cross_share is not None else "-"] if has_cross else []
            )
            table.add_row(
                r.layer,
                str(r.position),
                show_token(r.token),
                f"{r.context:.3f}",
                f"{r.rel_change:.3f}",
                f"{r.cosine:.3f}",
                f"{r.attn_share:.2f}",
                *cross,
                f"{r.ffn_share:.2f}",
                src,
            )
        parts.append(table)
        return Group(*parts)

    def to_dict(self) -> dict:
        return {"definition": {"context": CONTEXT_DEFINITION, "ranked_by": "context"},
                "layers": self.layers, "rows": [r.to_dict() for r in self.rows]}  # fmt: skip

    def figure(self):
        """How much its context moved each token at each layer (``context``, the ranking's
        measure), as a layer x token heatmap per stack (an encoder-decoder's encoder and
        decoder read different tokens)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from attnlab.render.plots import heatmap

        stacks: dict[tuple, list[int]] = {}  # the tokens a layer reads -> its blocks
        for b, ly in enumerate(self.layers):
            stacks.setdefault(tuple(self.tokens[ly]), []).append(b)
        T = max(len(t) for t in stacks)
        fig, axes = plt.subplots(len(stacks), 1, squeeze=False,
                                 figsize=(min(12.0, max(4.5, 0.3 * T + 2.5)),
                                          sum(0.3 * len(b) + 1.6 for b in stacks.values())))  # fmt: skip
        top = max((r.context for r in self.rows if np.isfinite(r.context)), default=1.0) or 1.0
        for ax, (tokens, blocks) in zip(axes[:, 0], stacks.items()):
            m = np.full((len(blocks), len(tokens)), np.nan)
            for r in self.rows:
                if r.block in blocks:
                    m[blocks.index(r.block), r.position] = r.context
            names = [self.layers[b] for b in blocks]
            stack = names[0].rsplit("layer", 1)[0].strip()
            heatmap(ax, m, names, list(tokens), aspect="auto", vmin=0.0, vmax=top,
                    cmap="magma", xlabel=f"{stack} token".strip(), ylabel="layer",
                    colorbar_label="context (share of the vector)", fontsize=7,
                    row_tokens=False, title=f"how far its context moved each "
                    f"{stack + ' ' if stack else ''}token")  # fmt: skip
        fig.tight_layout()
        return fig

    def save_png(self, path):
        from attnlab.render.plots import save_png

        return save_png(self.figure(), path)

    def csv_text(self) -> str:
        """The ranked rows as CSV (RFC 4180: quoted where needed, CRLF rows). Tokens are made
        visible as everywhere else (a space is ␣), and a text cell that a spreadsheet would
        read as a formula (one starting with = + - @, a tab or a CR) starts with ' instead."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\r\n")
        w.writerow(["rank", "layer", "position", "token", "context", "rel_change", "cosine",
                    "attn_share",
                    "cross_share", "ffn_share", "top_sources"])  # fmt: skip
        for k, r in enumerate(self.rows, 1):
            src = "; ".join(f"{j}:{show_token(t)}:{s:.4f}" for j, t, s in r.sources)
            cross = "" if r.cross_share is None else f"{r.cross_share:.6f}"
            w.writerow([k, spreadsheet_text(r.layer), r.position,
                        spreadsheet_text(show_token(r.token)), f"{r.context:.6f}",
                        f"{r.rel_change:.6f}",
                        f"{r.cosine:.6f}", f"{r.attn_share:.6f}", cross, f"{r.ffn_share:.6f}",
                        spreadsheet_text(src)])  # fmt: skip
        return buf.getvalue()

    def to_csv(self, path: str | Path) -> Path:
        """Write ``csv_text()`` as UTF-8 with a byte-order mark, so that a spreadsheet reads
        ␣ and other non-ASCII tokens as UTF-8 (Python reads it back with ``utf-8-sig``)."""
        from attnlab.files import atomic_write

        path = Path(path)
        text = self.csv_text()
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(text.encode("utf-8-sig")))
        return path

    def _repr_html_(self) -> str:
        """The relative-change heatmap (token x layer, when every layer reads the same tokens)
        and the ranked table of the tokens moved most, as the terminal shows them."""
        import html

        first = self.tokens[self.layers[0]]
        parts = []
        if all(self.tokens[ly] == first for ly in self.layers):
            parts.append(heatmap_html(self.matrix().T, first, self.layers,
                                      "relative change per token (row) and layer",
                                      digits=3, col_tokens=False))  # fmt: skip
        has_cross = any(r.cross_share is not None for r in self.rows)
        header = ["layer", "pos", "token", "context", "rel change", "cos", "attn",
                  *(["cross"] if has_cross else []), "ffn", "top sources (share)"]  # fmt: skip
        rows = [
            [
                r.layer,
                r.position,
                show_token(r.token),
                f"{r.context:.3f}",
                f"{r.rel_change:.3f}",
                f"{r.cosine:.3f}",
                f"{r.attn_share:.2f}",
                *(
                    [f"{r.cross_share:.2f}" if r.cross_share is not None else "-"]
                    if has_cross
                    else []
                ),
                f"{r.ffn_share:.2f}",
                ", ".join(f"{show_token(t)}@{j} {s:.2f}" for j, t, s in r.sources),
            ]  # fmt: skip
            for r in self.rows[: self.top]
        ]
        title = (f"tokens moved most by their context (top {min(self.top, len(self.rows))} "
                 f"of {len(self.rows)})")  # fmt: skip
        parts.append(table_html(header, rows, title))
        parts.append(f"<p><i>{html.escape(CONTEXT_DEFINITION)}</i></p>")
        return "\n".join(parts)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_text(text: str) -> str:
    """``text`` safe to open in a spreadsheet: one that would start a formula gets a leading '
    (OWASP's advice against CSV injection); any other text is unchanged."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def _norm(x: torch.Tensor) -> torch.Tensor:
    return x.norm(dim=-1)


@torch.no_grad()
def source_contributions(model, rec: Recording, map_name: str) -> np.ndarray:
    """(T, S): sum_h weight_h[i, j] * ||W_O^h v_h[j]||, each row normalised to sum to 1.

    Falls back to the mean attention weight over heads when the model records no values or has
    no ``out_proj`` at the map's module path.
    """
    w = rec.cache[map_name][0].double()  # (H, T, S)
    path = map_name.rsplit(".", 1)[0]
    v = rec.cache.get(path + ".v")
    try:
        out_proj = model.get_submodule(path).out_proj if model is not None else None
    except AttributeError:
        out_proj = None
    if v is None or not isinstance(out_proj, torch.nn.Linear):
        contrib = w.mean(0)  # (T, S)
    else:
        v = v[0].double()  # (n_kv, S, d_v)
        if v.size(0) != w.size(0):  # grouped-query attention: each K/V head serves a group
            v = v.repeat_interleave(w.size(0) // v.size(0), dim=0)  # (H, S, d_v)
        H, S, dv = v.shape
        # ||W_O^h v_h[j]|| = sqrt(v_h[j]^T G_h v_h[j]), G_h = W_O^h^T W_O^h: the Gram matrices
        # depend on the weights alone (kept per weight), so no (H, S, C) tensor per text
        G = _out_gram(out_proj.weight, H, dv)  # (H, d_v, d_v)
        sent = ((v @ G) * v).sum(-1).clamp_min(0.0).sqrt()  # (H, S): ||what head h carries from j||
        contrib = (w * sent[:, None, :]).sum(0)  # (T, S)
    total = contrib.sum(-1, keepdim=True)
    return (contrib / torch.where(total == 0, 1.0, total)).numpy()


_GRAMS: dict = {}  # id(weight) -> (a weak reference to it, (its version, H, d_v), the Grams)


def _out_gram(weight: torch.Tensor, H: int, dv: int) -> torch.Tensor:
    """(H, d_v, d_v) float64: W_O^h^T W_O^h for each head's columns W_O^h (C, d_v) of the output
    projection ``weight`` (C, H * d_v); computed again only when the weight changes in place."""
    key = (weight._version, H, dv)
    hit = _GRAMS.get(id(weight))
    if hit is None or hit[0]() is not weight or hit[1] != key:
        for k in [k for k, v in _GRAMS.items() if v[0]() is None]:  # weights let go of
            del _GRAMS[k]
        WO = weight.detach().double().view(-1, H, dv)  # (C, H, d_v): columns per head
        hit = (weakref.ref(weight), key, torch.einsum("chd,che->hde", WO, WO))
        _GRAMS[id(weight)] = hit
    return hit[2]


def _out_proj(model, path: str):
    try:
        out = model.get_submodule(path).out_proj if model is not None else None
    except AttributeError:
        return None
    return out if isinstance(out, torch.nn.Linear) else None


@torch.no_grad()
def context_moved(model, rec: Recording, prefix: str) -> torch.Tensor:
    """(T,): for each token, ||what attention brought from the other tokens|| / ||its residual
    stream plus attention's update|| at block ``prefix`` (CONTEXT_DEFINITION). The self-
    attention part is sum_h W_O^h sum_{j != i} weight_h[i, j] v_h[j] (no bias: it comes from no
    token); a cross-attention's whole update (less its bias) reads the other sequence. NaN where
    the block records no weights and values or has no linear output projection."""
    c = rec.cache
    w, v = c.get(prefix + "attn.weights"), c.get(prefix + "attn.v")
    out_proj = _out_proj(model, prefix + "attn")
    if w is None or v is None or out_proj is None or prefix + "attn.out" not in c:
        T = c[prefix + "resid_pre"].shape[1]
        return torch.full((T,), float("nan"), dtype=torch.float64)
    w, v = w[0].double(), v[0].double()  # (H, T, S), (H_kv, S, d_v)
    H, T, S = w.shape
    v = v.repeat_interleave(H // v.size(0), dim=0)  # (H, S, d_v): each query head's values
    others = w.clone()
    if T == S:
        others.diagonal(dim1=-2, dim2=-1).zero_()  # token i's attention to itself
    WO = out_proj.weight.detach().double()  # (C, H * d_v)
    z_other = others @ v  # (H, T, d_v): what head h brought to token i from the other tokens
    ctx = z_other.transpose(0, 1).reshape(T, -1) @ WO.T  # (T, C): sum over h of W_O^h z_h
    stream = c[prefix + "resid_pre"][0].double() + c[prefix + "attn.out"][0].double()  # (T, C)
    if prefix + "cross.out" in c:
        cross = c[prefix + "cross.out"][0].double()
        out = _out_proj(model, prefix + "cross")  # a Linear, or None where there is none
        bias = out.bias if out is not None else None
        ctx = ctx + (cross - bias.detach().double() if bias is not None else cross)
        stream = stream + cross
    return _norm(ctx) / _norm(stream).clamp_min(1e-12)


def influence(model, rec: Recording, n_sources: int = 3, top: int = 20) -> Influence:
    """Per token and block: relative change, cosine, sublayer shares and top source tokens.
    Computed once per recording (``Recording.once``): the explorer's bars and the influence
    verb read the same result."""
    return rec.once(("influence", id(model), n_sources, top),
                    lambda: _influence(model, rec, n_sources, top))  # fmt: skip


@torch.no_grad()
def _influence(model, rec: Recording, n_sources: int, top: int) -> Influence:
    prefixes = rec.blocks()
    if not prefixes:
        raise no_layers(rec, "influence")
    c = rec.cache
    rows, labels, tokens = [], [], {}
    for b, p in enumerate(prefixes):
        label = layer_label(p)
        labels.append(label)
        toks = list(rec.tokens_of(p))
        tokens[label] = toks
        before, after = c[p + "resid_pre"][0].double(), c[p + "resid_post"][0].double()  # (T, C)
        delta = after - before
        rel = _norm(delta) / _norm(before).clamp_min(1e-12)  # (T,)
        cos = torch.nn.functional.cosine_similarity(before, after, dim=-1)  # (T,)
        mid = c.get(p + "resid_mid")
        crossed = c.get(p + "resid_cross")
        if mid is not None:
            mid = mid[0].double()
            a = _norm(mid - before)  # (T,)
            last = mid
            x = None
            if crossed is not None:
                crossed = crossed[0].double()
                x = _norm(crossed - mid)
                last = crossed
            f = _norm(after - last)
            tot = (a + f + (x if x is not None else 0)).clamp_min(1e-12)
            a_share, f_share = (a / tot).tolist(), (f / tot).tolist()
            x_share = (x / tot).tolist() if x is not None else [None] * len(toks)
        else:
            a_share = f_share = [float("nan")] * len(toks)
            x_share = [None] * len(toks)
        moved = context_moved(model, rec, p).tolist()  # (T,)
        sources = [[] for _ in toks]
        if p + "attn.weights" in c:
            src = source_contributions(model, rec, p + "attn.weights")  # (T, S)
            _, key_toks = rec.labels(p + "attn.weights")
            order = np.argsort(-src, axis=-1, kind="stable")[:, :n_sources]  # (T, n): largest first
            share = np.take_along_axis(src, order, -1).tolist()
            sources = [[(j, key_toks[j], v) for j, v in zip(js, vs) if v > 0]
                       for js, vs in zip(order.tolist(), share)]  # fmt: skip
        rel, cos = rel.tolist(), cos.tolist()
        rows += [InfluenceRow(label, b, i, tok, rel[i], cos[i], a_share[i], f_share[i],
                              x_share[i], moved[i], sources[i])
                 for i, tok in enumerate(toks)]  # fmt: skip
    rows.sort(
        key=lambda r: (math.inf if math.isnan(r.context) else -r.context, r.block, r.position)
    )  # most moved first, NaN (no context measured) last
    result = Influence(rows, labels, tokens, top)
    result.about = rec.about
    return result


def influence_bars(inf: Influence) -> list[dict]:
    """Per layer: the relative change of each token (what the explorer draws as bars)."""
    out = []
    for b, label in enumerate(inf.layers):
        vals = [0.0] * len(inf.tokens[label])
        for r in inf.rows:
            if r.block == b:
                vals[r.position] = r.rel_change
        out.append({"layer": label, "tokens": inf.tokens[label], "rel_change": rounded(vals, 3)})
    return out
