"""Scaled dot-product attention, masks, multi-head attention and the KV cache.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Shapes: B batch, H heads, T query length, S key length, D head width.
One mask convention everywhere: a boolean tensor, True = "may attend", broadcastable to
(B, H, T, S), exactly as ``torch.nn.functional.scaled_dot_product_attention``.
A query row with nothing to attend to gives a zero output and zero weights, never NaN.

The families' variations are options of the same pieces, not new kinds of attention: fewer
K/V heads than query heads (grouped-query), another scale, a softcap on the scores, a sliding
window, an additive position bias (T5), a norm on q and k (``MultiHeadAttention`` says which).

Each head's query, key and value inputs can also be its own (``per_head_inputs``): the same
numbers while nothing edits them, but an edit of one head's query input (a circuit's edge into
that reader) changes that head's queries alone.

How scores become weights (``WEIGHTINGS``, the ``weighting`` of ``reference_attention`` and of
``MultiHeadAttention``), for a query row s_1 .. s_S of scores over the keys it may see:
    softmax    w_j = exp(s_j) / sum_k exp(s_k)          every row sums to 1
    softmax1   w_j = exp(s_j) / (1 + sum_k exp(s_k))    softmax with one more logit fixed at 0,
               a key that is always there and whose value is zero ("attend to nothing"): a row
               sums to less than 1 (Miller 2023, "softmax off by one")
    sigmoid    w_j = sigmoid(s_j)                       each key on its own, no normalisation:
               a row sums to anything in (0, S) (the sigmoid attention without normalisation of
               Gu et al. 2025, "When Attention Sink Emerges")
Only softmax must put a row's whole weight somewhere; the other two can attend to nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.hooks import Hook
from attnlab.norms import make_norm

# ---------------------------------------------------------------------------------------------
# Masks (True = may attend)
# ---------------------------------------------------------------------------------------------


def causal_mask(T: int, S: int | None = None, device=None) -> Tensor:
    """(T, S) mask where query t sees keys 0 .. t + (S - T): aligned bottom-right.

    With T == S this is the usual lower triangle. With T < S (decoding after a KV cache holds
    S - T earlier tokens) the last query sees every key, as it should.
    """
    S = T if S is None else S
    q_pos = torch.arange(T, device=device).unsqueeze(1) + (S - T)  # (T, 1) absolute positions
    k_pos = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    return k_pos <= q_pos  # (T, S)


def sliding_window_mask(T: int, S: int, window: int, device=None) -> Tensor:
    """(T, S) mask where query t (at absolute position t + S - T) sees only keys less than
    ``window`` positions before it: itself and the window - 1 before (with ``causal_mask``: the
    last ``window`` positions, Mistral's and Gemma's sliding window)."""
    q_pos = torch.arange(T, device=device).unsqueeze(1) + (S - T)  # (T, 1) absolute positions
    k_pos = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    return k_pos > q_pos - window  # (T, S)


def padding_mask(
    lengths: Tensor | None = None,
    ids: Tensor | None = None,
    pad_id: int | None = None,
    S: int | None = None,
) -> Tensor:
    """(B, 1, 1, S) key mask from sequence lengths, or from token ids and a pad id."""
    if ids is not None:
        if pad_id is None:
            raise ValueError("padding_mask from ids needs pad_id")
        return (ids != pad_id)[:, None, None, :]
    if lengths is None:
        raise ValueError("padding_mask needs lengths or ids")
    lengths = torch.as_tensor(lengths)
    S = int(lengths.max()) if S is None else S
    keep = torch.arange(S, device=lengths.device)[None, :] < lengths[:, None]  # (B, S)
    return keep[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of every mask given (None = no constraint); broadcasting as usual."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else (out & m)
    return out


def from_hf_attention_mask(attention_mask: Tensor) -> Tensor:
    """Hugging Face (B, S) attention_mask, 1 = keep, to our (B, 1, 1, S) boolean mask."""
    return attention_mask.to(torch.bool)[:, None, None, :]


def from_torch_mha_mask(mask: Tensor) -> Tensor:
    """``nn.MultiheadAttention`` mask (bool True = blocked, or additive float) to ours.

    Works for both ``attn_mask`` (T, S) and ``key_padding_mask`` (B, S); a key padding mask is
    returned as (B, 1, 1, S) so it broadcasts over heads and queries.
    """
    keep = ~mask if mask.dtype == torch.bool else ~torch.isneginf(mask)
    return keep


def from_torch_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """``nn.MultiheadAttention`` key_padding_mask (B, S), True = pad, to (B, 1, 1, S)."""
    return from_torch_mha_mask(key_padding_mask)[:, None, None, :]


def _as_bool_mask(mask: Tensor | None) -> Tensor | None:
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"attention masks are boolean (True = may attend), got {mask.dtype}")
    return mask


# ---------------------------------------------------------------------------------------------
# Scaled dot-product attention
# ---------------------------------------------------------------------------------------------


def softcap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap): x unchanged near 0, squashed smoothly into (-cap, cap).

    Gemma 2 caps its attention scores (cap 50, before the mask) and its final logits (30)."""
    return cap * torch.tanh(x / cap)


