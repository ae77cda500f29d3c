"""Sampling: the KV cache changes nothing but speed; every option does what it says."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.blocks import FeedForward
from attnlab.decoding import FastForward, decoder_for
from attnlab.generation import (
    SamplingConfig,
    apply_repetition_penalty,
    beam_search,
    filter_logits,
    generate,
    generate_ids,
    greedy,
    pad_ids,
    translate,
)
from attnlab.hooks import record
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tokenizers import BOS, EOS, PAD, CharTokenizer, PairTokenizer
from lm_helpers import tiny_gpt

TOK = CharTokenizer("abcdefghij klmnopqr\n")  # 20 characters for a vocab of 20


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_generation_matches_uncached(pos, temperature):
    model = tiny_gpt(pos=pos, block_size=16).eval()
    prompt = torch.randint(0, 20, (3, 5))
    # 30 new tokens: past block_size 16, so the cropped-window path runs too
    cfg = SamplingConfig(max_new_tokens=30, temperature=temperature, top_k=10, seed=7)
    cached = generate_ids(model, prompt, cfg, use_cache=True)
    uncached = generate_ids(model, prompt, cfg, use_cache=False)
    assert cached.shape == (3, 30) and torch.equal(cached, uncached)


def test_same_seed_same_text_other_seed_other_text():
    model = tiny_gpt().eval()
    run = lambda seed: generate(model, TOK, "abc", SamplingConfig(40, 1.0, seed=seed))[0].text
    assert run(1) == run(1) and run(1) != run(2)


def test_greedy_is_the_argmax_of_the_model():
    model = tiny_gpt().eval()
    ids = torch.tensor([[1, 2, 3]])
    out = generate_ids(model, ids, SamplingConfig(3, temperature=0.0))
    for t in range(3):
        with torch.no_grad():
            assert int(out[0, t]) == int(model(ids)[0, -1].argmax())
        ids = torch.cat([ids, out[:, t : t + 1]], dim=1)


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.randn(4, 50)
    kept = filter_logits(logits, top_k=7).isfinite()
    assert (kept.sum(-1) == 7).all()
    assert torch.equal(kept, logits >= logits.topk(7).values[:, -1:])


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.randn(6, 30)
    for p in (0.1, 0.5, 0.9):
        kept = filter_logits(logits, top_p=p).isfinite()
        probs = logits.softmax(-1)
        mass = (probs * kept).sum(-1)
        assert (mass >= p - 1e-6).all()
        smallest_kept = torch.where(kept, probs, torch.inf).amin(-1)  # dropping it falls below p
        assert (mass - smallest_kept < p + 1e-6).all()


def test_repetition_penalty_lowers_seen_tokens_only():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = apply_repetition_penalty(logits, seen, 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0]]


def test_stop_string_cuts_the_text():
    model = tiny_gpt().eval()
    full = generate(model, TOK, "ab", SamplingConfig(60, 1.0, seed=3))[0].text
    stop = full[10:12]
    cut = generate(model, TOK, "ab", SamplingConfig(60, 1.0, seed=3), stop=[stop])[0]
    assert cut.stopped and cut.text == full[: full.find(stop)]


def test_batch_of_prompts_and_streaming():
    model = tiny_gpt().eval()
    cfg = SamplingConfig(12, 0.0)
    batch = generate(model, TOK, ["abc", "de", "fgh"], cfg, num_samples=2)
    assert [s.prompt for s in batch] == ["abc", "abc", "de", "de", "fgh", "fgh"]
    single = generate(model, TOK, "de", cfg)[0]
    assert batch[2].text == single.text  # batched rows equal a lone run (greedy)
    pieces = []
    streamed = generate(model, TOK, "de", cfg, stream=pieces.append)[0]
    assert "".join(pieces) == streamed.text == single.text


@pytest.mark.parametrize(
    "bad",
    [
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(max_new_tokens=-1),
        dict(temperature=-1.0),
        dict(top_k=0),
    ],
)
def test_invalid_sampling_options_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


# ---------------------------------------------------------------------------------------------
# One protocol for every generative model: GPT, the encoder-decoder Transformer, the LSTMs
# ---------------------------------------------------------------------------------------------


def _encoder_decoders():
    from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    yield Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=23, tgt_vocab_size=23, max_len=40,
                                           d_model=32, dropout=0.0)).eval()  # fmt: skip
    for score in ("none", "dot"):
        yield RNNSeq2Seq(RNNConfig(23, 23, 16, 24, attention=score)).eval()


ENCDEC = list(_encoder_decoders())
PAIR = PairTokenizer(CharTokenizer("abcdefghij klmnopqrst"), CharTokenizer("abcdefghij klmnopqrst"))


def test_gpt_step_takes_several_tokens_or_one_at_a_time():
    dec = decoder_for(tiny_gpt().eval())
    ids = torch.randint(0, 20, (2, 9))
    a = dec.start(ids[:, :4], 6)
    b = dec.start(ids[:, :1], 9)
    one_pass = dec.step(a, ids[:, 3:])  # the prompt's last token and 5 more, in one pass
    for t in range(9):  # the prompt's one token, then 8 more
        one_at_a_time = dec.step(b, ids[:, t])
    torch.testing.assert_close(one_pass, one_at_a_time, atol=1e-5, rtol=0)


def test_gpt_beam_of_one_is_greedy_and_a_wide_beam_is_exhaustive():
    import itertools

    model = tiny_gpt(vocab=3, block_size=8).eval()
    for p in model.parameters():
        p.data.mul_(3)
    prompt = torch.tensor([[0, 2, 1]])
    assert beam_search(model, prompt, beam=1, max_len=12)[0].tokens == greedy(model, prompt, 12)[0]

    def logprob(ys):
        ids = torch.cat([prompt, torch.tensor([ys])], 1)
        with torch.no_grad():
            logp = torch.log_softmax(model(ids), -1)[0]
        return float(sum(logp[prompt.size(1) - 1 + t, y] for t, y in enumerate(ys)))

    best = max(itertools.product(range(3), repeat=3), key=logprob)  # every continuation
    hyp = beam_search(model, prompt, beam=9, alpha=0.0, max_len=3)[0]
    assert hyp.tokens == list(best) and not hyp.finished
    assert abs(hyp.logprob - logprob(list(best))) < 1e-4


@pytest.mark.parametrize("model", ENCDEC, ids=["transformer", "lstm", "lstm-attention"])
def test_sampling_from_an_encoder_decoder(model):
    texts = ["abc", "hello", "fig"]
    cfg = SamplingConfig(None, temperature=1.0, seed=3)
    run = lambda: generate(model, PAIR, texts, cfg, num_samples=2)
    first, again = run(), run()
    assert [s.text for s in first] == [s.text for s in again]  # the seed decides
    assert len({s.text for s in first}) > 1  # and the samples differ
    for s in first:
        assert all(i > EOS for i in s.ids) and s.text == PAIR.decode_target(s.ids)
        assert len(s.ids) <= 2 * len(PAIR.encode_source(s.prompt)) + 10
    greedy_texts = [s.text for s in generate(model, PAIR, texts, SamplingConfig(12, 0.0))]
    assert greedy_texts == translate(model, PAIR, texts, max_len=12)


@pytest.mark.parametrize("model", ENCDEC[:2], ids=["transformer", "lstm"])
def test_encoder_decoder_samples_follow_the_model_distribution(model):
    """The first output token of 4000 samples, against the model's own probabilities."""
    src = pad_ids([PAIR.encode_source("bad cafe")] * 4000)
    cfg = SamplingConfig(1, temperature=1.0, seed=0)
    first = generate_ids(model, src, cfg)[:, 0]
    with torch.no_grad():
        dec = decoder_for(model)
        logp = dec.step(dec.start(src[:1], 2), torch.tensor([BOS]))[0]
    logp[[PAD, BOS]] = float("-inf")
    expected = logp.softmax(-1)
    observed = torch.bincount(first, minlength=expected.numel()).float() / first.numel()
    assert float((observed - expected).abs().max()) < 0.03  # ~4 standard errors at p = 0.5


