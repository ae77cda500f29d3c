"""Past block_size: what each window policy computes, each against a reference written out here.

slide: the last block_size tokens, recomputed (nanoGPT). shift: the context since the last
half-block boundary that leaves at most block_size tokens. ring (rotary only): sliding-window
attention over the whole sequence, each position's keys and values computed once.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab.attention import RingKVCache
from attnlab.generation import SamplingConfig, decoder_for, generate_ids
from attnlab.models.gpt import GPT
from attnlab.positional import Rotary
from lm_helpers import tiny_gpt

BLOCK = 8
V = 20


def sharpened(model: GPT) -> GPT:
    """A random model whose attention is far from uniform, so stale keys would show."""
    for p in model.parameters():
        p.data.mul_(4)
    return model.eval()


@torch.no_grad()
def step_logps(model, ids: torch.Tensor, prompt_len: int, window: str, use_cache=True):
    """Teacher-force ``ids`` (B, T): the prompt ids[:, :prompt_len], then one token per step.
    Returns the log-probs after each of T - prompt_len + 1 contexts, (B, steps, V)."""
    T, dec = ids.size(1), decoder_for(model)
    state = dec.start(ids[:, :prompt_len], T - prompt_len + 1, window=window, use_cache=use_cache)
    out = [dec.step(state, ids[:, prompt_len - 1])]
    out += [dec.step(state, ids[:, t]) for t in range(prompt_len, T)]
    return torch.stack(out, 1)


@torch.no_grad()
def logp_of(model, context: torch.Tensor) -> torch.Tensor:
    """A fresh forward pass: log-probs of the token after ``context`` (B, T) -> (B, V)."""
    return torch.log_softmax(model(context)[:, -1].float(), -1)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("prompt_len", [3, BLOCK + 5])
def test_slide_equals_recomputing_the_last_block(pos, prompt_len):
    model = sharpened(tiny_gpt(V, pos=pos, block_size=BLOCK))
    ids = torch.randint(0, V, (2, 4 * BLOCK))
    got = step_logps(model, ids, prompt_len, "slide")
    for i, c in enumerate(range(prompt_len, ids.size(1) + 1)):  # c tokens of context
        ref = logp_of(model, ids[:, max(0, c - BLOCK) : c])  # nanoGPT: idx[:, -block_size:]
        torch.testing.assert_close(got[:, i], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", ["slide", "shift"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cache_changes_nothing_but_speed_past_the_block(window, temperature):
    model = sharpened(tiny_gpt(V, pos="learned", block_size=BLOCK))
    prompt = torch.randint(0, V, (3, 5))
    cfg = SamplingConfig(5 * BLOCK, temperature, top_k=10, seed=7)
    cached = generate_ids(model, prompt, cfg, window=window)
    recomputed = generate_ids(model, prompt, cfg, use_cache=False, window=window)
    assert cached.shape == (3, 5 * BLOCK) and torch.equal(cached, recomputed)
    logps = step_logps(model, torch.cat([prompt, cached], 1), 5, window)
    again = step_logps(model, torch.cat([prompt, cached], 1), 5, window, use_cache=False)
    torch.testing.assert_close(logps, again, atol=1e-5, rtol=0)


def shift_windows(tokens: list[int], prompt_len: int, block: int):
    """Reference for shift, by hand: tokens enter a window one at a time; a token arriving at a
    full window first drops its oldest half. Yields the window after the prompt and after
    every later token."""
    window: list[int] = []
    for t, tok in enumerate(tokens):
        if len(window) == block:
            window = window[block // 2 :]
        window.append(tok)
        if t + 1 >= prompt_len:
            yield list(window)


@pytest.mark.parametrize("pos", ["learned", "rotary"])
@pytest.mark.parametrize("prompt_len", [3, 2 * BLOCK + 3])
def test_shift_equals_an_explicit_recompute_of_its_window(pos, prompt_len):
    model = sharpened(tiny_gpt(V, pos=pos, block_size=BLOCK))
    ids = torch.randint(0, V, (1, 5 * BLOCK))
    got = step_logps(model, ids, prompt_len, "shift")
    windows = list(shift_windows(ids[0].tolist(), prompt_len, BLOCK))
    assert len(windows) == got.size(1)
    assert {len(w) for w in windows[-BLOCK:]} == set(range(BLOCK // 2 + 1, BLOCK + 1))
    for i, w in enumerate(windows):
        torch.testing.assert_close(got[:, i], logp_of(model, torch.tensor([w])), atol=1e-5, rtol=0)


@torch.no_grad()
def sliding_window_reference(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """Ring's definition, by hand: one pass over the whole sequence (B, T) in which position t
    attends to positions t - block + 1 .. t in every layer, rotary angles at absolute positions
    (the same weights in a GPT whose rotary table is long enough). Returns (B, T, V) log-probs."""
    T = ids.size(1)
    long = GPT(dataclasses.replace(model.config, block_size=T)).eval()
    long.load_state_dict(model.state_dict())
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    band = (k <= q) & (q - k < model.config.block_size)  # (T, T) True = may attend
    x = long.tok_embed(ids)
    for block in long.blocks:
        x = block(x, mask=band)
    return torch.log_softmax(long.lm_head(long.ln_f(x)).float(), -1)


@pytest.mark.parametrize("prompt_len", [1, 5, 2 * BLOCK + 3])
def test_ring_equals_sliding_window_attention(prompt_len):
    model = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK, n_layer=3))
    ids = torch.randint(0, V, (2, 6 * BLOCK))  # the ring re-bases its positions 10 times
    got = step_logps(model, ids, prompt_len, "ring")
    ref = sliding_window_reference(model, ids)[:, prompt_len - 1 :]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_ring_approximates_slide_past_the_block_and_is_exact_with_one_layer():
    ids = torch.randint(0, V, (2, 4 * BLOCK))
    deep = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK, n_layer=2))
    ring, slide = step_logps(deep, ids, 3, "ring"), step_logps(deep, ids, 3, "slide")
    within = BLOCK - 3 + 1  # contexts of at most block_size tokens
    torch.testing.assert_close(ring[:, :within], slide[:, :within], atol=1e-5, rtol=0)
    assert float((ring[:, within:] - slide[:, within:]).abs().max()) > 1e-3  # stale keys
    # one layer: every key is a function of its token and its position alone, so nothing is stale
    flat = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK, n_layer=1))
    ring, slide = step_logps(flat, ids, 3, "ring"), step_logps(flat, ids, 3, "slide")
    torch.testing.assert_close(ring, slide, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", ["slide", "shift", "ring"])
def test_within_the_block_every_window_is_the_full_forward_pass(window):
    model = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK))
    ids = torch.randint(0, V, (2, BLOCK))
    got = step_logps(model, ids, 2, window)
    ref = torch.log_softmax(model(ids).float(), -1)[:, 1:]  # (B, T - 1, V)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_ring_is_refused_without_rotary_positions(pos):
    dec = decoder_for(tiny_gpt(V, pos=pos))
    with pytest.raises(ValueError, match="ring window needs rotary positions"):
        dec.start(torch.zeros(1, 2, dtype=torch.long), 4, window="ring")
    with pytest.raises(ValueError, match="needs the cache"):
        decoder_for(tiny_gpt(V, pos="rotary")).start(
            torch.zeros(1, 2, dtype=torch.long), 4, window="ring", use_cache=False
        )
    with pytest.raises(ValueError, match="unknown window"):
        dec.check_window("wrap")


def test_ring_cache_overwrites_the_oldest_slot_and_takes_one_position_once_full():
    ring = RingKVCache(1, 3, 1, 2, 2)
    k = torch.arange(4.0).view(1, 1, 4, 1).expand(1, 1, 4, 2)  # positions 0..3, value = position
    ring.append(k[:, :, :3], k[:, :, :3])
    keys, _ = ring.append(k[:, :, 3:], k[:, :, 3:])
    assert keys[0, 0, :, 0].tolist() == [3.0, 1.0, 2.0] and ring.length == 4 and ring.held == 3
    with pytest.raises(ValueError, match="one position at a time"):
        ring.append(k[:, :, :2], k[:, :, :2])


def test_rotary_shift_moves_every_position_down():
    rot = Rotary(8, 16)
    x = torch.randn(2, 3, 5, 8)
    for n in (1, 4, 9):
        torch.testing.assert_close(rot.shift(rot(x, 10), n), rot(x, 10 - n), atol=1e-6, rtol=0)


@pytest.mark.parametrize("window", ["shift", "ring"])
def test_beam_search_reorders_a_moved_window(window):
    """beam = 1 past the block makes greedy's choices, through reorder and every re-prefill."""
    from attnlab.generation import beam_search, greedy

    model = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK))
    prompt = torch.randint(0, V, (1, 3))
    best = beam_search(model, prompt, beam=1, max_len=4 * BLOCK, window=window)[0]
    assert best.tokens == greedy(model, prompt, 4 * BLOCK, window=window)[0]
