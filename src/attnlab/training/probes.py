"""Head scores on probe inputs: what each attention head does, as scores in [0, 1] (the head
taxonomy of Elhage et al. 2021 and Olsson et al. 2022), and the probes a model is run on to
measure them. Training snapshots (``attnlab.training.snapshots``) take them every few steps;
``attnlab heads`` and ``attnlab timeline`` (``attnlab.inspect.heads``) report them.

A score is the mean attention a head puts on the key position(s) that define it, over the query
rows where those positions exist. For a map A (B, H, T, T) over token ids x (B, T):

    previous-token   A[t, t-1]                                  rows t >= 1
    duplicate-token  sum of A[t, j] over j < t with x[j] = x[t]  rows with an earlier duplicate
    induction        sum of A[t, j] over j < t with x[j-1] = x[t]: the token AFTER an earlier
                     occurrence of the current token (the one an induction head copies)
    first-token      A[t, 0]: the first position as an attention sink       rows t >= 1
    self             A[t, t]                                    rows t >= 1 (causal), all (not)
    entropy          H(A[t, :]) / ln(keys t can see): 0 = one key, 1 = uniform over them

(Row 0 of a causal map sees only key 0 and is left out of every score but none of these needs
it.) Duplicate-token and induction need token ids; on images they are None.

The probes: ``repeated_tokens`` draws random token sequences r (no token twice, where the
vocabulary allows) and feeds r r (each repeated once), where a previous-token head, a
duplicate-token head and an induction head each have one right answer at every position of
the second half; a held-out sample of the run's own data shows what the heads do on real
input. A head is named after the score that is furthest over its threshold (``THRESHOLDS``),
on the repeated tokens.

It lives below ``attnlab.inspect`` because training takes these measures (a Trainer callback
may import only what is below the training loop).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab import hooks
from attnlab.metrics import half_losses
from attnlab.models.declare import max_positions
from attnlab.modes import evaluating

SCORES = ("previous-token", "duplicate-token", "induction", "first-token", "self", "entropy")
# a head is named after a score at or over its threshold (the one furthest over it)
THRESHOLDS = {"induction": 0.4, "previous-token": 0.4, "duplicate-token": 0.4,
              "first-token": 0.5, "self": 0.5}  # fmt: skip
KIND_NAMES = {"induction": "induction", "previous-token": "previous-token",
              "duplicate-token": "duplicate-token", "first-token": "sink", "self": "self"}  # fmt: skip
PROBE_HALF = 24  # tokens in each half of a repeated probe (at most; block_size / 2 if smaller)
SELF_MAPS = "attn.weights"  # self-attention maps end in this (see attnlab.inspect.recording)


# ---------------------------------------------------------------------------------------------
# Scores of one attention map
# ---------------------------------------------------------------------------------------------


def _masked_mean(per_row: Tensor, rows: Tensor) -> Tensor:
    """Mean over batch and query rows where ``rows`` (B, T) holds: (B, H, T) -> (H,).
    A head with no such row scores NaN (the caller turns it into None)."""
    w = rows.to(per_row.dtype)[:, None, :]  # (B, 1, T)
    n = w.sum()
    if n == 0:
        return torch.full(per_row.shape[1:2], float("nan"))
    return (per_row * w).sum(dim=(0, 2)) / n


def head_scores(weights: Tensor, ids: Tensor | None = None, causal: bool = True) -> dict:
    """Every score of every head of one self-attention map.

    weights (B, H, T, T): each query row a distribution over the keys it may see. ids (B, T):
    the token ids (None: images, patches; duplicate-token and induction are then None).
    Returns {score name: a (H,) float tensor, or None where the score is not defined}.
    """
    B, H, T, S = weights.shape
    if T != S:
        raise ValueError(f"head scores need a self-attention map (T == S), got {T} x {S}")
    w = weights.float()
    t = torch.arange(T)
    rows = torch.ones(B, T, dtype=torch.bool)
    if causal:
        rows[:, 0] = False  # query 0 sees only key 0: it says nothing about a head
    after_first = rows.clone()
    after_first[:, 0] = False
    out: dict[str, Tensor | None] = {}
    prev = torch.zeros(B, H, T)
    prev[:, :, 1:] = w[:, :, t[1:], t[1:] - 1]  # (B, H, T-1) A[t, t-1]
    out["previous-token"] = _masked_mean(prev, after_first)
    if ids is None:
        out["duplicate-token"] = out["induction"] = None
    else:
        ids = ids.to(w.device)
        earlier = t[None, :] < t[:, None]  # (T, S) key j before query t
        same = ids[:, :, None] == ids[:, None, :]  # (B, T, S) x[t] == x[j]
        dup = same & earlier  # (B, T, S)
        out["duplicate-token"] = _masked_mean((w * dup[:, None]).sum(-1), dup.any(-1))
        # key j is induction's target for query t when x[j-1] == x[t] and j - 1 < t, j != t
        ind = torch.zeros_like(dup)
        ind[:, :, 1:] = same[:, :, :-1] & earlier[None, :, :-1]  # (B, T, S) shifted one key on
        ind &= t[None, :, None] != t[None, None, :]  # not the query itself
        out["induction"] = _masked_mean((w * ind[:, None]).sum(-1), ind.any(-1))
    out["first-token"] = _masked_mean(w[:, :, :, 0], after_first)
    out["self"] = _masked_mean(w[:, :, t, t], rows)
    visible = (t + 1).float() if causal else torch.full((T,), float(S))  # (T,) keys each row sees
    ent = -(w * torch.log(w.clamp_min(1e-12))).sum(-1)  # (B, H, T) nats
    norm = torch.where(visible > 1, ent / torch.log(visible.clamp_min(2.0)), torch.zeros_like(ent))
    out["entropy"] = _masked_mean(norm, (visible > 1)[None, :].expand(B, T))
    return out


def kind_of(scores: dict[str, float | None]) -> str | None:
    """The name of a head: the score furthest over its threshold, or None."""
    best, best_ratio = None, 1.0
    for name, threshold in THRESHOLDS.items():
        v = scores.get(name)
        if v is not None and v >= threshold and v / threshold >= best_ratio:
            best, best_ratio = KIND_NAMES[name], v / threshold
    return best


# ---------------------------------------------------------------------------------------------
# Probes: what a model is run on to score its heads
# ---------------------------------------------------------------------------------------------


def repeated_tokens(model: nn.Module, n: int = 16, seed: int = 0, half: int | None = None):
    """``n`` random sequences r r: (n, 2 * half) token ids from the model's vocabulary (its
    pad id left out), the tokens of r all different when the vocabulary is large enough, so
    that every position of the second half has one previous token, one earlier duplicate and
    one token after it; None for a model that reads no token ids. They are drawn from the ids
    its probe forward reads (``ModelKind.probe_vocab_size``: an encoder-decoder's probe is its
    decoder's input)."""
    V = model.probe_vocab_size
    if V is None or V < 2:
        return None
    limit = max_positions(model) or 2 * PROBE_HALF
    half = min(half or PROBE_HALF, limit // 2)
    if half < 2:
        return None
    g = torch.Generator().manual_seed(seed)
    pad = model.pad_id
    ids = torch.tensor([i for i in range(V) if i != pad])  # (V',) the tokens a probe may hold
    if half <= len(ids):  # each row: a random arrangement of the vocabulary, cut to half
        r = ids[torch.rand(n, len(ids), generator=g).argsort(dim=1)[:, :half]]
    else:
        r = ids[torch.randint(0, len(ids), (n, half), generator=g)]
    return torch.cat([r, r], dim=1)  # (n, 2 * half)


def self_attention_maps(cache: dict, T: int) -> list[str]:
    """Names of the self-attention maps over the probe's own T positions, in recording order."""
    return [k for k, v in cache.items() if k.endswith(SELF_MAPS) and v.dim() == 4
            and v.size(-1) == T and v.size(-2) == T]  # fmt: skip


@dataclass
class ProbeResult:
    """One probe through a model: its self-attention maps, their scores, and (for a language
    model on repeated tokens) the loss on each half."""

    maps: dict[str, Tensor]  # map name -> weights (B, H, T, T)
    scores: dict[str, dict[str, Tensor | None]]  # map name -> score name -> (H,)
    loss_first_half: float | None = None
    loss_repeated_half: float | None = None


@torch.no_grad()
def run_probe(model: nn.Module, x: Tensor, ids: bool = True, repeated: bool = False) -> ProbeResult:
    """Record ``model``'s attention on ``x`` (token ids (B, T) or images) and score every
    self-attention head. ``ids``: x holds token ids. ``repeated``: x is r r, so that the
    next-token loss of each half is measured (causal models whose output is (B, T, V))."""
    points = hooks.hook_points(model)
    names = [n for n in points if n.endswith(SELF_MAPS)]
    with evaluating(model), hooks.record(model, names=names) as cache:
        out = model.probe_forward(x)
    T = x.size(1) if ids else None
    if T is None:  # images: every square map is over the patches
        maps = {k: v for k, v in cache.items() if v.dim() == 4 and v.size(-1) == v.size(-2)}
    else:
        maps = {k: cache[k] for k in self_attention_maps(cache, T)}
    causal = model.causal
    scores = {k: head_scores(v, x if ids else None, causal) for k, v in maps.items()}
    result = ProbeResult(maps, scores)
    if repeated and ids and causal and out.dim() == 3 and out.size(1) == T:
        result.loss_first_half, result.loss_repeated_half = half_losses(out, x)
    return result
