"""Scaled dot-product attention: reference vs fused, masks, empty rows, KV cache, nn.MHA parity."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    combine_masks,
    from_torch_key_padding_mask,
    from_torch_mha_mask,
    padding_mask,
    reference_attention,
    scaled_dot_product_attention,
)

TOL = 1e-5


def _qkv(B=2, H=3, T=5, S=None, dk=8, dv=None, grad=True):
    S = T if S is None else S
    dv = dk if dv is None else dv
    q = torch.randn(B, H, T, dk, requires_grad=grad)
    k = torch.randn(B, H, S, dk, requires_grad=grad)
    v = torch.randn(B, H, S, dv, requires_grad=grad)
    return q, k, v


def _both_paths(q, k, v, **kw):
    """Outputs and input gradients of the reference path and of the fused path."""
    results = []
    for weights in (True, False):
        out = scaled_dot_product_attention(q, k, v, return_weights=weights, **kw)
        out = out[0] if weights else out
        g_out = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad(out, (q, k, v), g_out)
        results.append((out.detach(), grads))
    return results


def _assert_paths_agree(q, k, v, **kw):
    (ro, rg), (fo, fg) = _both_paths(q, k, v, **kw)
    assert not torch.isnan(ro).any() and not torch.isnan(fo).any()
    torch.testing.assert_close(ro, fo, atol=TOL, rtol=0)
    for a, b in zip(rg, fg):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_reference_matches_the_formula():
    q, k, v = _qkv(grad=False, dk=24, dv=28)  # the notes' d_q = d_k = 24, d_v = 28
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    expected_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(24), dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)
    assert out.shape == (2, 3, 5, 28) and w.shape == (2, 3, 5, 5)


@pytest.mark.parametrize("dk,dv", [(8, 8), (24, 28), (5, 3)])
def test_paths_agree_without_mask(dk, dv):
    _assert_paths_agree(*_qkv(dk=dk, dv=dv))


def test_paths_agree_causal():
    _assert_paths_agree(*_qkv(T=7), causal=True)


def test_paths_agree_with_padding():
    q, k, v = _qkv(B=3, T=6)
    lengths = torch.randint(1, 7, (3,))
    _assert_paths_agree(q, k, v, mask=padding_mask(lengths=lengths, S=6))


def test_paths_agree_with_arbitrary_mask():
    q, k, v = _qkv(T=6, S=9)
    mask = torch.rand(2, 1, 6, 9) > 0.4
    _assert_paths_agree(q, k, v, mask=mask)


def test_paths_agree_cross_attention_t_ne_s():
    _assert_paths_agree(*_qkv(T=3, S=11, dk=6, dv=10))


def test_paths_agree_causal_with_t_lt_s_cache_case():
    _assert_paths_agree(*_qkv(T=3, S=8), causal=True)


@pytest.mark.parametrize("S", [1, 2, 9])
def test_paths_agree_causal_with_one_query(S):
    # decoding one token: the fast path drops the (all-True) causal mask
    _assert_paths_agree(*_qkv(T=1, S=S), causal=True)
    q, k, v = _qkv(B=3, T=1, S=S)
    keep = torch.rand(3, 1, 1, S) > 0.3
    _assert_paths_agree(q, k, v, mask=keep, causal=True)


def test_causal_mask_is_bottom_right_aligned():
    T, S = 3, 7
    m = causal_mask(T, S)
    for t in range(T):
        # the query at absolute position S - T + t sees every key up to and including itself
        assert m[t].tolist() == [j <= S - T + t for j in range(S)]
    assert m[-1].all(), "the last query of a cached sequence sees every earlier key"
    assert torch.equal(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_blocks_future_tokens():
    q, k, v = _qkv(grad=False, T=6)
    out = scaled_dot_product_attention(q, k, v, causal=True)
    v2 = v.clone()
    v2[..., 4:, :] += 100.0  # change only the future of positions 0..3
    out2 = scaled_dot_product_attention(q, k, v2, causal=True)
    torch.testing.assert_close(out[..., :4, :], out2[..., :4, :])
    assert not torch.allclose(out[..., 4:, :], out2[..., 4:, :])


@pytest.mark.parametrize("fused", [True, False])
def test_fully_masked_rows_give_zeros_not_nan(fused):
    q, k, v = _qkv(T=4, S=5)
    mask = torch.rand(2, 3, 4, 5) > 0.5
    mask[:, :, 1] = False  # row 1: nothing to attend to
    mask[0, 2, 3] = False
    res = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=not fused)
    out = res if fused else res[0]
    assert not torch.isnan(out).any()
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    assert torch.equal(out[0, 2, 3], torch.zeros_like(out[0, 2, 3]))
    if not fused:
        w = res[1]
        assert torch.equal(w[:, :, 1], torch.zeros_like(w[:, :, 1]))
    out.sum().backward()
    for t in (q, k, v):
        assert not torch.isnan(t.grad).any()
    assert torch.equal(q.grad[:, :, 1], torch.zeros_like(q.grad[:, :, 1]))


def test_causal_with_more_queries_than_keys_leaves_early_rows_empty():
    q, k, v = _qkv(T=5, S=3, grad=False)
    out, w = scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)
    assert torch.equal(w[..., :2, :], torch.zeros_like(w[..., :2, :]))
    torch.testing.assert_close(
        out, scaled_dot_product_attention(q, k, v, causal=True), atol=TOL, rtol=0
    )


def test_weights_rows_sum_to_one_where_anything_is_visible():
    q, k, v = _qkv(grad=False, T=6, S=6)
    mask = combine_masks(causal_mask(6), padding_mask(lengths=torch.tensor([6, 3]), S=6))
    _, w = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    sums = w.sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_masks_are_boolean_only():
    q, k, v = _qkv(grad=False)
    with pytest.raises(TypeError, match="boolean"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(5, 5))


def test_reference_attention_returns_scaled_scores():
    q, k, v = _qkv(grad=False)
    _, _, scores = reference_attention(q, k, v)
    torch.testing.assert_close(scores, q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)))


# --- mask converters --------------------------------------------------------------------------


def test_padding_mask_from_lengths_and_from_pad_id_agree():
    lengths = torch.randint(1, 9, (4,))
    ids = torch.randint(1, 50, (4, 8))
    for b, n in enumerate(lengths.tolist()):
        ids[b, n:] = 0
    from_len = padding_mask(lengths=lengths, S=8)
    from_ids = padding_mask(ids=ids, pad_id=0)
    assert from_len.shape == (4, 1, 1, 8)
    assert torch.equal(from_len, from_ids)


def test_torch_mha_conventions_are_inverted():
    blocked = torch.rand(4, 6) > 0.5
    assert torch.equal(from_torch_mha_mask(blocked), ~blocked)
    additive = torch.zeros(4, 6).masked_fill(blocked, float("-inf"))
    assert torch.equal(from_torch_mha_mask(additive), ~blocked)
    kpm = torch.rand(3, 6) > 0.5
    assert torch.equal(from_torch_key_padding_mask(kpm), (~kpm)[:, None, None, :])


def test_hf_attention_mask_keeps_ones():
    from attnlab.attention import from_hf_attention_mask

    am = (torch.rand(3, 7) > 0.3).long()
    m = from_hf_attention_mask(am)
    assert m.dtype == torch.bool and m.shape == (3, 1, 1, 7)
    assert torch.equal(m[:, 0, 0], am.bool())


# --- MultiHeadAttention -----------------------------------------------------------------------


def _copy_from_torch(theirs: nn.MultiheadAttention, d_model: int, bias: bool) -> MultiHeadAttention:
    ours = MultiHeadAttention(d_model, theirs.num_heads, bias=bias)
    wq, wk, wv = theirs.in_proj_weight.detach().chunk(3)
    with torch.no_grad():
        ours.q_proj.weight.copy_(wq)
        ours.k_proj.weight.copy_(wk)
        ours.v_proj.weight.copy_(wv)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        if bias:
            bq, bk, bv = theirs.in_proj_bias.detach().chunk(3)
            ours.q_proj.bias.copy_(bq)
            ours.k_proj.bias.copy_(bk)
            ours.v_proj.bias.copy_(bv)
            ours.out_proj.bias.copy_(theirs.out_proj.bias)
    return ours


@pytest.mark.parametrize("d_model,heads,bias", [(16, 4, True), (24, 3, False), (32, 1, True)])
def test_mha_matches_torch_multihead_attention(d_model, heads, bias):
    theirs = nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True).eval()
    ours = _copy_from_torch(theirs, d_model, bias).eval()
    x = torch.randn(3, 7, d_model)
    mem = torch.randn(3, 5, d_model)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[1, 3:] = True  # key padding, True = blocked in torch's convention
    attn_mask = torch.ones(7, 7, dtype=torch.bool).triu(1)  # torch: True = blocked (future)
    cases = [
        (dict(query=x, key=x, value=x), dict(x=x)),
        (dict(query=x, key=x, value=x, attn_mask=attn_mask), dict(x=x, causal=True)),
        (
            dict(query=x, key=mem, value=mem, key_padding_mask=kpm),
            dict(x=x, kv=mem, mask=from_torch_key_padding_mask(kpm)),
        ),
    ]
    for their_kw, our_kw in cases:
        t_out, t_w = theirs(**their_kw, need_weights=True, average_attn_weights=True)
        o_out, o_w = ours(**our_kw, return_weights=True)
        torch.testing.assert_close(o_out, t_out, atol=TOL, rtol=0)
        torch.testing.assert_close(o_w.mean(dim=1), t_w, atol=TOL, rtol=0)
        fused = ours(**our_kw)  # the fused path too
        torch.testing.assert_close(fused, t_out, atol=TOL, rtol=0)


def test_mha_d_k_and_d_v_may_differ():
    mha = MultiHeadAttention(16, 2, d_k=24, d_v=28)
    out, w = mha(torch.randn(1, 6, 16), return_weights=True)
    assert out.shape == (1, 6, 16) and w.shape == (1, 2, 6, 6)
    assert mha.v_proj.out_features == 56 and mha.q_proj.out_features == 48


@pytest.mark.parametrize("use_weights", [False, True])
def test_incremental_decoding_with_kv_cache_equals_full_pass(use_weights):
    torch.manual_seed(3)
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 9, 32)
    full = mha(x, causal=True)
    cache = KVCache(2, 16, 4, 8, 8)
    steps = [mha(x[:, :4], causal=True, cache=cache)]  # a 4-token prefill, then one at a time
    for t in range(4, 9):
        out = mha(x[:, t : t + 1], causal=True, cache=cache, return_weights=use_weights)
        steps.append(out[0] if use_weights else out)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=TOL, rtol=0)
    assert cache.length == 9


def test_kv_cache_refuses_to_overflow():
    cache = KVCache(1, 3, 1, 2, 2)
    cache.append(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    with pytest.raises(ValueError, match="full"):
        cache.append(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def test_mha_rejects_indivisible_width():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)