def softmax_weights(scores: Tensor) -> Tensor:
    """w_j = exp(s_j) / sum_k exp(s_k) over the last dim (the keys): every row sums to 1."""
    return torch.softmax(scores, dim=-1)


def softmax1_weights(scores: Tensor) -> Tensor:
    """w_j = exp(s_j) / (1 + sum_k exp(s_k)): softmax over the keys and one extra logit fixed
    at 0 (a key whose score is always 0 and whose value is zero), so a row sums to less than 1
    and can give almost nothing to every key. Computed stably: m = max(0, max_k s_k) is taken
    out of every exponential, the zero logit's included."""
    m = scores.amax(dim=-1, keepdim=True).clamp_min(0.0)  # (..., T, 1)
    e = torch.exp(scores - m)  # (..., T, S)
    return e / (torch.exp(-m) + e.sum(dim=-1, keepdim=True))


def sigmoid_weights(scores: Tensor) -> Tensor:
    """w_j = sigmoid(s_j) = 1 / (1 + exp(-s_j)), each key on its own: no normalisation over the
    keys, so a row's weights sum to anything between 0 and the number of keys."""
    return torch.sigmoid(scores)


WEIGHTINGS = {"softmax": softmax_weights, "softmax1": softmax1_weights,
              "sigmoid": sigmoid_weights}  # fmt: skip  # how scores become weights


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    cap: float | None = None,
    weighting: str = "softmax",
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention written one step per line. Returns (output, weights, scores).

    scores = Q K^T * scale (+ bias) (then cap * tanh(scores / cap)); weights = softmax over the
    keys of the scores the mask allows; output = weights V. ``scale`` defaults to 1/sqrt(d_k);
    ``bias`` (broadcastable to (..., T, S)) is an additive position bias (T5's); ``cap`` a
    softcap (Gemma 2's); ``weighting`` another function from scores to weights (``WEIGHTINGS``:
    softmax1, sigmoid), whose rows need not sum to 1. The scores returned are the weighting's
    input BEFORE the mask (what the mask then hides is still visible to inspection). Masked
    scores are filled with the dtype's most negative finite number rather than -inf, and masked
    weights are zeroed after the weighting, so an empty row gives zeros, never NaN.
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1)  # (..., T, S) raw similarities Q K^T
    scores = scores * scale  # divide by sqrt(d_k) so the softmax does not saturate
    if bias is not None:
        scores = scores + bias  # a learned bias per relative position (T5)
    if cap is not None:
        scores = softcap(scores, cap)  # squash into (-cap, cap) (Gemma 2)
    masked = scores
    if mask is not None:
        # hide what is not allowed (the most negative finite number, so no row is all -inf)
        masked = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = WEIGHTINGS[weighting](masked)  # (..., T, S) softmax: each row sums to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # hidden keys weigh 0, an empty row is zeros
    attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = attn @ v  # (..., T, d_v) weighted sum of the values
    return out, weights, scores


