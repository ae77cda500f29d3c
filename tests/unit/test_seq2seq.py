"""The encoder-decoder Transformer: masks, caches, decoding, recording, save/load."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.checks import find_future_leak
from attnlab.config import ConfigError
from attnlab.decoding import decoder_for
from attnlab.generation import beam_search, greedy, pad_ids
from attnlab.hooks import record
from attnlab.inspect.recording import record as inspect_record
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer, noam_lr
from attnlab.run import load_run
from attnlab.rundir import save_model
from attnlab.tokenizers import BOS, EOS, PAD, CharTokenizer, PairTokenizer


def make(norm_first=False, **kw) -> Seq2SeqTransformer:
    cfg = dict(src_vocab_size=17, tgt_vocab_size=13, max_len=40, d_model=32, n_head=4,
               dropout=0.0, norm_first=norm_first)  # fmt: skip
    return Seq2SeqTransformer(Seq2SeqConfig(**{**cfg, **kw})).eval()


def random_batch(B=4, S=9, T=7, V_src=17, V_tgt=13):
    """Sources of random lengths, right-padded; targets starting with <bos>."""
    lengths = torch.randint(1, S + 1, (B,))
    lengths[0] = S
    src = torch.randint(3, V_src, (B, S))
    src[torch.arange(S)[None, :] >= lengths[:, None]] = PAD
    tgt = torch.randint(3, V_tgt, (B, T))
    tgt[:, 0] = BOS
    return src, tgt, lengths


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_output_does_not_depend_on_padding(norm_first):
    model = make(norm_first)
    src, _, lengths = random_batch(B=6, S=11)
    memory, mask = model.encode(src)  # (B, S, C)
    for i, n in enumerate(lengths.tolist()):
        alone, _ = model.encode(src[i : i + 1, :n])  # the same sequence with no padding at all
        torch.testing.assert_close(memory[i, :n], alone[0], atol=1e-5, rtol=1e-4)
        assert mask[i, 0, 0].tolist() == [True] * n + [False] * (src.size(1) - n)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal_given_fixed_memory(norm_first):
    model = make(norm_first)
    src, tgt, _ = random_batch(T=8)
    memory, mask = model.encode(src)
    report = find_future_leak(lambda t: model.decode(t, memory, mask), tgt)
    assert not report.leaks, str(report)


def test_future_leak_probe_catches_a_decoder_without_causal_mask():
    model = make()
    for block in model.decoder.blocks:
        block.causal = False  # the mistake of note 004
    src, tgt, _ = random_batch(T=8)
    memory, mask = model.encode(src)
    assert find_future_leak(lambda t: model.decode(t, memory, mask), tgt).leaks


def test_cross_attention_gives_no_weight_to_source_padding():
    model = make()
    src, tgt, lengths = random_batch(B=5, S=10)
    memory, mask = model.encode(src)
    logits, acts = model(src, tgt, record=True)
    for i in range(model.config.n_decoder_layers):
        w = acts[f"decoder.blocks.{i}.cross.weights"]  # (B, H, T, S)
        assert w.shape == (5, 4, tgt.size(1), 10)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        pads = ~mask[:, :, :, :].expand_as(w)
        assert float(w[pads].abs().sum()) == 0.0
    # and the memory at padded positions cannot move the output
    noisy = memory.clone()
    noisy[~mask[:, 0, 0]] = torch.randn_like(noisy[~mask[:, 0, 0]]) * 10
    torch.testing.assert_close(model.decode(tgt, noisy, mask), logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_matches_full_decoding(norm_first):
    model = make(norm_first)
    src, tgt, _ = random_batch(T=9)
    full = model(src, tgt)  # (B, T, V)
    dec = decoder_for(model)
    state = dec.start(src, max_len=tgt.size(1))
    steps = [dec.step(state, tgt[:, t]) for t in range(tgt.size(1))]  # (B, V) each
    torch.testing.assert_close(
        torch.stack(steps, 1), torch.log_softmax(full, -1), atol=1e-5, rtol=1e-4
    )
    assert state["cache"].length == tgt.size(1)


def test_recorded_attention_names_and_shapes():
    model = make(n_encoder_layers=2, n_decoder_layers=3)
    src, tgt, _ = random_batch(B=2, S=6, T=5)
    logits, acts = model(src, tgt, record=True)
    torch.testing.assert_close(logits, model(src, tgt), atol=1e-5, rtol=1e-4)
    assert acts["encoder.blocks.1.attn.weights"].shape == (2, 4, 6, 6)
    assert acts["decoder.blocks.2.attn.weights"].shape == (2, 4, 5, 5)
    assert acts["decoder.blocks.0.cross.weights"].shape == (2, 4, 5, 6)
    causal = acts["decoder.blocks.0.attn.weights"]
    assert float(causal.triu(1).abs().max()) == 0.0  # nothing above the diagonal


def _models():
    yield make()
    yield make(norm_first=True)
    for score in ("none", "dot", "general", "additive"):
        cfg = RNNConfig(
            src_vocab_size=17, tgt_vocab_size=13, d_embed=16, d_hidden=24, attention=score
        )
        yield RNNSeq2Seq(cfg).eval()


@pytest.mark.parametrize(
    "model", list(_models()), ids=lambda m: getattr(m.config, "attention", "t")
)
def test_beam_width_one_is_greedy(model):
    for p in model.parameters():  # sharpen the random model so outputs vary and often stop early
        p.data.mul_(3)
    src, _, lengths = random_batch(B=6, S=8)
    batched = greedy(model, src, max_len=12)
    for i, n in enumerate(lengths.tolist()):
        one = src[i : i + 1, :n]
        assert greedy(model, one, max_len=12)[0] == batched[i]
        assert beam_search(model, one, beam=1, max_len=12)[0].tokens == batched[i]


@torch.no_grad()
def _sequence_logprob(model, src, tokens, eos=True):
    ys = [*tokens, EOS] if eos else list(tokens)
    logp = torch.log_softmax(model(src, torch.tensor([[BOS, *ys[:-1]]])), -1)[0]  # (T, V)
    return float(sum(logp[t, y] for t, y in enumerate(ys)))


@pytest.mark.parametrize("model", [make(tgt_vocab_size=5), RNNSeq2Seq(RNNConfig(17, 5, 8, 8))])
def test_wide_beam_finds_the_most_probable_output(model):
    """With a beam wider than the number of prefixes, beam search is exhaustive search."""
    model.eval()
    src = torch.randint(3, 17, (1, 5))
    L = 3
    candidates = [(list(y), True) for n in range(L) for y in itertools.product([3, 4], repeat=n)]
    candidates += [
        (list(y), False) for y in itertools.product([3, 4, EOS], repeat=L) if EOS not in y
    ]
    best = max(candidates, key=lambda c: _sequence_logprob(model, src, *c))
    hyp = beam_search(model, src, beam=16, alpha=0.0, max_len=L)[0]
    assert (hyp.tokens, hyp.finished) == tuple(best)
    assert math.isclose(
        hyp.logprob, _sequence_logprob(model, src, *best), rel_tol=1e-4, abs_tol=1e-4
    )


def test_length_penalty_favours_longer_outputs_as_alpha_grows():
    model = make()
    src, _, _ = random_batch(B=1, S=6)
    best = [beam_search(model, src, beam=4, alpha=a, max_len=10)[0] for a in (0, 2, 6)]
    lengths = [len(h.tokens) for h in best]
    assert lengths == sorted(lengths)


def test_label_smoothing_is_the_smoothed_cross_entropy():
    model = make(label_smoothing=0.1)
    src, tgt, _ = random_batch()
    out = torch.randint(3, 13, tgt.shape)
    out[0, -2:] = PAD
    logp = torch.log_softmax(model(src, tgt), -1)[out != PAD]  # (N, V)
    y = out[out != PAD]
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    uniform = -logp.mean(-1)
    expected = (0.9 * nll + 0.1 * uniform).mean()
    torch.testing.assert_close(model.loss(src, tgt, out), expected, atol=1e-5, rtol=1e-5)


def test_noam_schedule_rises_then_decays_as_in_the_paper():
    d, warm = 512, 4000
    peak = noam_lr(warm, d, warm)
    assert math.isclose(peak, d**-0.5 * warm**-0.5)
    assert noam_lr(warm // 2, d, warm) < peak and noam_lr(4 * warm, d, warm) < peak
    assert math.isclose(noam_lr(4 * warm, d, warm), peak / 2)  # 1/sqrt(step) after warmup
    assert math.isclose(noam_lr(10, d, warm), 10 * d**-0.5 * warm**-1.5)


@pytest.mark.parametrize("share", [False, True])
def test_run_directory_round_trip_with_shared_embeddings(tmp_path, share):
    tok = PairTokenizer(CharTokenizer("abcdefghijklmn"), CharTokenizer("abcdefghijklmn"))
    model = make(src_vocab_size=17, tgt_vocab_size=17, share_embeddings=share)
    if share:
        assert model.decoder.tok_embed.weight is model.encoder.tok_embed.weight
    assert model.decoder.lm_head.weight is model.decoder.tok_embed.weight
    save_model(tmp_path, model, tok)
    loaded, tok2 = load_run(tmp_path)
    assert isinstance(tok2, PairTokenizer) and tok2.target.itos == tok.target.itos
    src, tgt, _ = random_batch(V_tgt=17)
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt))
    assert loaded.decoder.lm_head.weight is loaded.decoder.tok_embed.weight


def test_config_validates_itself():
    with pytest.raises(ConfigError):
        Seq2SeqConfig(d_model=30, n_head=4)
    with pytest.raises(ConfigError):
        Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=12, share_embeddings=True)
    with pytest.raises(ConfigError):
        Seq2SeqConfig(label_smoothing=1.0)
    cfg = Seq2SeqConfig(norm_first=True, share_embeddings=True)
    assert Seq2SeqConfig.from_json(cfg.to_json()) == cfg


def test_record_text_gives_tokens_matching_the_maps():
    tok = PairTokenizer(CharTokenizer("abcdefghijklmnop"), CharTokenizer("0123456789"))
    model = make(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size)
    rec = inspect_record(model, tok, "hello")
    w = rec.cache["decoder.blocks.0.cross.weights"]  # (1, H, T, S)
    assert rec.tokens["encoder"] == [*"hello", "<eos>"]
    assert rec.tokens["decoder"][0] == "<bos>"
    assert w.shape[-2:] == (len(rec.tokens["decoder"]), len(rec.tokens["encoder"]))
    assert rec.memory_stack == "encoder"
    q_labels, k_labels = rec.labels("decoder.blocks.0.cross.weights")
    assert k_labels == rec.tokens["encoder"] and q_labels == rec.tokens["decoder"]
    assert len(rec.extra["predicted"]) == w.shape[-2]


def test_pad_ids_and_greedy_stop_at_eos():
    assert pad_ids([[5, 6], [7]]).tolist() == [[5, 6], [7, PAD]]
    model = make()
    src = random_batch()[0]
    assert all(len(o) <= 5 for o in greedy(model, src, max_len=5))
    push_eos = {"decoder.logits": lambda x, name: x + F.one_hot(torch.tensor(EOS), 13) * 100}
    with record(model, names=[], edit=push_eos):  # <eos> overwhelmingly likely: stop at once
        assert greedy(model, src, max_len=5) == [[]] * 4


@pytest.mark.parametrize("kind", ["transformer", "lstm-attention", "lstm"])
def test_attnlab_check_passes_on_encoder_decoders(kind):
    from attnlab.inspect.check import check

    if kind == "transformer":
        model = make()
    else:
        attention = "dot" if kind == "lstm-attention" else "none"
        model = RNNSeq2Seq(RNNConfig(src_vocab_size=20, tgt_vocab_size=15, attention=attention))
    report = check(model.eval())
    assert report.ok, str(report)
    for name in ("future leak", "KV cache == no cache", "padding invariance"):
        assert report[name].passed is True, name


def test_attnlab_check_catches_a_decoder_that_sees_the_future():
    from attnlab.inspect.check import check

    model = make().eval()
    for block in model.decoder.blocks:
        block.causal = False  # the classic mistake: no causal mask in the decoder
    report = check(model)
    assert report["future leak"].passed is False
    assert not report.ok


def test_attention_of_an_lstm_run_needs_no_layer():
    from attnlab.inspect import attention

    tok = PairTokenizer(CharTokenizer("abcdefgh "), CharTokenizer("0123"))
    model = RNNSeq2Seq(
        RNNConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                  attention="additive")
    ).eval()  # fmt: skip
    m = attention(inspect_record(model, tok, "bad cafe"))
    assert m.name == "decoder.attn.weights" and m.kind == "cross"
    assert abs(m.weights.sum(-1) - 1).max() < 1e-5
