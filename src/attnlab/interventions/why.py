"""Why a head attends there: one attention score split into (query-side writer, key-side
writer) parts.

Head h's query input at position t is the sum of the terms its upstream writers add
(``ResidualGraph.contributions``: each writer's output as it arrives, and the constants); the
reader's norm, its scale frozen at this input (a LayerNorm also centres each term and adds its
bias as a term), maps the sum term by term, and so does the query projection (its bias a term
of its own), the QK-norm (its scale frozen at the whole query) and the rotary rotation (linear
at a fixed position). The key at position s is split the same way. Then

    score(t, s) = scale * q_t . k_s (+ position bias) = sum_{a, b} scale * q_t^a . k_s^b (+ bias)

each part what query-side term a and key-side term b give together; the parts sum to the score
the model computed (before a softcap, which then squashes the sum: Gemma 2's). A K/V head that
grouped-query attention shares gives every head of its group its key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab import hooks
from attnlab.interventions.edges import graph_of, short
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.models.graph import Parts


@dataclass
class ScoreSplit:
    head: str
    query_position: int
    key_position: int
    query_terms: list[str]
    key_terms: list[str]
    table: Tensor  # (query terms, key terms) float64
    extra: float  # the position bias (T5), 0 elsewhere
    score: float  # the model's score (before any softcap)
    error: float  # |sum of the parts + extra - score|

    def to_dict(self) -> dict:
        return {"head": self.head, "query_position": self.query_position,
                "key_position": self.key_position, "query_terms": self.query_terms,
                "key_terms": self.key_terms, "table": self.table.tolist(),
                "position_bias": self.extra, "score": self.score, "error": self.error,
                "definition": "score = sum over (query term a, key term b) of scale * q^a . k^b "
                "(+ position bias), norms frozen at this input; before any softcap"}  # fmt: skip


def _side(graph, cache, reader, attn, which: str, pos: int, b: int) -> dict[str, Tensor]:
    """{term: its part of head ``reader``'s query or key at position ``pos``} (d,)."""
    terms = graph.contributions(cache, reader)  # {name: (B, T, C), or a constant (C,)}
    shape = cache[reader.source].shape  # (B, T, C)
    parts = Parts(torch.float64)
    parts.v = {k: v.double().expand(shape)[b] for k, v in terms.items()}  # (T, C)
    if reader.norm:
        norm = graph.model.get_submodule(reader.norm)
        if not parts.freeze_norm(norm, cache[reader.source][b], f"{reader.norm}.bias"):
            raise InterventionError(f"the norm at {reader.norm} is neither a LayerNorm nor an "
                                    "RMSNorm: its scale cannot be frozen")  # fmt: skip
    parts.v = {k: v.expand(shape[1:]) for k, v in parts.v.items()}  # the norm's bias (C,) too
    proj = getattr(attn, f"{which}_proj")
    d = attn.d_k
    j = reader.head
    W = proj.weight.detach().double()[j * d : (j + 1) * d]  # (d, C)
    out = {k: v @ W.T for k, v in parts.v.items()}  # (T, d)
    if proj.bias is not None:
        out[f"{which} bias"] = (
            proj.bias.detach().double()[j * d : (j + 1) * d].expand(next(iter(out.values())).shape)
        )
    qk_norm = attn.q_norm if which == "q" else attn.k_norm
    if qk_norm is not None:
        p = Parts(torch.float64)
        p.v = out
        p.freeze_norm(qk_norm, sum(out.values()), f"{which}_norm.bias")
        out = p.v
    if attn.rotary is not None:
        out = {k: attn.rotary(v[None, None].double())[0, 0] for k, v in out.items()}
    return {k: v[pos] for k, v in out.items()}


def split_score(subject: Subject, args: tuple, head: str, query: int, key: int,
                row: int = 0) -> ScoreSplit:  # fmt: skip
    """Head ``head`` (its writer's name, e.g. ``blocks.1.attn.head0``)'s score from query
    position ``query`` to key position ``key`` on the inputs ``args`` (row ``row``), split
    (module doc)."""
    graph = graph_of(subject)
    model = subject.model
    w = graph.node(head)
    if w.kind != "head":
        raise InterventionError(f"{head} is not a head")
    attn = model.get_submodule(w.path)
    H, G = attn.n_heads, attn.n_kv_heads
    label = f"head{w.head // (H // G)}" if H == G else f"kv{w.head // (H // G)}"
    rq, rk = graph.node(f"{w.path}.head{w.head}.q"), graph.node(f"{w.path}.{label}.k")
    names = [*graph.recorded(), f"{w.path}.scores", f"{w.path}.position_bias"]
    with torch.no_grad(), hooks.record(model, names) as cache:
        subject.forward(*args)
    scores = cache[f"{w.path}.scores"]  # (B, H, T, S)
    T, S = scores.shape[-2:]
    if not (0 <= query < T and 0 <= key < S):
        raise InterventionError(f"positions: queries 0..{T - 1}, keys 0..{S - 1}")
    q = _side(graph, cache, rq, attn, "q", query, row)
    k = _side(graph, cache, rk, attn, "k", key, row)
    scale = attn.scale if attn.scale is not None else attn.d_k**-0.5
    Q, K = torch.stack(list(q.values())), torch.stack(list(k.values()))  # (A, d), (Bk, d)
    table = scale * Q @ K.T
    bias = cache.get(f"{w.path}.position_bias")
    extra = 0.0
    if bias is not None:
        extra = float(bias[row if bias.size(0) > 1 else 0, w.head, query, key])
    total = float(table.sum()) + extra
    score = float(scores[row, w.head, query, key])
    if attn.softcap is not None:  # the recording is after the cap: undo it
        score = float(attn.softcap * torch.atanh(torch.tensor(score / attn.softcap).double()))
    names_of = lambda d: [short(graph.node(n)) if _is_node(graph, n) else n for n in d]  # noqa: E731
    return ScoreSplit(short(w), query, key, names_of(q), names_of(k), table, extra, score,
                      abs(total - score))  # fmt: skip


def _is_node(graph, name: str) -> bool:
    try:
        graph.node(name)
        return True
    except KeyError:
        return False
