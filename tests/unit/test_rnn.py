"""The LSTM encoder-decoder, with and without attention."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.data.tasks import collate, encode_pairs, generate
from attnlab.decoding import decoder_for
from attnlab.hooks import record
from attnlab.inspect.recording import record as inspect_record
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.tokenizers import BOS, PAD, CharTokenizer, PairTokenizer

SCORES = ("dot", "general", "additive")


def make(attention="general", **kw) -> RNNSeq2Seq:
    cfg = dict(src_vocab_size=15, tgt_vocab_size=11, d_embed=12, d_hidden=20, attention=attention)
    return RNNSeq2Seq(RNNConfig(**{**cfg, **kw})).eval()


def random_batch(B=5, S=9, T=6):
    lengths = torch.randint(1, S + 1, (B,))
    lengths[0] = S
    src = torch.randint(3, 15, (B, S))
    src[torch.arange(S)[None, :] >= lengths[:, None]] = PAD
    tgt = torch.randint(3, 11, (B, T))
    tgt[:, 0] = BOS
    return src, tgt, lengths


@pytest.mark.parametrize("score", SCORES)
def test_attention_weights_sum_to_one_over_the_source_and_skip_padding(score):
    model = make(score, n_layer=2)
    src, tgt, lengths = random_batch()
    with record(model) as acts:
        model(src, tgt)
    w = acts["decoder.attn.weights"]  # (B, 1, T, S): one head
    assert w.shape == (5, 1, tgt.size(1), src.size(1))
    torch.testing.assert_close(w.sum(-1), torch.ones(5, 1, tgt.size(1)))
    for i, n in enumerate(lengths.tolist()):
        assert float(w[i, :, :, n:].abs().sum()) == 0.0
        assert bool((w[i, :, :, :n] > 0).all())


@pytest.mark.parametrize("score", ("none", *SCORES))
def test_padding_does_not_change_the_output(score):
    model = make(score)
    src, tgt, lengths = random_batch()
    batched = model(src, tgt)  # (B, T, V)
    for i, n in enumerate(lengths.tolist()):
        alone = model(src[i : i + 1, :n], tgt[i : i + 1])
        torch.testing.assert_close(batched[i], alone[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("score", ("none", *SCORES))
def test_step_by_step_decoding_matches_teacher_forcing(score):
    model = make(score, n_layer=2)
    src, tgt, _ = random_batch()
    full = torch.log_softmax(model(src, tgt), -1)  # (B, T, V)
    dec = decoder_for(model)
    state = dec.start(src, max_len=tgt.size(1))
    steps = torch.stack([dec.step(state, tgt[:, t]) for t in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)


def test_without_attention_the_final_state_is_the_only_context():
    model = make("none")
    src, tgt, _ = random_batch()
    with record(model) as acts:
        model(src, tgt)
    assert not [k for k in acts if "attn" in k]
    dec = decoder_for(model)
    state = dec.start(src, max_len=4)
    state["enc"] = torch.randn_like(state["enc"])  # every encoder output but the last state
    torch.testing.assert_close(dec.step(state, tgt[:, 0]), dec.step(dec.start(src, 4), tgt[:, 0]))
    with_attn = decoder_for(make("dot"))
    s1, s2 = with_attn.start(src, 4), with_attn.start(src, 4)
    s2["enc"] = torch.randn_like(s2["enc"])
    assert not torch.allclose(with_attn.step(s1, tgt[:, 0]), with_attn.step(s2, tgt[:, 0]))


def test_config_validates_itself_and_round_trips():
    with pytest.raises(ConfigError):
        RNNConfig(attention="cosine")
    with pytest.raises(ConfigError):
        RNNConfig(d_hidden=0)
    cfg = RNNConfig(attention="additive", n_layer=2)
    assert RNNConfig.from_dict(cfg.to_dict()) == cfg


def test_attention_lstm_learns_to_copy_a_few_sequences():
    torch.manual_seed(0)
    data = generate("copy:n_train=32,n_val=1,n_test=1,min_len=3,max_len=5,symbols=6")
    tok = PairTokenizer(CharTokenizer(data.alphabet[0]), CharTokenizer(data.alphabet[1]))
    src, tgt_in, tgt_out = collate(encode_pairs(tok, data.train))
    model = RNNSeq2Seq(RNNConfig(tok.src_vocab_size, tok.tgt_vocab_size, 16, 32)).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = model.loss(src, tgt_in, tgt_out).item()
    for _ in range(60):
        loss = model.loss(src, tgt_in, tgt_out)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 4


def test_record_text_exposes_the_alignment_under_the_shared_name():
    tok = PairTokenizer(CharTokenizer("abcdefgh "), CharTokenizer("0123"))
    model = make("dot", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size)
    rec = inspect_record(model, tok, "bad cafe")
    w = rec.cache["decoder.attn.weights"]  # (1, 1, T, S)
    assert w.shape == (1, 1, len(rec.tokens["decoder"]), len("bad cafe") + 1)
    assert rec.tokens["encoder"] == [*"bad cafe", "<eos>"]
    assert rec.extra["translation"] == tok.decode_target(
        tok.encode_target(rec.extra["translation"])
    )