def test_encoder_decoder_output_streams_and_stops_at_a_string():
    model = ENCDEC[0]
    cfg = SamplingConfig(None, temperature=1.0, seed=1)
    full = generate(model, PAIR, "abcdef", cfg)[0]
    pieces = []
    streamed = generate(model, PAIR, "abcdef", cfg, stream=pieces.append)[0]
    assert "".join(pieces) == streamed.text == full.text and len(full.text) >= 3
    cut = generate(model, PAIR, "abcdef", cfg, stop=[full.text[1:3]])[0]
    assert cut.stopped and cut.text == full.text[: full.text.find(full.text[1:3])]


def test_window_options_are_refused_for_an_encoder_decoder():
    with pytest.raises(ValueError, match="not to an encoder-decoder"):
        generate(ENCDEC[0], PAIR, "abc", window="shift")


# Every GPTConfig field, drawn: FastForward restates GPT.forward, so each option the model has
# must be shown to give the same logits both ways (a new field fails the test below until it
# is drawn here too).
FIELDS = {
    "vocab_size": st.integers(2, 30),
    "block_size": st.integers(1, 12),
    "n_layer": st.integers(1, 3),
    "n_head": st.sampled_from([1, 2, 4]),
    "d_model": st.sampled_from([2, 4, 8]),  # head width; d_model = n_head * this
    "d_ff": st.sampled_from([None, 8, 24]),
    "dropout": st.sampled_from([0.0, 0.3]),  # eval mode: no effect either way
    "bias": st.booleans(),
    "pos": st.sampled_from(["learned", "sinusoidal", "rotary"]),
    "norm_first": st.booleans(),
    "activation": st.sampled_from(["gelu", "gelu_tanh", "relu", "silu", "gelu_new"]),
    "ln_eps": st.sampled_from([1e-5, 1e-3]),
    "tie_weights": st.booleans(),
    "mlp": st.booleans(),  # False: attention-only blocks
    # the modern-decoder pieces (Llama, Mistral, Qwen, Gemma, NeoX): _valid makes the drawn
    # combination one GPTConfig accepts
    "norm": st.sampled_from(["layer", "rms", "rms-gemma", "none"]),
    "ffn": st.sampled_from(["mlp", "gated"]),
    "n_kv_heads": st.sampled_from([None, 1, 2]),  # 2: GQA where n_head is 4, else MHA
    "head_dim": st.sampled_from([None, 6]),
    "rotary": st.sampled_from(["pairs", "half"]),
    "rot_dim": st.sampled_from([None, 2]),
    "rope_base": st.sampled_from([10000.0, 500.0]),
    "rope_scaling": st.sampled_from([None, {"kind": "linear", "factor": 2.0}]),
    "local_rope_base": st.sampled_from([None, 100.0]),
    "sliding_window": st.sampled_from([None, 1, 3]),
    "layer_types": st.sampled_from([None, ["sliding", "full"], ["full", "sliding", "full"]]),
    "qk_norm": st.booleans(),
    "qkv_bias": st.sampled_from([None, True, False]),
    "out_bias": st.sampled_from([None, True, False]),
    "attn_scale": st.sampled_from([None, 0.5]),
    "attn_softcap": st.sampled_from([None, 2.0]),
    "final_softcap": st.sampled_from([None, 3.0]),
    "parallel": st.booleans(),
    "post_norms": st.booleans(),
    "embed_scale": st.booleans(),
    "layout": st.sampled_from([None, "pre", "post", "parallel", "four-norm"]),
    "attention": st.sampled_from(["softmax", "softmax1", "sigmoid"]),
    "zero_init": st.booleans(),
}  # fmt: skip


