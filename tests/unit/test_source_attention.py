"""Each decoder step's attention over the source (attnlab.inspect.source_attention), and the
LSTM pieces that let its attention split over the words: the scaled-dot score, and attention
kept off the source's <eos>."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.config import ConfigError
from attnlab.inspect import record
from attnlab.inspect.recording import InspectError
from attnlab.inspect.source_attention import side_by_side, source_attention, word_groups
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.tokenizers import EOS, PairTokenizer, WordTokenizer

PHRASES = "let's go home and eat apples vamos a casa comer manzanas"


@pytest.fixture(scope="module")
def tok() -> PairTokenizer:
    words = WordTokenizer.from_text(PHRASES)
    return PairTokenizer(words, words)


def lstm(tok, **kw) -> RNNSeq2Seq:
    torch.manual_seed(0)
    cfg = dict(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_embed=8,
               d_hidden=16, attention="scaled-dot")  # fmt: skip
    return RNNSeq2Seq(RNNConfig(**{**cfg, **kw})).eval()


def transformer(tok) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(Seq2SeqConfig(
        src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, max_len=32,
        n_encoder_layers=2, n_decoder_layers=2, n_head=2, d_model=16, dropout=0.0)).eval()  # fmt: skip


# -- the LSTM's pieces ----------------------------------------------------------------------------


def test_the_scaled_dot_score_is_the_dot_score_over_sqrt_c(tok):
    src = torch.tensor([tok.encode_source("let's go home")])
    tgt = torch.tensor([[1, 5, 6]])
    dot, scaled = lstm(tok, attention="dot"), lstm(tok)
    scaled.load_state_dict(dot.state_dict())
    with torch.no_grad():
        _, a = dot(src, tgt, record=True)
        _, b = scaled(src, tgt, record=True)
    np.testing.assert_allclose(b["decoder.attn.scores"].numpy(),
                               a["decoder.attn.scores"].numpy() / math.sqrt(16), rtol=1e-5)  # fmt: skip


def test_attention_off_eos_gives_eos_nothing_and_sums_to_one_over_the_words(tok):
    model = lstm(tok, attend_eos=False)
    src = torch.tensor([tok.encode_source("let's go"), tok.encode_source("let's go home")[:5]])
    src[0, -1] = EOS
    with torch.no_grad():
        _, acts = model(src, torch.tensor([[1, 5], [1, 6]]), record=True)
    w = acts["decoder.attn.weights"][:, 0]  # (B, T, S)
    eos = src == EOS
    assert w[eos[:, None, :].expand_as(w)].abs().max() == 0.0
    np.testing.assert_allclose(w.sum(-1).numpy(), 1.0, atol=1e-6)
    assert "not <eos>'s" in model.describe()


def test_attend_eos_needs_an_attention():
    with pytest.raises(ConfigError, match="attend_eos"):
        RNNConfig(attention="none", attend_eos=False)


# -- source attention -----------------------------------------------------------------------------


def test_word_groups_add_up_a_words_tokens():
    groups = word_groups("let's go", ["let", "'", "s", "go", "<eos>"])
    assert groups == [("let's", [0, 1, 2]), ("go", [3]), ("<eos>", [4])]
    bpe = word_groups("the river bank", ["the", "Ġri", "ver", "Ġbank", "</s>"])
    assert bpe == [("the", [0]), ("river", [1, 2]), ("bank", [3]), ("</s>", [4])]
    with pytest.raises(InspectError, match="could not find the token 'zz'"):
        word_groups("let's go", ["let", "zz"])


@pytest.mark.parametrize("build", [lstm, transformer])
def test_one_row_per_decoder_step_summing_to_one(tok, build):
    model = build(tok)
    rec = record(model, tok, "let's go home")
    r = source_attention(rec, tok)
    T = len(rec.tokens["decoder"])
    assert r.weights.shape == (T, len(r.source)) and r.source == rec.tokens["encoder"]
    np.testing.assert_allclose(r.weights.sum(-1), 1.0, atol=1e-6)
    assert r.fed == rec.tokens["decoder"] and r.next[:-1] == r.fed[1:]  # greedy: fed back
    words = source_attention(rec, tok, words=True, text="let's go home")
    assert words.source == ["let's", "go", "home", "<eos>"]
    np.testing.assert_allclose(words.weights[:, 0], r.weights[:, :3].sum(-1))
    d = words.to_dict()
    assert d["tokens"] == r.source and len(d["steps"]) == T and d["steps"][0]["fed"] == "<bos>"


def test_a_transformer_picks_a_layer_and_a_head(tok):
    model = transformer(tok)
    rec = record(model, tok, "let's go")
    mean = source_attention(rec, tok)
    heads = [source_attention(rec, tok, layer=layer, head=h).weights
             for layer in (0, 1) for h in (0, 1)]  # fmt: skip
    np.testing.assert_allclose(mean.weights, np.mean(heads, axis=0), atol=1e-12)
    assert "mean of 2 heads of 2 layers" in mean.label
    assert source_attention(rec, tok, layer=1, head=0).label == "cross-attention layer 1, head 0"
    with pytest.raises(InspectError, match="no layer 5 reads the source; layers 0, 1 do"):
        source_attention(rec, tok, layer=5)
    with pytest.raises(InspectError, match="no head 2"):
        source_attention(rec, tok, head=2)


def test_a_model_with_no_source_is_refused(tok):
    from lm_helpers import tiny_gpt
    from look_helpers import char_tokenizer

    ctok = char_tokenizer()
    rec = record(tiny_gpt(ctok).eval(), ctok, "I like")
    with pytest.raises(InspectError, match="no attention over a source"):
        source_attention(rec, ctok)


def test_side_by_side_draws_every_model_labelled(tok, tmp_path):
    results = [source_attention(record(b(tok), tok, "let's go"), tok, words=True, text="let's go")
               for b in (lstm, transformer)]  # fmt: skip
    sb = side_by_side(results, ["LSTM", "Transformer"], "let's go")
    fig = sb.figure()
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[0].startswith("LSTM\n") and titles[1].startswith("Transformer\n")
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["let's", "go", "<eos>"]
    png = sb.save_png(tmp_path / "a.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    d = sb.to_dict()
    assert [m["model"] for m in d["models"]] == ["LSTM", "Transformer"]
    assert "LSTM" in sb._repr_html_() and "let&#x27;s" in sb._repr_html_()
