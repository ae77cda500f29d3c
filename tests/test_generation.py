"""Sampling: the KV cache changes nothing but speed; every option does what it says."""

from __future__ import annotations

import pytest
import torch

from attnlab.generation import (
    SamplingConfig,
    apply_repetition_penalty,
    filter_logits,
    generate,
    generate_ids,
)
from attnlab.tokenizers import CharTokenizer
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
