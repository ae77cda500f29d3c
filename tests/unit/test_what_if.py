"""What if (attnlab.inspect.what_if): each change computed another way, the baseline
reproducing what the model recorded (rotary, grouped-query, windows, softcaps, scales), and
the one-line refusal where a head has no Q and K."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.inspect import record
from attnlab.inspect.by_hand import random_matrices
from attnlab.inspect.recording import InspectError
from attnlab.inspect.what_if import compare, what_if, what_if_by_hand
from lm_helpers import tiny_gpt
from look_helpers import char_tokenizer

TEXT = "I like to eat apples"


def softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    e = np.where(np.isinf(s), 0.0, e)
    return e / e.sum(-1, keepdims=True)


def test_each_change_is_the_attention_computed_without_that_piece():
    m = random_matrices(m=6, d_k=4, seed=3, tokens=TEXT)
    r = what_if_by_hand(m, temperature=3.0, pad=2)
    q, k = m.x @ m.w_q, m.x @ m.w_k
    raw = q @ k.T
    causal = np.tril(np.ones((5, 5), bool))
    np.testing.assert_allclose(
        r.before, softmax_rows(np.where(causal, raw / 2, -np.inf)), atol=1e-12
    )
    np.testing.assert_allclose(r.change("no_scale").after,
                               softmax_rows(np.where(causal, raw, -np.inf)), atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(r.change("no_causal_mask").after, softmax_rows(raw / 2), atol=1e-12)
    for t, name in ((3.0, "flatter"), (1 / 3.0, "sharper")):
        assert r.change(f"temperature_{name}").extra["temperature"] == t
        np.testing.assert_allclose(r.change(f"temperature_{name}").after,
                                   softmax_rows(np.where(causal, raw / 2 / t, -np.inf)),
                                   atol=1e-12)  # fmt: skip
    names = [c.name for c in r.changes]
    assert names == ["no_scale", "no_causal_mask", "temperature_flatter", "temperature_sharper",
                     "padding"]  # fmt: skip
    # a flatter softmax has more entropy and a smaller largest weight, a sharper one less
    flat, sharp = r.change("temperature_flatter"), r.change("temperature_sharper")
    assert flat.entropy_after.mean() > r.entropy_before.mean() > sharp.entropy_after.mean()
    assert flat.max_after.mean() < r.max_before.mean() < sharp.max_after.mean()


def test_padding_leaks_without_its_mask_and_the_mask_restores_the_weights():
    m = random_matrices(m=6, d_k=4, seed=5, tokens=TEXT)
    causal = what_if_by_hand(m).change("padding")  # pads on the left, where causal cannot help
    assert causal.cols[:2] == ["<pad>", "<pad>"] and causal.extra["padded"] == "left"
    assert causal.extra["weight_on_pads"] > 0 and causal.extra["padding_mask_restores"] < 1e-12
    both_ways = what_if_by_hand(m, causal=False).change("padding")
    assert both_ways.cols[-2:] == ["<pad>", "<pad>"] and both_ways.extra["padded"] == "right"
    assert both_ways.after[:, 5:].sum(-1).min() > 0  # each token gives the pads some weight
    np.testing.assert_allclose(both_ways.after.sum(-1), 1.0)


def test_a_bidirectional_head_gets_a_causal_mask_and_an_unscaled_one_gets_the_scale():
    m = random_matrices(m=6, d_k=4, seed=3, tokens=TEXT)
    r = what_if_by_hand(m, causal=False, scale=False)
    assert [c.name for c in r.changes][:2] == ["with_scale", "causal_mask"]
    assert np.triu(r.change("causal_mask").after, 1).max() == 0.0


@pytest.mark.parametrize("overrides", [
    {},
    {"pos": "rotary", "n_head": 4, "n_kv_heads": 2},  # rotated Q, K; grouped K/V heads
    {"sliding_window": 3, "attn_softcap": 5.0, "attn_scale": 0.3},
    {"qk_norm": True, "norm": "rms"},
])  # fmt: skip
def test_the_baseline_reproduces_the_recorded_head(overrides):
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = tiny_gpt(tok, **overrides).eval()
    rec = record(model, tok, TEXT)
    for layer in (0, 1):
        head = model.config.n_head - 1
        r = what_if(rec, model, layer=layer, head=head, text=TEXT)
        recorded = rec.cache[f"blocks.{layer}.attn.weights"][0, head].double().numpy()
        np.testing.assert_allclose(r.before, recorded, atol=1e-5)
        assert r.rows == r.cols == list(rec.tokens[""])


def test_a_head_that_cannot_be_reproduced_is_refused():
    q = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(InspectError, match="could not reproduce"):
        compare(q, q, q, list("abcd"), list("abcd"), scale=1 / math.sqrt(3), causal=True,
                recorded=np.full((4, 4), 0.25))  # fmt: skip


def test_an_lstm_alignment_is_refused_in_one_line():
    from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
    from attnlab.tokenizers import CharTokenizer, PairTokenizer

    tok = PairTokenizer(CharTokenizer("abcdefg "), CharTokenizer("abcdefg "))
    model = RNNSeq2Seq(RNNConfig(src_vocab_size=tok.src_vocab_size,
                                 tgt_vocab_size=tok.tgt_vocab_size, d_embed=8, d_hidden=16)).eval()  # fmt: skip
    rec = record(model, tok, "bad cafe")
    with pytest.raises(InspectError) as e:
        what_if(rec, model)
    assert "records none" in str(e.value) and "trace" in str(e.value) and "\n" not in str(e.value)


def test_no_head_past_the_last():
    tok = char_tokenizer()
    model = tiny_gpt(tok).eval()
    with pytest.raises(InspectError, match=r"no head 2; layer 0 has heads 0..1"):
        what_if(record(model, tok, TEXT), model, layer=0, head=2)


def test_the_temperature_must_change_something():
    m = random_matrices(m=4, d_k=2, seed=0, tokens="a b")
    with pytest.raises(InspectError, match="other than 1"):
        what_if_by_hand(m, temperature=1.0)
