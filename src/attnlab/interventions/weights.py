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
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.models.graph import LowRank, composition, head_factors, norm_gain


@dataclass
class HeadMaps:
    name: str  # blocks.1.attn.head0
    label: str  # 1.0
    layer: int
    qk_factors: LowRank  # QK = left @ right, rank <= d_k
    ov_factors: LowRank  # OV, rank <= d_v

    @property
    def qk(self) -> Tensor:  # (C, C)
        return self.qk_factors.full()

    @property
    def ov(self) -> Tensor:  # (C, C)
        return self.ov_factors.full()


def _gain(model, norm: str, C: int) -> Tensor:
    return norm_gain(model.get_submodule(norm) if norm else None, C)


def head_maps(subject: Subject) -> list[HeadMaps]:
    """Every self-attention head's QK and OV maps on its stream (module doc), forward order."""
    graph = graph_of(subject)
    model = subject.model
    out = []
    for w in graph.writers:
        if w.kind != "head" or w.sublayer != "attn":
            continue
        attn = model.get_submodule(w.path)
        q_reader = graph.node(f"{w.path}.head{w.head}.q")
        gamma = _gain(model, q_reader.norm, attn.q_proj.weight.size(1))
        qk, ov = head_factors(attn, w.head, gamma)
        label = w.path.split("blocks.")[-1].split(".")[0] + f".{w.head}"
        if w.stack:
            label = f"{w.stack}.{label}"
        out.append(HeadMaps(w.name, label, w.layer, qk, ov))
    return out


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
                          **{k: composition(k, a.ov_factors, b.qk_factors, b.ov_factors)
                             for k in "qkv"}})  # fmt: skip
    attn = subject.model.get_submodule(maps[0].name.rsplit(".", 1)[0]) if maps else None
    C = maps[0].qk_factors.left.size(0) if maps else 0
    base = {k: baseline(C, attn.d_k, k) for k in "qkv"} if maps else {}
    return {"pairs": pairs, "baseline": base, "definition": __doc__.split("The composition")[1]
            .split("with a baseline")[0].strip()}  # fmt: skip


def baseline(C: int, d: int, kind: str, draws: int = 20, seed: int = 0) -> float:
    """The composition score of random rank-``d`` C x C Gaussian products (module doc)."""
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(draws):
        r = lambda: LowRank(  # noqa: E731
            torch.randn(C, d, generator=g, dtype=torch.float64),
            torch.randn(d, C, generator=g, dtype=torch.float64),
        )
        total += composition(kind, r(), r(), r())
    return total / draws


TOKEN_TABLE_MAX = 256  # vocabularies up to this size get the token x token tables


def head_circuits(subject: Subject, head: str, top: int = 5) -> dict:
    """Head ``head`` (its writer's name)'s QK and OV circuits read through the embeddings:
    with E the token embeddings (V, C) (positions left out) and U the unembedding (V, C),

        QK tokens  E QK E^T (V, V): how much a query token attends to a key token
        OV tokens  E OV^T U^T (V, V): the logits a source token, attended to, writes

    (tables only for a vocabulary of at most ``TOKEN_TABLE_MAX``), the singular values of QK
    and OV (their rank is the head width), and each top singular direction read as the
    ``top`` tokens whose embedding (the input side) or unembedding (OV's output side) is most
    aligned with it. Plain data."""
    maps = {m.name: m for m in head_maps(subject)}
    if head not in maps:
        raise KeyError(f"no self-attention head {head!r}")
    m = maps[head]
    model = subject.model
    if model.reads != "text" or model.predicts != "next-token" or len(model.stacks) != 1:
        raise InterventionError("a head's token x token circuits read a GPT's embeddings and "
                                "unembedding; composition_scores works on every kind")  # fmt: skip
    E = model.tok_embed.weight.detach().double()  # (V, C)
    U = model.lm_head.weight.detach().double()  # (V, C)
    names = [subject.decode(i) for i in range(E.size(0))]

    def read(vec: Tensor, M: Tensor) -> list[str]:
        return [names[i] for i in (M @ vec).topk(min(top, M.size(0))).indices.tolist()]

    out = {"head": m.label, "definition": head_circuits.__doc__.split("Plain data")[0].strip()}
    for kind, M in (("qk", m.qk), ("ov", m.ov)):
        Uu, sv, Vh = torch.linalg.svd(M)
        k = int((sv > sv[0] * 1e-9).sum())
        out[f"{kind}_singular_values"] = [round(float(x), 6) for x in sv[:k]]
        dirs = []
        for i in range(min(3, k)):
            left = read(Uu[:, i], U if kind == "ov" else E)
            dirs.append({"singular_value": float(sv[i]), "output_side" if kind == "ov"
                         else "query_side": left, "input_side" if kind == "ov"
                         else "key_side": read(Vh[i], E)})  # fmt: skip
        out[f"{kind}_directions"] = dirs
    if E.size(0) <= TOKEN_TABLE_MAX:
        out["tokens"] = names
        out["qk_tokens"] = (E @ m.qk @ E.T).tolist()
        out["ov_tokens"] = (E @ m.ov.T @ U.T).tolist()
    return out