def _valid(fields: dict) -> dict:
    """A drawn combination made one GPTConfig accepts: RMS norms and QK-norm are pre-norm,
    QK-norm needs an RMS norm, the rotary options need rotary positions (rot_dim, scaling and
    a local base the rotate-half layout), K/V heads divide the query heads, sliding layers need
    a window, parallel and four-norm blocks are pre-norm with a feed-forward and not both, and
    a layout named stands for all of those flags."""
    if fields["norm"] != "layer":
        fields["norm_first"] = True
    fields["qk_norm"] = fields["qk_norm"] and fields["norm"] in ("rms", "rms-gemma")
    if fields["pos"] != "rotary":
        fields["rotary"] = "pairs"
    if fields["rotary"] != "half":
        fields["rot_dim"] = fields["rope_scaling"] = fields["local_rope_base"] = None
    if fields["n_head"] % (fields["n_kv_heads"] or 1):
        fields["n_kv_heads"] = None
    if fields["sliding_window"] is None:
        fields["layer_types"] = None
    fields["post_norms"] = fields["post_norms"] and not fields["parallel"]
    if not fields["norm_first"] or not fields["mlp"] or fields["layout"] is not None:
        fields["parallel"] = fields["post_norms"] = False
    if fields["layout"] in ("parallel", "four-norm") and not fields["mlp"]:
        fields["layout"] = "pre"
    return fields


