"""Properties on random shapes (hypothesis): masks vs brute force, attention paths, configs."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from attnlab.config import ConfigError
from attnlab.models.gpt import GPTConfig

FAST = settings(max_examples=40, deadline=None)


@FAST
@given(T=st.integers(1, 12), extra=st.integers(0, 12))
def test_causal_mask_matches_brute_force(T, extra):
    S = T + extra
    m = causal_mask(T, S)
    for t in range(T):
        for s in range(S):
            assert bool(m[t, s]) == (s <= t + S - T)


@FAST
@given(lengths=st.lists(st.integers(0, 10), min_size=1, max_size=5), pad=st.integers(0, 4))
def test_padding_mask_matches_brute_force(lengths, pad):
    S = max(lengths) + pad
    m = padding_mask(lengths=torch.tensor(lengths), S=S)
    assert m.shape == (len(lengths), 1, 1, S)
    for b, n in enumerate(lengths):
        assert m[b, 0, 0].tolist() == [s < n for s in range(S)]


@FAST
@given(T=st.integers(1, 8), lengths=st.lists(st.integers(1, 8), min_size=1, max_size=4))
def test_combined_mask_is_the_logical_and(T, lengths):
    lengths = [min(n, T) for n in lengths]
    m = combine_masks(None, causal_mask(T), padding_mask(lengths=torch.tensor(lengths), S=T), None)
    for b, n in enumerate(lengths):
        for t in range(T):
            assert m[b, 0, t].tolist() == [s <= t and s < n for s in range(T)]


@settings(max_examples=30, deadline=None)
@given(
    B=st.integers(1, 3),
    H=st.integers(1, 3),
    T=st.integers(1, 9),
    S=st.integers(1, 9),
    dk=st.integers(1, 12),
    dv=st.integers(1, 12),
    causal=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_reference_and_fused_agree_on_random_shapes(B, H, T, S, dk, dv, causal, masked, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, dk, generator=g, requires_grad=True)
    k = torch.randn(B, H, S, dk, generator=g, requires_grad=True)
    v = torch.randn(B, H, S, dv, generator=g, requires_grad=True)
    mask = (torch.rand(B, 1, T, S, generator=g) > 0.3) if masked else None
    ref, _ = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, return_weights=True)
    fused = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)
    torch.testing.assert_close(ref, fused, atol=1e-5, rtol=0)
    gr = torch.autograd.grad(ref.sum(), (q, k, v))
    gf = torch.autograd.grad(fused.sum(), (q, k, v))
    for a, b in zip(gr, gf):
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


configs = st.builds(
    GPTConfig,
    vocab_size=st.integers(1, 70000),
    block_size=st.integers(1, 2048),
    n_layer=st.integers(1, 48),
    n_head=st.sampled_from([1, 2, 4, 8]),
    d_model=st.sampled_from([16, 64, 768]),  # head width stays even for rotary
    dropout=st.floats(0, 0.9),
    pos=st.sampled_from(["learned", "sinusoidal", "rotary"]),
    norm_first=st.booleans(),
    activation=st.sampled_from(["gelu", "gelu_tanh", "relu"]),
)


@FAST
@given(cfg=configs)
def test_config_json_round_trip(cfg):
    assert GPTConfig.from_json(cfg.to_json()) == cfg


@FAST
@given(d_model=st.integers(1, 200), n_head=st.integers(1, 16))
def test_config_rejects_indivisible_width(d_model, n_head):
    try:
        cfg = GPTConfig(d_model=d_model, n_head=n_head)
    except ConfigError as e:
        assert d_model % n_head != 0
        assert "divisible" in str(e)
    else:
        assert d_model % n_head == 0 and dataclasses.is_dataclass(cfg)


@FAST
@given(field=st.sampled_from(["vocab_size", "block_size", "n_layer", "n_head", "d_model"]),
       value=st.integers(-5, 0))  # fmt: skip
def test_config_rejects_non_positive_sizes(field, value):
    try:
        GPTConfig(**{field: value})
    except ConfigError as e:
        assert field in str(e)
    else:
        raise AssertionError(f"{field}={value} was accepted")
