"""Each reader of the residual stream can read its own input: every head's query, key and value
inputs (``attnlab.attention.per_head_inputs``) and each feed-forward's input (the block's
``mlp_in``), so an edit there reaches that one reader alone (what a circuit's edge is)."""

from __future__ import annotations

import pytest
import torch

from attnlab import hooks
from attnlab.attention import MultiHeadAttention, per_head_inputs
from attnlab.blocks import Block
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.t5 import T5, T5Config
from intervene_helpers import perturb

SMALL = dict(vocab_size=20, block_size=16, n_layer=2, n_head=4, d_model=16)
SHAPES = {
    "gpt-2": {},
    "llama (GQA, rotate-half)": dict(norm="rms", ffn="gated", activation="silu", pos="rotary",
                                     rotary="half", n_kv_heads=2, bias=False),
    "gemma (MQA, QK-norm, four norms, softcap)": dict(
        norm="rms-gemma", ffn="gated", activation="gelu_tanh", pos="rotary", rotary="half",
        n_kv_heads=1, head_dim=6, bias=False, qk_norm=True, post_norms=True, attn_softcap=5.0),
    "neox (parallel)": dict(pos="rotary", rotary="half", rot_dim=2, parallel=True),
    "post-norm": dict(norm_first=False),
}  # fmt: skip


def gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return perturb(GPT(GPTConfig(**{**SMALL, **kw})).eval(), 0.3)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_per_head_inputs_change_nothing_while_nothing_edits_them(shape):
    model, ids = gpt(**SHAPES[shape]), torch.randint(0, 20, (2, 9))
    with torch.no_grad():
        want = model(ids)
        with per_head_inputs(model), hooks.record(model) as cache:
            got = model(ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    H, G = model.config.n_head, model.config.n_kv_heads or model.config.n_head
    assert cache["blocks.1.attn.q_in"].shape == (2, H, 9, 16)
    assert cache["blocks.1.attn.k_in"].shape == cache["blocks.1.attn.v_in"].shape == (2, G, 9, 16)
    assert all(not m.per_head for m in model.modules() if isinstance(m, MultiHeadAttention))


def _recorded(model, ids, edit=None):
    with torch.no_grad(), per_head_inputs(model), hooks.record(model, edit=edit or {}) as c:
        model(ids)
    return c


def test_an_edit_of_one_heads_query_input_changes_that_heads_queries_alone():
    model = gpt(**SHAPES["llama (GQA, rotate-half)"])
    ids = torch.randint(0, 20, (2, 9))
    attn = model.blocks[1].attn
    plain = _recorded(model, ids)
    x = plain["blocks.1.ln1"]  # (B, T, C) what attention reads
    new = torch.randn_like(x)

    def edit(t, name):
        t = t.clone()
        t[:, 2] = new  # head 2's own query input
        return t

    c = _recorded(model, ids, {"blocks.1.attn.q_in": edit})
    changed = (c["blocks.1.attn.q"] - plain["blocks.1.attn.q"]).abs().amax(dim=(0, 2, 3))  # (H,)
    assert changed[2] > 1e-3 and torch.all(changed[[0, 1, 3]] == 0)
    torch.testing.assert_close(c["blocks.1.attn.k"], plain["blocks.1.attn.k"])
    # head 2's queries are its rows of W_Q applied to the new input, then rotated
    d = attn.d_k
    q2 = new @ attn.q_proj.weight[2 * d : 3 * d].T  # (B, T, d_k)
    torch.testing.assert_close(c["blocks.1.attn.q"][:, 2], attn.rotary(q2[:, None])[:, 0],
                               atol=1e-5, rtol=1e-5)  # fmt: skip


def test_an_edit_of_a_shared_key_value_heads_input_reaches_its_group_alone():
    """Grouped-query: K/V head 1 serves query heads 2 and 3; editing its key input changes
    those heads' scores and no other head's, and its values stay what they were."""
    model = gpt(**SHAPES["llama (GQA, rotate-half)"])
    ids = torch.randint(0, 20, (1, 7))
    plain = _recorded(model, ids)

    def edit(t, name):
        t = t.clone()
        t[:, 1] = t[:, 1] * 3.0 + 1.0
        return t

    c = _recorded(model, ids, {"blocks.0.attn.k_in": edit})
    k_changed = (c["blocks.0.attn.k"] - plain["blocks.0.attn.k"]).abs().amax(dim=(0, 2, 3))
    assert k_changed[1] > 1e-3 and k_changed[0] == 0
    s_changed = (
        (c["blocks.0.attn.scores"] - plain["blocks.0.attn.scores"]).abs().amax(dim=(0, 2, 3))
    )
    assert torch.all(s_changed[2:] > 1e-4) and torch.all(s_changed[:2] == 0)
    torch.testing.assert_close(c["blocks.0.attn.v"], plain["blocks.0.attn.v"])


def test_cross_attention_keys_read_the_memory_per_head():
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=30, max_len=32, n_encoder_layers=1, n_decoder_layers=1, n_head=2,
                   d_model=16, d_kv=8, d_ff=24, num_buckets=8, max_distance=16, dropout=0.0)  # fmt: skip
    model = T5(cfg).eval()
    src, tgt = torch.randint(3, 30, (1, 6)), torch.randint(3, 30, (1, 4))
    with torch.no_grad():
        want = model(src, tgt)
        with per_head_inputs(model), hooks.record(model) as c:
            got = model(src, tgt)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert c["decoder.blocks.0.cross.k_in"].shape == (1, 2, 6, 16)  # the source's positions
    torch.testing.assert_close(c["decoder.blocks.0.cross.k_in"][:, 1], c["encoder.out"])
    # the relative position bias each self-attention adds is recorded where it is added
    torch.testing.assert_close(c["encoder.blocks.0.attn.position_bias"], c["encoder.position_bias"])


def test_the_feed_forwards_input_is_its_own():
    """An edit of ``mlp_in`` changes what the feed-forward reads, not the stream it adds to."""
    torch.manual_seed(0)
    b = Block(16, 2, 24, causal=True, norm_first=False).eval()  # post-norm: no norm before it
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), hooks.record(b) as plain:
        b(x)
    with torch.no_grad(), hooks.record(b, edit={"mlp_in": lambda t, n: 2 * t}) as c:
        b(x)
    torch.testing.assert_close(c["resid_mid"], plain["resid_mid"])
    torch.testing.assert_close(plain["mlp_in"], plain["resid_mid"])
    torch.testing.assert_close(c["mlp_out"], b.mlp(2 * plain["resid_mid"]))


def test_per_head_inputs_refuse_a_kv_cache():
    model = gpt()
    with per_head_inputs(model), pytest.raises(ValueError, match="whole forward passes"):
        model(torch.randint(0, 20, (1, 3)), cache=model.new_cache(1))
