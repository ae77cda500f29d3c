"""Circuits in the weights: each head's QK and OV matrices on the residual stream, and the Q-, K-
and V-composition scores between heads of different layers (Elhage et al. 2021).

For head h reading a stream through its norm with gain gamma (a LayerNorm's or RMSNorm's
weight; the centring and the 1/sigma scale are left out, as the paper folds them), the maps on
the stream (C x C) are

    QK_h = diag(gamma) W_Q^h^T W_K^h diag(gamma)     score(x_q, x_k) = x_q^T QK_h x_k / sqrt(d)
    OV_h = W_O^h W_V^h diag(gamma)                   output(x) = OV_h x

(without rotary positions: a rotary head's QK depends on the offset, and these are its weights
at offset 0; a K/V head that grouped-query attention shares serves each head of its group).
The composition of an earlier head A into a later head B is

    Q-composition  |QK_B^T OV_A|_F / (|QK_B|_F |OV_A|_F)    A's output read by B's queries
    K-composition  |QK_B OV_A|_F   / (|QK_B|_F |OV_A|_F)    A's output read by B's keys
    V-composition  |OV_B OV_A|_F   / (|OV_B|_F |OV_A|_F)    A's output read by B's values

with a baseline: the same score of random Gaussian matrices of the same shapes and ranks (the
mean over ``draws``), which any score is read against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.interventions.edges import graph_of
from attnlab.interventions.subjects import Subject


@dataclass
class HeadMaps:
    name: str  # blocks.1.attn.head0
    label: str  # 1.0
    layer: int
    qk: Tensor  # (C, C)
    ov: Tensor  # (C, C)


def _gain(model, norm: str, C: int) -> Tensor:
    if not norm:
        return torch.ones(C, dtype=torch.float64)
    m = model.get_submodule(norm)
    w = getattr(m, "weight", None)
    g = torch.ones(C, dtype=torch.float64) if w is None else w.detach().double()
    return g + float(getattr(m, "offset", 0.0))


def head_maps(subject: Subject) -> list[HeadMaps]:
    """Every self-attention head's QK and OV maps on its stream (module doc), forward order."""
    graph = graph_of(subject)
    model = subject.model
    out = []
    for w in graph.writers:
        if w.kind != "head" or w.sublayer != "attn":
            continue
        attn = model.get_submodule(w.path)
        H, G, dk, dv = attn.n_heads, attn.n_kv_heads, attn.d_k, attn.d_v
        j = w.head // (H // G)
        q_reader = graph.node(f"{w.path}.head{w.head}.q")
        C = attn.q_proj.weight.size(1)
        gamma = _gain(model, q_reader.norm, C)
        Wq = attn.q_proj.weight.detach().double()[w.head * dk : (w.head + 1) * dk]  # (dk, C)
        Wk = attn.k_proj.weight.detach().double()[j * dk : (j + 1) * dk]  # (dk, C)
        Wv = attn.v_proj.weight.detach().double()[j * dv : (j + 1) * dv]  # (dv, C)
        Wo = attn.out_proj.weight.detach().double()[:, w.head * dv : (w.head + 1) * dv]  # (C, dv)
        qk = (Wq * gamma).T @ (Wk * gamma)  # (C, C)
        ov = Wo @ (Wv * gamma)  # (C, C)
        label = w.path.split("blocks.")[-1].split(".")[0] + f".{w.head}"
        if w.stack:
            label = f"{w.stack}.{label}"
        out.append(HeadMaps(w.name, label, w.layer, qk, ov))
    return out


def _score(kind: str, a: Tensor, b_qk: Tensor, b_ov: Tensor) -> float:
    if kind == "q":
        m, n = b_qk.T @ a, b_qk
    elif kind == "k":
        m, n = b_qk @ a, b_qk
    else:
        m, n = b_ov @ a, b_ov
    return float(m.norm() / (n.norm() * a.norm()))


def baseline(C: int, d: int, kind: str, draws: int = 20, seed: int = 0) -> float:
    """The composition score of random rank-``d`` C x C Gaussian products (module doc)."""
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(draws):
        r = lambda: (
            torch.randn(C, d, generator=g, dtype=torch.float64)
            @ torch.randn(  # noqa: E731
                d, C, generator=g, dtype=torch.float64
            )
        )
        total += _score(kind, r(), r(), r())
    return total / draws


def composition_scores(subject: Subject) -> dict:
    """Q-, K- and V-composition of every earlier head into every later one of the same stream:
    {"pairs": [{"from", "to", "q", "k", "v"}], "baseline": {"q", "k", "v"}, "definition"}."""
    maps = head_maps(subject)
    pairs = []
    for a in maps:
        for b in maps:
            if b.layer <= a.layer or a.name.split("blocks.")[0] != b.name.split("blocks.")[0]:
                continue
            pairs.append({"from": a.label, "to": b.label,
                          **{k: _score(k, a.ov, b.qk, b.ov) for k in "qkv"}})  # fmt: skip
    attn = subject.model.get_submodule(maps[0].name.rsplit(".", 1)[0]) if maps else None
    C = maps[0].qk.size(0) if maps else 0
    base = {k: baseline(C, attn.d_k, k) for k in "qkv"} if maps else {}
    return {"pairs": pairs, "baseline": base, "definition": __doc__.split("The composition")[1]
            .split("with a baseline")[0].strip()}  # fmt: skip
