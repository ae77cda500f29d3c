"""Attention sinks: how much of each head's attention lands on the first token (Gu et al. 2025,
"When Attention Sink Emerges in Language Models"), and what a language model's perplexity
does past its trained block under each window policy (Xiao et al. 2023, StreamingLLM).

    first_token_share(model, x)        alpha_1 of every head, (L, H)
    sink_ratio(shares, eps)            Sink_1^eps: the share of heads with alpha_1 > eps
    window_nll(model, ids, window)     per-token loss, every token fed through a window policy
    full_nll(model, ids)               per-token loss with full attention over the whole text

The metric, as Gu et al. define it: for head h of layer l on a sequence of T tokens,
alpha_1 = (1 / T) sum over queries i = 1 .. T of A[i, 1], the attention of query i on the first
token (the first query included, which sees only itself), averaged over the sequences; a head
is a sink head when alpha_1 > eps, eps = 0.3, and Sink_1^eps is the share of the model's heads
that are. Where a head's weights need not sum to one (softmax1, sigmoid attention) each row is
first divided by its sum, the proxy attention Gu et al. use for those operations, so that
alpha_1 is always a share of what the row attends to.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

SINK_EPS = 0.3  # Gu et al.'s threshold on alpha_1
SINK_TOKENS = 64  # Gu et al. measure on sequences of T = 64 tokens


@torch.no_grad()
def first_token_share(model, x: Tensor) -> Tensor:
    """alpha_1 of every self-attention head of a causal model on token ids x (B, T): (L, H)
    float64, L the model's self-attention maps in order (see the module docstring)."""
    from attnlab import hooks
    from attnlab.modes import evaluating

    names = [n for n in hooks.hook_points(model) if n.endswith("attn.weights")]
    with evaluating(model), hooks.record(model, names=names) as cache:
        model(x)
    rows = []
    for n in names:
        w = cache[n].double()  # (B, H, T, T)
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-300)  # the proxy: each row a share
        rows.append(w[:, :, :, 0].mean(dim=(0, 2)))  # (H,) over sequences and queries
    return torch.stack(rows)


def sink_ratio(shares: Tensor, eps: float = SINK_EPS) -> float:
    """Sink_1^eps: the share of heads whose alpha_1 is above ``eps``."""
    return float((shares > eps).double().mean())


@torch.no_grad()
def window_nll(model, ids: Tensor, window: str) -> Tensor:
    """The loss (nats) of every token of ``ids`` (B, N) after the first, each predicted from the
    tokens before it as the decoder reads them through ``window`` (``attnlab.generation``'s
    window policies: slide, shift, ring, sinks[:K]), one token fed at a time: (B, N - 1)."""
    from attnlab.decoding import decoder_for
    from attnlab.modes import evaluating

    B, N = ids.shape
    dec = decoder_for(model)
    with evaluating(model):
        state = dec.start(ids[:, :1], N, window=window)
        out = []
        logp = dec.step(state, ids[:, 0])  # (B, V) the second token's distribution
        for t in range(1, N):
            out.append(-logp.gather(-1, ids[:, t : t + 1])[:, 0])
            if t < N - 1:
                logp = dec.step(state, ids[:, t])
    return torch.stack(out, 1)


@torch.no_grad()
def full_nll(model, ids: Tensor) -> Tensor:
    """The loss of every token of ``ids`` (B, N) after the first with full attention over all
    of it, N past the block allowed: the same weights in a GPT whose block (and rotary table) is
    N long: (B, N - 1). A model with learned positions has none past its block (ValueError)."""
    from attnlab.models.gpt import GPT
    from attnlab.modes import evaluating

    c = model.config
    if ids.size(1) > c.block_size and c.pos == "learned":
        raise ValueError("learned positions end at the block: full attention past it needs "
                         "rotary or sinusoidal positions")  # fmt: skip
    long = GPT(dataclasses.replace(c, block_size=max(ids.size(1), c.block_size)))
    long.load_state_dict(model.state_dict())
    with evaluating(long):
        logp = F.log_softmax(long(ids).float(), -1)  # (B, N, V)
    return -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