def _fused_attention(q, k, v, mask, scale, dropout_p, bias=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` with our conventions: a boolean ``mask`` (and an
    additive ``bias``), and an empty row gives zeros. ``enable_gqa``: k, v have fewer heads."""
    sdpa = lambda m: F.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=m, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa
    )
    if bias is not None:  # an additive float mask: the bias, and the dtype's minimum where hidden
        if mask is None:
            return sdpa(bias)
        out = sdpa(torch.where(mask, bias, torch.finfo(q.dtype).min))  # (B|1, H, T, S) mask
        return out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # an empty row: zeros
    if mask is None:
        return sdpa(None)
    # The fused kernels return NaN for a row with nothing to attend to: open those rows, then
    # zero their output, so both paths agree (and the gradient through them is zero).
    empty = ~mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    if bool(empty.any()):
        return sdpa(mask | empty).masked_fill(empty, 0.0)
    return sdpa(mask)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
    enable_gqa: bool = False,
):
    """softmax(Q K^T / sqrt(d_k)) V on (..., T, d_k), (..., S, d_k), (..., S, d_v).

    Returns the output (..., T, d_v), or ``(output, weights)`` with weights (..., T, S) when
    ``return_weights``. ``causal`` adds a bottom-right aligned causal mask. Without
    ``return_weights`` the fused ``torch`` kernel is used; with it, the step-by-step reference.
    ``enable_gqa``: k and v have H / g heads, each read by g query heads in turn (fused only).
    """
    mask = _as_bool_mask(mask)
    T, S = q.size(-2), k.size(-2)
    if return_weights:
        cm = causal_mask(T, S, device=q.device) if causal else None
        out, weights, _ = reference_attention(q, k, v, combine_masks(mask, cm), scale, dropout_p)
        return out, weights
    if causal and T == 1:
        causal = False  # one query aligned bottom-right is the last position: it sees every key
    if causal and mask is None and T == S:
        # torch's is_causal is top-left aligned: identical to ours only when T == S.
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa
        )
    if causal:
        mask = combine_masks(mask, causal_mask(T, S, device=q.device))
    return _fused_attention(q, k, v, mask, scale, dropout_p, enable_gqa=enable_gqa)


# ---------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------


class KVCache:
    """Preallocated keys and values of one attention layer, for incremental decoding.

    ``append(k, v)`` writes the new step(s) after what is held and returns views of everything
    held so far, (B, H, length, D). Nothing is concatenated: the buffers are made once.
    """

    def __init__(
        self, batch: int, max_len: int, n_heads: int, d_k: int, d_v: int, *, dtype=None, device=None
    ):
        self.k = torch.zeros(batch, n_heads, max_len, d_k, dtype=dtype, device=device)
        self.v = torch.zeros(batch, n_heads, max_len, d_v, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        n = k.size(2)
        if self.length + n > self.max_len:
            raise ValueError(
                f"KV cache full: holds {self.length}, adding {n}, room for {self.max_len}"
            )
        self.k.narrow(2, self.length, n).copy_(k)
        self.v.narrow(2, self.length, n).copy_(v)
        self.length += n
        return self.k.narrow(2, 0, self.length), self.v.narrow(2, 0, self.length)

    def clear(self) -> None:
        """Forget every position (the buffers are kept and overwritten by the next append)."""
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)


class RingKVCache(KVCache):
    """A KVCache whose ``max_len`` slots are reused as a ring: once every slot is filled, the
    next key and value overwrite the oldest, so the cache holds the last ``max_len`` positions.

    ``length`` is the position the next key is written at (what rotary positions rotate it
    by), and ``held`` counts the filled slots. Once the ring has wrapped, its slots are no
    longer in position order and it takes one position per ``append``: a single query
    attends to every key it holds without a mask, and such attention does not depend on the
    order of the keys. ``rebase(n, shift)`` moves every position down by ``n`` (the caller
    re-rotates the held keys with ``shift``), so positions stay inside a rotary table.
    """

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.written = 0  # positions ever appended; the next one goes to slot written % max_len

    @property
    def held(self) -> int:
        return min(self.written, self.max_len)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        n = k.size(2)
        if self.written + n <= self.max_len:  # still filling: slots in position order
            slot = self.written
        elif n == 1:
            slot = self.written % self.max_len
        else:
            raise ValueError("a full ring cache takes one position at a time")
        self.k.narrow(2, slot, n).copy_(k)
        self.v.narrow(2, slot, n).copy_(v)
        self.written += n
        self.length += n
        return self.k.narrow(2, 0, self.held), self.v.narrow(2, 0, self.held)

    def clear(self) -> None:
        self.length = self.written = 0

    def rebase(self, n: int, shift) -> None:
        """Every held key was rotated at position p; make it p - n: ``k = shift(k, n)``."""
        self.k[:, :, : self.held] = shift(self.k[:, :, : self.held], n)
        self.length -= n


class SinkKVCache(RingKVCache):
    """StreamingLLM's cache (Xiao et al. 2023): the keys and values of the first ``sinks``
    positions (the "attention sinks") kept for good in slots 0 .. sinks - 1, beside a ring of
    the last w = ``max_len`` - sinks positions in the other slots.

    Positions are the ones the cache gives, not the text's (StreamingLLM's choice, so that no
    distance exceeds what the model was trained on): while it fills, every key sits at its own
    position; once the ring has wrapped, the window keeps its true distances to the query and
    the sinks sit just before the oldest window position, so a query sees sink i at distance
    ``max_len - 1 - i`` whatever the length. With rotary keys (rotated when written) that means
    turning the sinks' keys, written at positions 0 .. sinks - 1, down by ``max_len -
    length`` before each read: ``shift`` (the rotary module's) does it. ``rebase`` moves the
    ring's positions only; the sinks are placed from their first rotation at every append.
    """

    def __init__(self, batch: int, max_len: int, n_heads: int, d_k: int, d_v: int, *,
                 sinks: int, shift, dtype=None, device=None):  # fmt: skip
        if not 1 <= sinks < max_len:
            raise ValueError(f"a sink cache of {max_len} slots keeps 1 to {max_len - 1} sinks, "
                             f"got {sinks}")  # fmt: skip
        super().__init__(batch, max_len, n_heads, d_k, d_v, dtype=dtype, device=device)
        self.sinks, self.shift = sinks, shift
        self.sink_k: Tensor | None = None  # the sinks' keys as written, positions 0 .. sinks - 1

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        n, m = k.size(2), self.sinks
        if self.written + n <= self.max_len:  # still filling: slots in position order
            slot = self.written
        elif n == 1:  # the ring after the sinks: the oldest window slot
            slot = m + (self.written - m) % (self.max_len - m)
        else:
            raise ValueError("a full sink cache takes one position at a time")
        self.k.narrow(2, slot, n).copy_(k)
        self.v.narrow(2, slot, n).copy_(v)
        self.written += n
        self.length += n
        if self.sink_k is None and self.written >= m:
            self.sink_k = self.k[:, :, :m].clone()  # (B, n_kv, sinks, D)
        if self.written > self.max_len:  # wrapped: the sinks just before the oldest window key
            self.k[:, :, :m] = self.shift(self.sink_k, self.max_len - self.length)
        return self.k.narrow(2, 0, self.held), self.v.narrow(2, 0, self.held)

    def clear(self) -> None:
        super().clear()
        self.sink_k = None

    def rebase(self, n: int, shift) -> None:
        """Every window key was rotated at position p; make it p - n (the sinks are placed
        anew at the next append)."""
        m = self.sinks
        self.k[:, :, m : self.held] = shift(self.k[:, :, m : self.held], n)
        self.length -= n

    def reorder(self, index: Tensor) -> None:
        super().reorder(index)
        if self.sink_k is not None:
            self.sink_k = self.sink_k.index_select(0, index)


class StaticKV:
    """Keys and values computed once and reused (cross-attention over an encoder's output)."""

    def __init__(self):
        self.k = self.v = None

    def reorder(self, index: Tensor) -> None:
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


# ---------------------------------------------------------------------------------------------
# Multi-head attention
# ---------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Several attention heads side by side, concatenated, then an output projection.

    Q = x W_Q, K = kv W_K, V = kv W_V, split into H heads of width d_k (d_v for values);
    each head attends independently; heads are concatenated (H * d_v) and projected by W_O
    back to d_model. Self-attention when ``kv`` is None, cross-attention otherwise.

    Options (each default keeps plain multi-head attention):
    - ``n_kv_heads``: grouped-query (1 < n_kv < H) or multi-query (n_kv = 1) attention: K and V
      have n_kv heads, and query head h reads K/V head h // (H / n_kv) (Llama 3, Qwen, Gemma).
    - ``qkv_bias`` / ``out_bias``: the biases of the q/k/v and output projections, where they
      differ from ``bias`` (Qwen2: q/k/v only).
    - ``qk_norm``: a norm kind (``rms``, ``rms-gemma``): an RMSNorm over each head's d_k
      channels of q and of k, before the rotation (Qwen3, Gemma 3).
    - ``scale``: the factor on Q K^T (default 1/sqrt(d_k); T5 1.0; Gemma query_pre_attn_scalar^-0.5).
    - ``softcap``: scores become cap * tanh(scores / cap) before the mask (Gemma 2).
    - ``window``: each query sees only the last ``window`` positions, itself included
      (sliding-window attention: Mistral, Gemma 2/3).
    - ``weighting``: how scores become weights (``WEIGHTINGS``): softmax, or softmax1 and
      sigmoid, whose rows need not sum to 1 (always computed on the reference path).
    ``forward`` also takes ``position_bias`` (B|1, H, T, S), added to the scaled scores (T5).

    Recorded (see ``attnlab.hooks``): q (B, H, T, d_k); k, v (B, n_kv, S, D) as the KV cache
    holds them; position_bias, where a model passes one; scores (B, H, T, S), the softmax's
    input before the mask; weights (B, H, T, S); z (B, H, T, d_v) per-head outputs; out
    (B, T, C). With ``per_head`` set (``per_head_inputs``), also what each head's projections
    read: q_in (B, H, T, C), and k_in, v_in (B, n_kv, S, kv_dim) per K/V head.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        kv_dim: int | None = None,
        rotary: nn.Module | None = None,
        n_kv_heads: int | None = None,
        qkv_bias: bool | None = None,
        out_bias: bool | None = None,
        qk_norm: str | None = None,
        qk_norm_eps: float = 1e-6,
        scale: float | None = None,
        softcap: float | None = None,
        window: int | None = None,
        weighting: str = "softmax",
    ):
        super().__init__()
        if d_model <= 0 or n_heads <= 0:
            raise ValueError("d_model and n_heads must be positive")
        if (d_k is None or d_v is None) and d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads <= 0 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
        if (softcap is not None and softcap <= 0) or (window is not None and window <= 0):
            raise ValueError("softcap and window must be positive")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {weighting!r}; choose {', '.join(WEIGHTINGS)}")
        self.weighting = weighting
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_k = d_k or d_model // n_heads
        self.d_v = d_v or d_model // n_heads
        kv_dim = kv_dim or d_model
        qkv_bias = bias if qkv_bias is None else qkv_bias
        out_bias = bias if out_bias is None else out_bias
        self.q_proj = nn.Linear(d_model, n_heads * self.d_k, bias=qkv_bias)
        self.k_proj = nn.Linear(kv_dim, n_kv_heads * self.d_k, bias=qkv_bias)
        self.v_proj = nn.Linear(kv_dim, n_kv_heads * self.d_v, bias=qkv_bias)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model, bias=out_bias)
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = make_norm(qk_norm, self.d_k, qk_norm_eps)
            self.k_norm = make_norm(qk_norm, self.d_k, qk_norm_eps)
        self.dropout, self.scale, self.softcap, self.window = dropout, scale, softcap, window
        self.rotary = rotary
        self.use_fused = True  # set False to force the reference path (conformance checks)
        self.per_head = False  # each head reads its own copy of its inputs (per_head_inputs)
        for name in ("q", "k", "v", "weights", "z", "out", "q_in", "k_in", "v_in",
                     "position_bias"):  # fmt: skip
            setattr(self, f"hook_{name}", Hook())
        # the softmax has already read the scores when they are recorded: not an edit point
        self.hook_scores = Hook(read_only=True)

    def _heads(self, x: Tensor, d: int) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, -1, d).transpose(1, 2)  # (B, heads, L, d)

    def _share(self, x: Tensor) -> Tensor:
        """(B, n_kv, S, D) -> (B, H, S, D): K/V head j serves query heads j*g .. j*g + g - 1."""
        g = self.n_heads // self.n_kv_heads
        return x if g == 1 else x.repeat_interleave(g, dim=1)

    def new_cache(self, batch: int, max_len: int, ring: bool = False, dtype=None, device=None,
                  sinks: int = 0):  # fmt: skip
        """A KVCache (``RingKVCache`` when ``ring``; a ``SinkKVCache`` keeping the first
        ``sinks`` positions beside the ring, with rotary positions) sized for this layer."""
        size = (batch, max_len, self.n_kv_heads, self.d_k, self.d_v)
        if sinks:
            if self.rotary is None:
                raise ValueError("a sink cache places its sinks by rotary positions")
            return SinkKVCache(*size, sinks=sinks, shift=self.rotary.shift, dtype=dtype,
                               device=device)  # fmt: skip
        kind = RingKVCache if ring else KVCache
        return kind(*size, dtype=dtype, device=device)

    def _project(self, x: Tensor, kv: Tensor | None, cache) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, T, d_k), and k (B, n_kv, S, d_k), v (B, n_kv, S, d_v) with what ``cache``
        holds: normed (qk_norm), rotated (rotary) and appended to the cache."""
        if self.per_head:
            if cache is not None:
                raise ValueError("per-head inputs are for whole forward passes, not for "
                                 "decoding with a cache")  # fmt: skip
            q, k, v = self._project_per_head(x, x if kv is None else kv)
        else:
            q = self._heads(self.q_proj(x), self.d_k)  # (B, H, T, d_k)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if isinstance(cache, StaticKV) and cache.k is not None:
            return q, cache.k, cache.v  # encoder keys/values computed at the first step
        if not self.per_head:
            src = x if kv is None else kv
            k = self._heads(self.k_proj(src), self.d_k)  # (B, n_kv, S, d_k)
            v = self._heads(self.v_proj(src), self.d_v)  # (B, n_kv, S, d_v)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.rotary is not None:
            offset = cache.length if isinstance(cache, KVCache) else 0
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if isinstance(cache, KVCache):
            if isinstance(cache, RingKVCache) and (self.window or cache.max_len) < cache.max_len:
                raise ValueError(f"a ring KV cache of {cache.max_len} positions cannot hold "
                                     f"a sliding window of {self.window}: use a window policy "
                                     "other than ring")  # fmt: skip
            k, v = cache.append(k, v)
        elif isinstance(cache, StaticKV):
            cache.k, cache.v = k, v
        return q, k, v

    def _project_per_head(self, x: Tensor, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (before qk_norm and rotary) when every head reads its own copy of its input:
        q_in (B, H, T, C) holds head h's query input at [:, h], k_in and v_in (B, n_kv, S,
        kv_dim) K/V head j's key and value inputs at [:, j]. Each is a view of ``x`` (``src``)
        until an edit writes it; then q_h = q_in[:, h] W_Q^h + b_Q^h reads the edited copy of
        head h alone (and likewise k_j, v_j). Unedited, the numbers are ``_project``'s."""
        B, T, C = x.shape
        S, H, G = src.size(1), self.n_heads, self.n_kv_heads
        xq = self.hook_q_in(x.unsqueeze(1).expand(B, H, T, C))  # (B, H, T, C)
        xk = self.hook_k_in(src.unsqueeze(1).expand(B, G, S, src.size(-1)))  # (B, n_kv, S, C)
        xv = self.hook_v_in(src.unsqueeze(1).expand(B, G, S, src.size(-1)))
        return (per_head_linear(self.q_proj, xq, self.d_k), per_head_linear(self.k_proj, xk, self.d_k),
                per_head_linear(self.v_proj, xv, self.d_v))  # fmt: skip

    def _mask(self, mask: Tensor | None, causal: bool, T: int, S: int, device) -> Tensor | None:
        """The boolean mask the reference path reads: ``mask`` AND causal AND the window."""
        cm = causal_mask(T, S, device=device) if causal else None
        wm = sliding_window_mask(T, S, self.window, device) if self.window else None
        return combine_masks(_as_bool_mask(mask), cm, wm)

    def forward(
        self,
        x: Tensor,
        kv: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | StaticKV | None = None,
        return_weights: bool = False,
        position_bias: Tensor | None = None,
    ):
        """x (B, T, C); kv (B, S, kv_dim) for cross-attention. Returns out (B, T, C), and the
        per-head weights (B, H, T, S) too when ``return_weights``."""
        q, k, v = self._project(x, kv, cache)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if position_bias is not None:
            position_bias = self.hook_position_bias(position_bias)  # (B|1, H, T, S)
        T, S, gqa = q.size(2), k.size(2), self.n_kv_heads != self.n_heads
        p = self.dropout if self.training else 0.0
        recording = self.hook_weights.active or self.hook_scores.active
        reference = self.softcap is not None or self.weighting != "softmax"  # no fused kernel
        if return_weights or recording or not self.use_fused or reference:
            k, v = self._share(k), self._share(v)  # (B, H, S, D) each query head's K/V head
            mask = self._mask(mask, causal, T, S, x.device)
            z, weights, scores = reference_attention(
                q, k, v, mask, self.scale, p, position_bias, self.softcap, self.weighting
            )
            self.hook_scores(scores)
            weights = self.hook_weights(weights)
            if self.hook_weights.edit is not None:  # edited weights must reach the output
                z = weights @ v  # (B, H, T, d_v)
        elif self.window is None and position_bias is None:
            z = scaled_dot_product_attention(
                q, k, v, mask=mask, causal=causal, dropout_p=p, scale=self.scale, enable_gqa=gqa
            )
            weights = None
        else:
            mask = self._mask(mask, causal, T, S, x.device)
            z = _fused_attention(q, k, v, mask, self.scale, p, position_bias, gqa)
            weights = None
        z = self.hook_z(z)  # (B, H, T, d_v)
        B = z.size(0)
        out = self.hook_out(self.out_proj(z.transpose(1, 2).reshape(B, T, -1)))  # (B, T, C)
        return (out, weights) if return_weights else out


def per_head_linear(proj: nn.Linear, x: Tensor, d: int) -> Tensor:
    """x (B, n, L, C), one input per head -> (B, n, L, d): head h's input through its own
    rows of ``proj`` (rows h*d .. h*d + d - 1: W^h (d, C)), y_h = x_h W^h^T + b^h."""
    W = proj.weight.view(-1, d, proj.in_features)  # (n, d, C)
    y = torch.einsum("bnlc,ndc->bnld", x, W)  # (B, n, L, d)
    return y if proj.bias is None else y + proj.bias.view(-1, 1, d)


@contextmanager
def per_head_inputs(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, every MultiHeadAttention of ``model`` gives each head its own copy of
    its query, key and value inputs (``q_in``, ``k_in``, ``v_in``: see
    ``MultiHeadAttention._project_per_head``), so that an edit there reaches one head's one
    input alone. The outputs are the usual ones to float rounding while nothing edits them.
    Whole forward passes only (no KV cache). What was set before is restored after."""
    mods = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    before = [m.per_head for m in mods]
    try:
        for m in mods:
            m.per_head = True
        yield model
    finally:
        for m, b in zip(mods, before):
            m.per_head = b
