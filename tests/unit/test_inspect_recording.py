"""The recording protocol: maps found by name, labels per stack, recording changes nothing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.hooks import ActivationCache
from attnlab.inspect import InspectError, Recording, record
from look_helpers import SENTENCE, TinyEncoder, char_tokenizer, tiny_gpt


@settings(max_examples=8, deadline=None)
@given(
    pos=st.sampled_from(["learned", "sinusoidal", "rotary"]),
    norm_first=st.booleans(),
    n_head=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
def test_recording_on_equals_recording_off(pos, norm_first, n_head, seed):
    torch.manual_seed(seed)
    tok = char_tokenizer()
    model = tiny_gpt(tok, pos=pos, norm_first=norm_first, n_head=n_head, d_model=16).eval()
    ids = torch.randint(0, tok.vocab_size, (2, 12))
    with torch.no_grad():
        plain = model(ids)
        recorded, cache = model(ids, record=True)
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=1e-5)
    w = cache["blocks.0.attn.weights"]
    assert w.shape == (2, n_head, 12, 12)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, n_head, 12))


def test_gpt_record_text_labels_every_map_with_its_tokens():
    tok = char_tokenizer()
    model = tiny_gpt(tok, n_layer=3).eval()
    rec = record(model, tok, SENTENCE)
    assert isinstance(rec, Recording)
    assert rec.tokens == {"": list(SENTENCE)}
    assert rec.ids[""] == tok.encode(SENTENCE)
    assert rec.map_names() == [f"blocks.{i}.attn.weights" for i in range(3)]
    for info in rec.maps():
        assert (info.kind, info.stack, info.n_heads) == ("self", "", 2)
        q, k = rec.labels(info.name)
        assert q == k == list(SENTENCE)
    assert rec.logits.shape == (1, len(SENTENCE), tok.vocab_size)
    assert rec.blocks() == ["blocks.0.", "blocks.1.", "blocks.2."]


def test_a_gpt_recording_computes_its_other_positions_logits_only_when_they_are_read():
    from attnlab.inspect.trace import trace
    from attnlab.models.declare import LaterLogits

    tok = char_tokenizer()
    torch.manual_seed(3)
    model = tiny_gpt(tok, n_layer=2).eval()
    rec = record(model, tok, SENTENCE)
    assert isinstance(rec.output, LaterLogits) and rec.has_logits
    tr = trace(model, tok, SENTENCE, rec=rec)  # its predictions read the last position only
    assert isinstance(rec.output, LaterLogits)
    step = next(s for s in tr.steps if s.name == "logits")
    assert step.shape == (len(SENTENCE), tok.vocab_size)
    last = rec.last_logits.clone()
    whole = rec.logits  # computed now, once
    assert not isinstance(rec.output, LaterLogits) and rec.logits is whole
    assert torch.equal(whole[:, -1], last)  # the last row is the one computed first, to the bit
    with torch.no_grad():
        torch.testing.assert_close(whole, model(torch.tensor([tok.encode(SENTENCE)])))
    assert not whole.requires_grad
    torch.testing.assert_close(torch.as_tensor(step.value), whole[0])
    preds = next(s for s in tr.steps if s.name == "predictions").extra["predictions"]
    assert preds[0]["id"] == int(last[0].argmax())


def test_generic_record_text_serves_a_single_stack_encoder():
    tok = char_tokenizer()
    model = TinyEncoder(tok.vocab_size).eval()
    rec = record(model, tok, "the bank")  # no record_text method: the generic default
    assert rec.map_names() == ["blocks.0.attn.weights", "blocks.1.attn.weights"]
    w = rec.weights("blocks.1.attn.weights")  # (H, T, T), bidirectional: upper triangle used
    assert w.shape == (2, 8, 8)
    assert float(w[:, 0, 1:].sum()) > 0
    assert rec.labels("blocks.0.attn.weights") == (list("the bank"), list("the bank"))


def _seq2seq_recording() -> Recording:
    """Names as a seq2seq Transformer and an LSTM decoder would record them."""
    src, tgt = ["le", "chat", "noir"], ["<s>", "the", "black", "cat"]
    c = ActivationCache()
    c["encoder.blocks.0.attn.weights"] = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    c["decoder.blocks.0.attn.weights"] = torch.softmax(torch.randn(1, 2, 4, 4), -1)
    c["decoder.blocks.0.cross.weights"] = torch.softmax(torch.randn(1, 2, 4, 3), -1)
    c["decoder.attn.weights"] = torch.softmax(torch.randn(1, 1, 4, 3), -1)  # LSTM: H = 1
    return Recording(c, {"encoder": src, "decoder": tgt}, memory_stack="encoder")


def test_cross_attention_maps_take_queries_and_keys_from_different_stacks():
    rec = _seq2seq_recording()
    src, tgt = rec.tokens["encoder"], rec.tokens["decoder"]
    kinds = {m.name: (m.stack, m.kind, m.query_stack, m.key_stack) for m in rec.maps()}
    assert kinds == {
        "encoder.blocks.0.attn.weights": ("encoder", "self", "encoder", "encoder"),
        "decoder.blocks.0.attn.weights": ("decoder", "self", "decoder", "decoder"),
        "decoder.blocks.0.cross.weights": ("decoder", "cross", "decoder", "encoder"),
        "decoder.attn.weights": ("decoder", "cross", "decoder", "encoder"),  # keys by length
    }
    assert rec.labels("decoder.blocks.0.cross.weights") == (tgt, src)
    assert rec.labels("encoder.blocks.0.attn.weights") == (src, src)
    assert rec.select(name="cross").name == "decoder.blocks.0.cross.weights"
    assert rec.select(layer=0, name="decoder").name == "decoder.blocks.0.attn.weights"


def test_select_and_encode_report_bad_input_clearly():
    tok = char_tokenizer()
    model = tiny_gpt(tok, block_size=8).eval()
    rec = record(model, tok, "I like")
    with pytest.raises(InspectError, match="no layer 5; this model has layers 0..1"):
        rec.select(layer=5)
    with pytest.raises(InspectError, match="no attention map matches 'cross'"):
        rec.select(name="cross")
    with pytest.raises(InspectError, match="reads at most 8"):
        record(model, tok, "I like to eat apples")
    with pytest.raises(InspectError, match="no tokens"):
        record(model, tok, "")


def test_maps_without_blocks_get_a_readable_label():
    rec = _seq2seq_recording()
    lstm = next(m for m in rec.maps() if m.name == "decoder.attn.weights")
    assert (lstm.layer, lstm.label) == (None, "decoder attn cross")
