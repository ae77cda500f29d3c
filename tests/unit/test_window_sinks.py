"""The sinks window (StreamingLLM, Xiao et al. 2023): past block_size, each token attends to the
first K tokens and to the last block_size - K, every key and value computed once, when fed,
with the positions the cache gives (the sinks just before the window). Checked against that
definition written out here, and, with one layer, against a fresh forward pass over the first
K tokens and the last block_size - K."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import SinkKVCache
from attnlab.decoding import decoder_for, window_policy
from attnlab.generation import SamplingConfig, beam_search, generate_ids, greedy
from attnlab.positional import Rotary
from lm_helpers import tiny_gpt
from sinks_helpers import sharpened, sinks_reference, step_logps

BLOCK, V = 8, 20
LLAMA = dict(norm="rms", ffn="gated", activation="silu", rotary="half", n_kv_heads=1, bias=False,
             tie_weights=False, n_head=2)  # fmt: skip


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("k, prompt_len", [(4, 3), (1, BLOCK + 5), (BLOCK - 1, 2)])
def test_cached_sinks_equal_their_definition_recomputed(arch, k, prompt_len):
    torch.manual_seed(0)
    extra = LLAMA if arch == "llama" else {}
    model = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK, n_layer=3, **extra))
    ids = torch.randint(0, V, (2, 6 * BLOCK))  # the ring re-bases its positions 10 times
    got = step_logps(model, ids, prompt_len, f"sinks:{k}")
    ref = sinks_reference(model, ids, k)[:, prompt_len - 1 :]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_with_one_layer_sinks_are_a_fresh_pass_over_the_first_and_the_last_tokens():
    """StreamingLLM's positions: the first K tokens then the last block - K, as one context."""
    torch.manual_seed(1)
    model = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK, n_layer=1))
    ids = torch.randint(0, V, (2, 5 * BLOCK))
    got = step_logps(model, ids, 1, "sinks:3")
    for i, c in enumerate(range(1, ids.size(1) + 1)):  # c tokens of context
        ctx = ids[:, :c] if c <= BLOCK else torch.cat([ids[:, :3], ids[:, c - (BLOCK - 3) : c]], 1)
        ref = F.log_softmax(model(ctx)[:, -1].float(), -1)
        torch.testing.assert_close(got[:, i], ref, atol=1e-5, rtol=0)


def test_sinks_differ_from_ring_past_the_block_and_equal_it_within():
    torch.manual_seed(2)
    model = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK, n_layer=2))
    ids = torch.randint(0, V, (2, 4 * BLOCK))
    sinks, ring = step_logps(model, ids, 2, "sinks"), step_logps(model, ids, 2, "ring")
    within = BLOCK - 2 + 1
    torch.testing.assert_close(sinks[:, :within], ring[:, :within], atol=1e-5, rtol=0)
    assert float((sinks[:, within:] - ring[:, within:]).abs().max()) > 1e-3


def test_generation_and_beam_search_through_the_sinks_window():
    torch.manual_seed(3)
    model = sharpened(tiny_gpt(V, pos="rotary", block_size=BLOCK))
    prompt = torch.randint(0, V, (2, 3))
    out = generate_ids(model, prompt, SamplingConfig(4 * BLOCK, 1.0, seed=5), window="sinks:2")
    assert out.shape == (2, 4 * BLOCK)
    again = generate_ids(model, prompt, SamplingConfig(4 * BLOCK, 1.0, seed=5), window="sinks:2")
    assert torch.equal(out, again)
    best = beam_search(model, prompt[:1], beam=1, max_len=3 * BLOCK, window="sinks")[0]
    assert best.tokens == greedy(model, prompt[:1], 3 * BLOCK, window="sinks")[0]


def test_the_sinks_window_is_refused_where_it_cannot_be_kept():
    dec = decoder_for(tiny_gpt(V, pos="learned", block_size=BLOCK))
    with pytest.raises(ValueError, match="sinks window needs rotary positions"):
        dec.check_window("sinks")
    rot = decoder_for(tiny_gpt(V, pos="rotary", block_size=BLOCK))
    with pytest.raises(ValueError, match="needs the cache"):
        rot.check_window("sinks", use_cache=False)
    for bad in ("sinks:0", f"sinks:{BLOCK}"):
        with pytest.raises(ValueError, match=f"keeps 1 to {BLOCK - 1} first tokens"):
            rot.check_window(bad)
    for bad in ("sinks:x", "ring:2", "sink"):
        with pytest.raises(ValueError, match="window"):
            window_policy(bad)
    assert window_policy("sinks") == ("sinks", 4) and window_policy("ring") == ("ring", 0)


def test_sink_cache_keeps_the_first_slots_and_rings_the_rest():
    rot = Rotary(2, 8)
    cache = SinkKVCache(1, 4, 1, 2, 2, sinks=1, shift=rot.shift)
    vals = torch.arange(7.0).view(1, 1, 7, 1).expand(1, 1, 7, 2)  # value = position
    cache.append(vals[:, :, :4], vals[:, :, :4])
    for t in range(4, 7):
        _, v = cache.append(vals[:, :, t : t + 1], vals[:, :, t : t + 1])
    assert v[0, 0, :, 0].tolist() == [0.0, 4.0, 5.0, 6.0]  # position 0 kept, 4..6 in the ring
    with pytest.raises(ValueError, match="one position at a time"):
        cache.append(vals[:, :, :2], vals[:, :, :2])
    with pytest.raises(ValueError, match="keeps 1 to 3 sinks"):
        SinkKVCache(1, 4, 1, 2, 2, sinks=4, shift=rot.shift)
