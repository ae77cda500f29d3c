"""One decoding protocol (start / step / reorder) for every model that generates: GPT, the
encoder-decoder Transformer and the LSTM encoder-decoders. Each kind's steps equal its full
forward pass (the KV cache changes nothing but speed), reorder is a batch gather, a wide beam is
an exhaustive search, and the tasks' predict speaks through the protocol. Models that do not
generate (encoder, ViT) are refused in one line."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnlab.generation import (
    SamplingConfig,
    beam_generate,
    beam_search,
    decoder_for,
    generate_ids,
    next_token_logprobs,
    pad_ids,
)
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.models.vit import ViT, ViTConfig
from attnlab.tokenizers import BOS, CharTokenizer, PairTokenizer

V = 13


def sharpened(model):
    """Random weights scaled up, so attention is far from uniform and mistakes show."""
    torch.manual_seed(0)
    for p in model.parameters():
        p.data.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def gpt(**kw) -> GPT:
    cfg = dict(vocab_size=V, block_size=10, n_layer=2, n_head=2, d_model=16) | kw
    return sharpened(GPT(GPTConfig(**cfg)))


def transformer(norm_first: bool) -> Seq2SeqTransformer:
    cfg = Seq2SeqConfig(V, V, max_len=24, d_model=16, n_head=2, n_encoder_layers=2, n_decoder_layers=2,
                        dropout=0.0, norm_first=norm_first)  # fmt: skip
    return sharpened(Seq2SeqTransformer(cfg))


def lstm(attention: str) -> RNNSeq2Seq:
    return sharpened(RNNSeq2Seq(RNNConfig(V, V, 8, 12, attention=attention)))


GPTS = {f"gpt-{pos}-{'pre' if pre else 'post'}": (lambda pos=pos, pre=pre: gpt(pos=pos, norm_first=pre))
        for pos in ("learned", "sinusoidal", "rotary") for pre in (True, False)}  # fmt: skip
ENCDECS = {
    "transformer-post": lambda: transformer(False),
    "transformer-pre": lambda: transformer(True),
    **{f"lstm-{a}": (lambda a=a: lstm(a)) for a in ("none", "dot", "general", "additive")},
}


def random_ids(B: int, T: int, seed: int = 1, low: int = 0) -> torch.Tensor:
    return torch.randint(low, V, (B, T), generator=torch.Generator().manual_seed(seed))


def source(B: int) -> torch.Tensor:
    """Sources of different lengths, padded, each ending in <eos> (id 2)."""
    rows = [random_ids(1, n, seed=n, low=3)[0].tolist() + [2] for n in range(3, 3 + B)]
    return pad_ids(rows)


@torch.no_grad()
def gpt_steps(model, ids: torch.Tensor, prompt_len: int, use_cache: bool = True):
    """Log-probs after ids[:, :prompt_len], then after each further token: (B, T - k + 1, V)."""
    T, dec = ids.size(1), decoder_for(model)
    state = dec.start(ids[:, :prompt_len], T - prompt_len + 1, use_cache=use_cache)
    out = [dec.step(state, ids[:, prompt_len - 1])]
    out += [dec.step(state, ids[:, t]) for t in range(prompt_len, T)]
    return torch.stack(out, 1)


@torch.no_grad()
def encdec_steps(model, src, tgt_in):
    dec = decoder_for(model)  # the decoder its kind declares
    state = dec.start(src, tgt_in.size(1))
    return torch.stack([dec.step(state, tgt_in[:, t]) for t in range(tgt_in.size(1))], 1)


# ---------------------------------------------------------------------------------------------
# cache == no cache, for every model kind
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GPTS)
@pytest.mark.parametrize("prompt_len", [1, 4])
def test_gpt_steps_equal_the_full_pass_with_and_without_the_cache(name, prompt_len):
    model = GPTS[name]()
    ids = random_ids(3, 10)  # the whole block
    full = torch.log_softmax(model(ids).float(), -1)[:, prompt_len - 1 :]  # (B, T - k + 1, V)
    torch.testing.assert_close(gpt_steps(model, ids, prompt_len), full, atol=1e-5, rtol=0)
    uncached = gpt_steps(model, ids, prompt_len, use_cache=False)
    torch.testing.assert_close(uncached, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ENCDECS)
def test_encoder_decoder_steps_equal_the_full_pass(name):
    model = ENCDECS[name]()
    src = source(3)
    tgt_in = random_ids(3, 9, seed=5, low=3)
    tgt_in[:, 0] = BOS
    full = torch.log_softmax(model(src, tgt_in).float(), -1)  # (B, T, V) teacher-forced
    torch.testing.assert_close(encdec_steps(model, src, tgt_in), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["gpt-rotary-pre", "gpt-learned-post", *ENCDECS])
def test_reorder_is_a_gather_of_the_batch_rows(name):
    """Steps, reorder(index), more steps == decoding the gathered rows from the start."""
    model = (GPTS | ENCDECS)[name]()
    dec = decoder_for(model)
    index = torch.tensor([2, 0, 0, 1])
    tokens = random_ids(3, 6, seed=7, low=3)
    if name.startswith("gpt"):
        x, first = random_ids(3, 2, seed=8), None
    else:
        x, first = source(3), torch.full((3,), BOS)
    with torch.no_grad():
        a = dec.start(x, 8)
        feed = [first if first is not None else x[:, -1], *tokens.T]  # 7 steps of (B,)
        for t in feed[:3]:
            dec.step(a, t)
        dec.reorder(a, index)
        got = [dec.step(a, t[index]) for t in feed[3:]]
        b = dec.start(x[index], 8)
        for t in feed[:3]:
            dec.step(b, t[index])
        want = [dec.step(b, t[index]) for t in feed[3:]]
    torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# beam search on a GPT is exhaustive when the beam is wide, past the block too
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def slide_logprob(model, prompt: list[int], ys: tuple[int, ...]) -> float:
    """log p(ys | prompt), each token read from the last block_size tokens (nanoGPT)."""
    ctx, total, block = list(prompt), 0.0, model.config.block_size
    for y in ys:
        logp = torch.log_softmax(model(torch.tensor([ctx[-block:]]))[0, -1].float(), -1)
        total += float(logp[y])
        ctx.append(y)
    return total


@pytest.mark.parametrize("pos", ["learned", "rotary"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_wide_beam_on_a_gpt_is_the_exhaustive_search(pos, seed):
    """Vocabulary 3, 4 new tokens after a 3-token prompt, block 5 (so the window slides): a beam
    of 27 >= 3^3 keeps every prefix, so its n-best list is the top of all 81 continuations."""
    torch.manual_seed(seed)
    model = sharpened(GPT(GPTConfig(vocab_size=3, block_size=5, n_layer=2, n_head=2, d_model=8,
                                    pos=pos)))  # fmt: skip
    prompt = torch.randint(0, 3, (1, 3))
    every = sorted(itertools.product(range(3), repeat=4),
                   key=lambda ys: -slide_logprob(model, prompt[0].tolist(), ys))  # fmt: skip
    hyps = beam_search(model, prompt, beam=27, alpha=0.0, max_len=4)
    assert [tuple(h.tokens) for h in hyps[:5]] == every[:5]
    for h in hyps[:5]:
        assert h.logprob == pytest.approx(slide_logprob(model, prompt[0].tolist(), h.tokens),
                                          abs=1e-4)  # fmt: skip
        assert not h.finished  # a GPT has no <eos>: every hypothesis runs the whole length


def test_beam_generate_gives_the_n_best_texts_of_each_prompt():
    tok = CharTokenizer("abc")
    model = sharpened(GPT(GPTConfig(vocab_size=3, block_size=8, n_layer=1, n_head=1, d_model=8)))
    rows = beam_generate(model, tok, ["ab", "c"], beam=4, alpha=0.0, max_new_tokens=3, n_best=2)
    for prompt, row in zip(["ab", "c"], rows):
        hyps = beam_search(model, torch.tensor([tok.encode(prompt)]), 4, 0.0, 3)
        assert [s.text for s in row] == [tok.decode(h.tokens) for h in hyps[:2]]
        assert all(s.prompt == prompt for s in row)


# ---------------------------------------------------------------------------------------------
# the tasks' predict, through the protocol
# ---------------------------------------------------------------------------------------------


def test_language_model_predict_is_the_next_token_distribution_of_the_last_block():
    from attnlab.tasks.lm import LanguageModel

    tok = CharTokenizer("abcdefghijklm")
    model = gpt()
    task = LanguageModel.from_tokens([0, 1], [0, 1], tok)
    text = "abcdefghijklmabcdef"  # 19 characters: past block_size 10
    (pred,) = task.predict(model, [text], top_k=3)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([tok.encode(text)[-10:]]))[0, -1], -1)
    top = probs.topk(3)
    assert [n["token"] for n in pred["next"]] == [tok.decode([i]) for i in top.indices.tolist()]
    assert [n["p"] for n in pred["next"]] == pytest.approx(top.values.tolist(), abs=1e-5)


@pytest.mark.parametrize("name", ["transformer-post", "lstm-dot"])
def test_seq2seq_predict_is_the_greedy_decoding(name):
    from attnlab.generation import greedy
    from attnlab.tasks.seq2seq import Seq2Seq, Seq2SeqOptions

    side = CharTokenizer("abcdefghij")  # 10 + 3 reserved ids = V
    pair = PairTokenizer(side, side)
    task = Seq2Seq(Seq2SeqOptions(data="copy"))
    task.tokenizer = pair
    model = ENCDECS[name]()
    preds = task.predict(model, ["abc", "hij"])
    outs = greedy(model, pad_ids([pair.encode_source(t) for t in ("abc", "hij")]))
    assert [p["output"] for p in preds] == [pair.decode_target(o) for o in outs]
    first = next_token_logprobs(model, pad_ids([pair.encode_source("abc")]))[0]
    assert outs[0][:1] == [int(first.argmax())] or (not outs[0] and int(first.argmax()) == 2)


# ---------------------------------------------------------------------------------------------
# sampling: seeded, from every kind; refused for kinds that do not generate
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt-rotary-pre", "transformer-pre", "lstm-additive"])
def test_seeded_sampling_with_top_k_and_top_p_repeats_and_stays_in_the_filtered_set(name):
    model = (GPTS | ENCDECS)[name]()
    x = random_ids(4, 3, seed=3) if name.startswith("gpt") else source(4)
    cfg = SamplingConfig(12, temperature=1.3, top_k=4, top_p=0.9, seed=11)
    a, b = generate_ids(model, x, cfg), generate_ids(model, x, cfg)
    assert torch.equal(a, b)
    assert not torch.equal(a, generate_ids(model, x, SamplingConfig(12, 1.3, 4, 0.9, seed=12)))
    first = next_token_logprobs(model, x)  # (B, V): every first token is among the top 4
    assert (first.gather(1, a[:, :1]) >= first.topk(4).values[:, -1:]).all()


@pytest.mark.parametrize(
    "model",
    [Encoder(EncoderConfig(vocab_size=V, block_size=8, n_layer=1, n_head=2, d_model=8)),
     ViT(ViTConfig(n_layer=1, n_head=2, d_model=8))],
    ids=["encoder", "vit"],
)  # fmt: skip
def test_models_that_do_not_generate_are_refused_in_one_line(model):
    with pytest.raises(ValueError, match=r"does not generate: decoding needs a GPT or an encoder"):
        generate_ids(model, torch.zeros(1, 3, dtype=torch.long), SamplingConfig(4))


@pytest.mark.parametrize("name", ["gpt-learned-pre", "transformer-post", "lstm-dot"])
def test_decoding_runs_in_eval_mode_and_hands_the_model_back_as_it_came(name):
    """Dropout 0.5 while training: decoding must not see it, and training must go on after."""
    model = (GPTS | ENCDECS)[name]()
    x = random_ids(2, 3, seed=4) if name.startswith("gpt") else source(2)
    cfg = SamplingConfig(6, temperature=0.0)
    want = generate_ids(model, x, cfg)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    model.train()
    assert torch.equal(generate_ids(model, x, cfg), want)
    beam_search(model, x[:1], beam=2, max_len=4)
    next_token_logprobs(model, x)
    assert all(m.training for m in model.modules())


# What would make generation.py ask which kind it holds: an encoder-decoder flag or its
# special ids, the kinds' capabilities (reads, predicts, kind, model_type), a model's config.
KIND_WORDS = {"is_encoder_decoder", "encdec", "encoder_decoder", "reads", "predicts", "kind",
              "model_type", "decoder_start_id", "BOS", "EOS", "tgt_vocab_size", "config",
              "encode_source", "decode_target"}  # fmt: skip
KIND_STRINGS = {"gpt", "source", "encoder-decoder", "seq2seq", "decoder-step", "next-token"}
PLAIN_TYPES = {"str", "int", "float", "bool", "list", "tuple", "dict", "Tensor", "torch"}


def _names(node) -> set[str]:
    import ast

    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def test_generation_knows_no_kind():
    """generation.py speaks the decoding protocol alone (issue 27, item 3): read with ast, it
    imports no model module, tests no class with isinstance, and names no kind word above (as
    a name, an attribute, a getattr / hasattr string or a compared string). On main before the
    protocol it branched on encoder-decoders 7 times and read their special ids by getattr."""
    import ast
    from pathlib import Path

    import attnlab.generation

    tree = ast.parse(Path(attnlab.generation.__file__).read_text())
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("attnlab.models"):
            found.append(f"{n.lineno}: imports {n.module}")
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "isinstance":
            if not (_names(n.args[1]) <= PLAIN_TYPES):  # a class test, not a str / list one
                found.append(f"{n.lineno}: {ast.unparse(n)}")
        elif isinstance(n, ast.Name) and n.id in KIND_WORDS:
            found.append(f"{n.lineno}: {n.id}")
        elif isinstance(n, ast.Attribute) and n.attr in KIND_WORDS:
            found.append(f"{n.lineno}: .{n.attr}")
        elif isinstance(n, ast.Constant) and n.value in KIND_WORDS | KIND_STRINGS:
            found.append(f"{n.lineno}: {n.value!r}")
    assert found == []


@pytest.mark.parametrize("name", [*GPTS][:1] + [*ENCDECS])
def test_a_gpt_and_an_encoder_decoder_decode_through_one_protocol(name):
    """Each kind that decodes declares a decoder of the one protocol (attnlab.decoding.Decoder);
    no model is its own decoder any more, and the decoder says its special tokens."""
    from attnlab.decoding import Decoder

    model = {**GPTS, **ENCDECS}[name]()
    dec = decoder_for(model)
    assert isinstance(dec, Decoder) and dec is not model and dec.model is model
    assert not any(hasattr(type(model), m) for m in ("start", "step", "reorder"))
    if name.startswith("gpt"):
        assert (dec.start_id, dec.end_id, dec.continues_prompt) == (None, None, True)
    else:
        assert (dec.start_id, dec.end_id, dec.never_emit, dec.continues_prompt) == (
            1,
            2,
            (0, 1),
            False,
        )


@pytest.mark.parametrize("verb", ["generate", "translate", "classify"])
def test_the_decoding_verbs_call_the_run_method_of_their_name(verb):
    """`attnlab generate | translate | classify` hand the work to Run.generate | translate |
    classify (the one place each verb's logic lives, the beam-or-sample choice included): the
    verb's module calls ``<run>.<verb>(...)`` and no decoding function of attnlab.generation."""
    import ast
    from pathlib import Path

    import attnlab.cli

    path = Path(attnlab.cli.__file__).parent / f"{verb}.py"
    calls = [n.func for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    attrs = {f.attr for f in calls if isinstance(f, ast.Attribute)}
    assert verb in attrs
    imported = {
        a.name
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.ImportFrom) and n.module == "attnlab.generation"
        for a in n.names
    }
    assert not imported & {"generate", "beam_generate", "beam_search", "greedy", "translate"}
