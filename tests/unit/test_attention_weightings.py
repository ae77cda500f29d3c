"""How scores become weights: softmax, softmax1 (an extra logit fixed at 0) and sigmoid (no
normalisation), each checked against its definition, and a GPT built with each."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import (
    WEIGHTINGS,
    MultiHeadAttention,
    causal_mask,
    reference_attention,
    sigmoid_weights,
    softmax1_weights,
)
from attnlab.config import ConfigError
from attnlab.decoding import FastForward
from attnlab.generation import SamplingConfig, generate_ids
from attnlab.models.gpt import GPTConfig
from lm_helpers import tiny_gpt


@pytest.mark.parametrize("scale", [0.1, 3.0, 40.0])
def test_softmax1_is_softmax_with_one_more_logit_fixed_at_zero(scale):
    torch.manual_seed(0)
    s = torch.randn(3, 4, 5, 7, dtype=torch.float64) * scale  # large scores: overflow is handled
    with_zero = torch.cat([s, torch.zeros(*s.shape[:-1], 1, dtype=s.dtype)], -1)  # (..., 8)
    ref = torch.softmax(with_zero, -1)[..., :-1]  # the weight of the zero logit left out
    got = softmax1_weights(s)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)
    assert bool((got.sum(-1) <= 1 + 1e-12).all()) and bool(torch.isfinite(got).all())
    if scale < 1:  # small scores: the zero logit keeps a visible share
        assert float(got.sum(-1).max()) < 0.9


def test_sigmoid_weights_each_key_on_its_own():
    s = torch.tensor([[-50.0, -1.0, 0.0, 2.0, 50.0]])
    torch.testing.assert_close(sigmoid_weights(s), 1 / (1 + torch.exp(-s)))
    # no normalisation: a row's weights move with one key alone
    t = s.clone()
    t[0, 0] = 3.0
    assert torch.equal(sigmoid_weights(t)[0, 1:], sigmoid_weights(s)[0, 1:])


@pytest.mark.parametrize("weighting", list(WEIGHTINGS))
def test_masked_keys_weigh_nothing_and_an_empty_row_gives_zeros(weighting):
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    mask = causal_mask(4, 4).clone()
    mask[2] = False  # row 2 sees nothing
    out, w, _ = reference_attention(q, k, v, mask, weighting=weighting)
    assert float(w[..., ~mask].abs().max()) == 0.0
    assert float(out[:, :, 2].abs().max()) == 0.0 and bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, w @ v)  # the output is the weighted sum of the values


def test_softmax1_attention_equals_softmax_over_a_zero_key_with_a_zero_value():
    """The definition of the extra logit: a key that every query scores 0 against, whose value
    is 0, attended with an ordinary softmax."""
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 6)
    mask = causal_mask(5, 5)
    got, _, _ = reference_attention(q, k, v, mask, weighting="softmax1")
    k0 = torch.cat([torch.zeros(2, 3, 1, 8), k], 2)  # the zero key first: q . 0 = 0
    v0 = torch.cat([torch.zeros(2, 3, 1, 6), v], 2)
    m0 = torch.cat([torch.ones(5, 1, dtype=torch.bool), mask], 1)  # every query sees it
    ref, _, _ = reference_attention(q, k0, v0, m0)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("weighting", ["softmax1", "sigmoid"])
def test_multi_head_attention_weighting_records_the_weights_it_used(weighting):
    torch.manual_seed(3)
    mha = MultiHeadAttention(16, 2, weighting=weighting).eval()
    x = torch.randn(2, 6, 16)
    out, w = mha(x, causal=True, return_weights=True)
    torch.testing.assert_close(mha(x, causal=True), out)  # the unrecorded call takes the same path
    q = mha.q_proj(x).view(2, 6, 2, 8).transpose(1, 2)
    k = mha.k_proj(x).view(2, 6, 2, 8).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / 8**0.5
    ref = WEIGHTINGS[weighting](scores.masked_fill(~causal_mask(6, 6), float("-inf")))
    torch.testing.assert_close(w, ref, atol=1e-6, rtol=0)
    assert float((w.sum(-1) - 1).abs().max().detach()) > 1e-3  # rows need not sum to 1
    with pytest.raises(ValueError, match="unknown weighting"):
        MultiHeadAttention(16, 2, weighting="relu")


@pytest.mark.parametrize("weighting", ["softmax1", "sigmoid"])
def test_a_gpt_with_the_weighting_trains_and_its_cache_changes_nothing(weighting):
    torch.manual_seed(4)
    model = tiny_gpt(20, pos="rotary", attention=weighting)
    assert all(b.attn.weighting == weighting for b in model.blocks)
    assert FastForward.applies(model.eval())  # decoding restates it on its reference path
    ids = torch.randint(0, 20, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    first = None
    for _ in range(30):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 0.5
    prompt = ids[:2, :3]
    cfg = SamplingConfig(10, temperature=0.0)
    cached = generate_ids(model, prompt, cfg)
    assert torch.equal(cached, generate_ids(model, prompt, cfg, use_cache=False))
    assert ("extra zero logit" if weighting == "softmax1" else "sigmoid") in model.describe()


def test_gpt_config_refuses_an_unknown_attention():
    with pytest.raises(ConfigError, match="attention"):
        GPTConfig(attention="relu")
    assert "attention" not in GPTConfig().to_dict()  # a softmax run's config.json is unchanged
    assert GPTConfig(attention="sigmoid").to_dict()["attention"] == "sigmoid"