def test_the_fast_path_test_draws_every_config_field():
    assert {f.name for f in dataclasses.fields(GPTConfig)} == set(FIELDS)


@settings(max_examples=60, deadline=None)
@given(fields=st.fixed_dictionaries(FIELDS), seed=st.integers(0, 2**16), data=st.data())
def test_fast_forward_is_the_forward_pass(fields, seed, data):
    """What decoding runs equals GPT.forward to 1e-4 of the largest logit (float32 sums taken in
    another order differ by that much once norm-free layers grow the logits): a whole window
    without a cache; a prefix into the cache, then one token at a time."""
    fields["d_model"] *= fields["n_head"]
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**_valid(fields))).eval()
    for p in model.parameters():
        p.data.add_(torch.randn_like(p) * 0.3)
    assert FastForward.applies(model)
    fast = FastForward(model)
    T = fields["block_size"]
    prefix = data.draw(st.integers(1, T), label="prefix")
    ids = torch.randint(0, fields["vocab_size"], (2, T))
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
        tol = 1e-4 * max(1.0, float(full.abs().max()))
        torch.testing.assert_close(fast(ids, None), full[:, -1], atol=tol, rtol=1e-5)
        cache = model.new_cache(2)
        got = [fast(ids[:, :prefix], cache)]
        got += [fast(ids[:, t : t + 1], cache) for t in range(prefix, T)]
    torch.testing.assert_close(torch.stack(got, 1), full[:, prefix - 1 :], atol=tol, rtol=1e-5)


LLAMA = dict(vocab_size=30, block_size=16, n_layer=2, n_head=4, d_model=32, norm="rms",
             ffn="gated", activation="silu", pos="rotary", rotary="half", n_kv_heads=2,
             bias=False, tie_weights=False)  # fmt: skip


