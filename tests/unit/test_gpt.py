"""The whole GPT: no future leak, cache == no cache, configs and checkpoints round trip."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.checks import find_future_leak, find_future_leak_grad
from attnlab.config import ConfigError
from attnlab.models.gpt import PRESETS, GPTConfig
from attnlab.run import load_run
from attnlab.rundir import save_model
from attnlab.tokenizers import CharTokenizer
from lm_helpers import tiny_gpt

VARIANTS = [(pos, norm) for pos in ("learned", "sinusoidal", "rotary") for norm in (True, False)]


@pytest.mark.parametrize("pos, norm_first", VARIANTS)
def test_gpt_output_never_depends_on_later_tokens(pos, norm_first):
    model = tiny_gpt(pos=pos, norm_first=norm_first).eval()
    ids = torch.randint(0, 20, (2, 12))
    report = find_future_leak(model, ids)
    assert not report.leaks, report
    # gradient probe through the embeddings: d logits[t] / d embed[j] == 0 for j > t
    pos_table = model.pos_embed(12) if model.pos_embed is not None else 0

    def from_embeddings(x):
        h = x + pos_table
        for block in model.blocks:
            h = block(h)
        return model.lm_head(model.ln_f(h))

    x = model.tok_embed(ids).detach()
    assert not find_future_leak_grad(from_embeddings, x).leaks


def test_leak_probe_catches_a_model_without_the_causal_mask():
    model = tiny_gpt().eval()
    for block in model.blocks:
        block.causal = False
    assert find_future_leak(model, torch.randint(0, 20, (1, 8))).leaks


@pytest.mark.parametrize("pos, norm_first", VARIANTS)
def test_cached_logits_match_uncached(pos, norm_first):
    model = tiny_gpt(pos=pos, norm_first=norm_first).eval()
    ids = torch.randint(0, 20, (3, 16))
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
        cache = model.new_cache(3)
        steps = [model(ids[:, :5], cache=cache)]  # prefill 5, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    n_head=st.integers(1, 4),
    head=st.sampled_from([2, 4, 8]),
    n_layer=st.integers(1, 6),
    pos=st.sampled_from(["learned", "sinusoidal", "rotary"]),
    norm_first=st.booleans(),
    dropout=st.floats(0, 0.9),
    d_ff=st.one_of(st.none(), st.integers(1, 64)),
)
def test_config_json_round_trip(n_head, head, n_layer, pos, norm_first, dropout, d_ff):
    cfg = GPTConfig(
        n_head=n_head,
        d_model=n_head * head,
        n_layer=n_layer,
        pos=pos,
        norm_first=norm_first,
        dropout=dropout,
        d_ff=d_ff,
    )
    assert GPTConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize(
    "bad",
    [
        dict(d_model=30, n_head=4),
        dict(n_layer=0),
        dict(block_size=-1),
        dict(vocab_size=0),
        dict(pos="absolute"),
    ],
)
def test_invalid_configs_are_refused(bad):
    with pytest.raises(ConfigError):
        GPTConfig(**bad)


def test_presets_are_valid_configs():
    assert GPTConfig(**PRESETS["baby"]).d_model == 128
    for fields in PRESETS.values():
        GPTConfig(**fields)


@pytest.mark.parametrize("pos", ["learned", "rotary"])
def test_checkpoint_save_load_is_bit_exact(tmp_path, pos):
    model = tiny_gpt(pos=pos).eval()
    for p in model.parameters():  # move away from the init so a re-init cannot pass
        p.data.add_(torch.randn_like(p) * 0.1)
    tok = CharTokenizer("abcdefghijklmnopqrst")
    save_model(tmp_path / "run", model, tok)
    loaded, tok2 = load_run(tmp_path / "run")
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.lm_head.weight is loaded.tok_embed.weight  # still tied
    ids = torch.randint(0, 20, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    assert tok2.encode("abc") == tok.encode("abc")


@given(
    offset=st.integers(0, 8),
    t=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
@settings(max_examples=25, deadline=None)
def test_rotary_rotates_each_channel_pair_by_position_times_its_frequency(offset, t, seed):
    """(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) at angle position * w_i, on a transposed
    (non-contiguous) head view as attention passes it; and q.k depends only on the distance."""
    from attnlab.positional import Rotary

    g = torch.Generator().manual_seed(seed)
    rot = Rotary(8, 16)
    x = torch.randn(2, t, 3, 8, generator=g).transpose(1, 2)  # (B, H, T, D), as _heads makes
    pos = torch.arange(offset, offset + t, dtype=torch.float32)[:, None]  # (T, 1)
    w = 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)  # (D/2,)
    cos, sin = torch.cos(pos * w), torch.sin(pos * w)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    expected = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    torch.testing.assert_close(rot(x, offset), expected, atol=1e-5, rtol=1e-5)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)
    near = (rot(q, offset + 3) * rot(k, offset)).sum()
    far = (rot(q, 3) * rot(k, 0)).sum()
    torch.testing.assert_close(near, far, atol=1e-5, rtol=1e-5)