@pytest.mark.parametrize("extra", [{}, {"qk_norm": True, "n_kv_heads": 1}], ids=["llama", "qwen3"])
def test_a_llama_decodes_on_the_fast_path_with_the_forward_pass_tokens(extra):
    """--arch llama's shape (RMSNorm, SwiGLU, rotate-half, GQA) and Qwen3's (QK-norm, MQA)
    decode through FastForward, and sampling past the block picks the tokens forward picks."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**LLAMA, **extra})).eval()
    for p in model.parameters():
        p.data.add_(torch.randn_like(p) * 0.3)
    prompt = torch.randint(0, 30, (2, 5))
    dec = decoder_for(model)
    assert dec.start(prompt, 8).path == "FastForward"
    cfg = SamplingConfig(max_new_tokens=40, temperature=1.0, top_k=10, seed=3)
    fast = generate_ids(model, prompt, cfg)  # past block 16: the window slides
    for block in model.blocks:  # reference attention: decoding steps aside to forward
        block.attn.use_fused = False
    assert dec.start(prompt, 8).path == "forward"
    assert torch.equal(fast, generate_ids(model, prompt, cfg))


# each modern option with what it needs beside it
MODERN = {
    "local_rope_base": 100.0, "sliding_window": 2, "layer_types": ["sliding"],
    "attn_softcap": 5.0, "final_softcap": 3.0, "parallel": True, "post_norms": True,
    "embed_scale": True,
}  # fmt: skip
NEEDS = {"local_rope_base": {"pos": "rotary", "rotary": "half", "sliding_window": 2,
                             "layer_types": ["sliding"]},
         "layer_types": {"sliding_window": 2}}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MODERN))
def test_fast_forward_restates_the_modern_decoders(name):
    """Each of Gemma's and NeoX's options (four norms, softcaps, windows by layer, a local
    rope base, scaled embeddings, parallel blocks) decodes on the fast path, and its cached
    decoding equals the full pass."""
    fields = dict(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8)
    fields.update(NEEDS.get(name, {}), **{name: MODERN[name]})
    torch.manual_seed(0)
    model = GPT(GPTConfig(**fields)).eval()
    for p in model.parameters():
        p.data.add_(torch.randn_like(p) * 0.3)
    ids = torch.randint(0, 11, (2, 8))
    assert FastForward.applies(model)
    fast = FastForward(model)
    with torch.no_grad():
        full = model(ids)
        torch.testing.assert_close(fast(ids, None), full[:, -1], atol=1e-5, rtol=1e-5)
        cache = model.new_cache(2)
        steps = [fast(ids[:, :3], cache)] + [fast(ids[:, t : t + 1], cache) for t in range(3, 8)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 2:], atol=1e-5, rtol=1e-5)


def test_a_sliding_window_refuses_the_ring_cache_on_the_fast_path_as_in_forward():
    """A sliding window smaller than a ring cache could not be masked once the ring wraps (its
    slots are no longer in position order): both paths refuse it in one line."""
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8,
                          pos="rotary", sliding_window=3)).eval()  # fmt: skip
    ids = torch.randint(0, 11, (1, 4))
    for run in (lambda c: model(ids, cache=c), lambda c: FastForward(model)(ids, c)):
        with pytest.raises(ValueError, match="cannot hold a sliding window of 3"):
            run(model.new_cache(1, 8, ring=True))


class _ScaledFeedForward(FeedForward):
    def forward(self, x):
        return 2 * super().forward(x)


class _OwnForward(GPT):
    def forward(self, ids, **kw):
        return super().forward(ids, **kw) * 0.5


def _swap_mlp(model):
    model.blocks[-1].mlp.__class__ = _ScaledFeedForward


def _train_a_block(model):
    model.blocks[0].train()


def _reference_attention(model):
    model.blocks[0].attn.use_fused = False


def _torch_hook(model):
    model.blocks[0].mlp.fc1.register_forward_hook(lambda m, i, o: o * 0.0)


def _own_forward(model):
    model.__class__ = _OwnForward


@pytest.mark.parametrize("change", [_swap_mlp, _train_a_block, _reference_attention, _torch_hook,
                                    _own_forward])  # fmt: skip
def test_decoding_steps_aside_for_what_fast_forward_does_not_restate(change):
    """A module kind it does not mirror (here a FeedForward subclass), a block in training
    mode, reference attention, a torch hook, an overridden forward: decoding runs forward
    (dropout is 0, so a block in training mode still gives the eval-mode outputs)."""
    model = tiny_gpt(pos="rotary").eval()
    for p in model.parameters():
        p.data.mul_(3)
    assert FastForward.applies(model)
    change(model)
    assert not FastForward.applies(model)
    ids = torch.randint(0, 20, (2, 12))
    dec = decoder_for(model)
    state = dec.start(ids[:, :3], 12)
    got = [dec.step(state, ids[:, 2])] + [dec.step(state, ids[:, t]) for t in range(3, 12)]
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).float(), -1)[:, 2:]
    torch.testing.assert_close(torch.stack(got, 1), ref, atol=1e-5, rtol=0)


def test_decoding_runs_the_forward_pass_while_a_hook_edits_it():
    """An ablation edit must reach generation: the fast path steps aside for it."""
    model = tiny_gpt(pos="rotary").eval()
    for p in model.parameters():
        p.data.mul_(3)
    prompt = torch.tensor([[1, 2, 3]])
    cfg = SamplingConfig(20, temperature=0.0)
    plain = generate_ids(model, prompt, cfg)
    banned = torch.nn.functional.one_hot(plain[0, 0], 20) * 1e4  # what greedy chose first
    kill = {"logits": lambda x, name: x - banned}
    with record(model, names=[], edit=kill):
        assert not FastForward.applies(model)
        edited = generate_ids(model, prompt, cfg)
    with torch.no_grad(), record(model, names=[], edit=kill):
        ids = prompt
        for _ in range(20):  # greedy by hand through the edited forward pass
            ids = torch.cat([ids, model(ids[:, -16:])[:, -1:].argmax(-1)], 1)
    assert torch.equal(edited, ids[:, 3:]) and not torch.equal(edited, plain)
    assert FastForward.applies(model)  # the edit is gone with its `with` block
