"""The pieces of the modern families (issue 22), each checked against the library that
defines it (transformers, float32, eager attention) and against attnlab's own identities:
fused == reference attention, GQA with n_kv = H == plain multi-head attention, cached ==
uncached decoding, an empty row gives zeros."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import (
    KVCache,
    MultiHeadAttention,
    RingKVCache,
    causal_mask,
    reference_attention,
    sliding_window_mask,
    softcap,
)
from attnlab.blocks import Block, GatedFeedForward
from attnlab.norms import RMSNorm, make_norm
from attnlab.positional import (
    RelativePositionBias,
    RopeScaling,
    Rotary,
    RotaryHalf,
    relative_position_bucket,
    rotary_frequencies,
)

TOL = 1e-6  # float32 against transformers' float32, on tiny shapes, relative to |values| > 1


def _close(a, b, tol=TOL):
    """max |a - b| <= tol, scaled by the largest |b| where that exceeds 1 (float32 rounding
    grows with the values: outputs of size 10 carry errors of ~1e-6 on either side)."""
    err = (a - b).abs().max().item()
    bound = tol * max(1.0, b.abs().max().item())
    assert err <= bound, f"max abs error {err:.3g} > {bound:.3g}"
    return err


def _randomise(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Every parameter random (norm weights and biases too, which start at 0 or 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _load(ours: torch.nn.Module, theirs: dict, renames: dict) -> None:
    """Copy ``theirs`` (a state dict) into ``ours``, renaming key fragments; every key used."""
    sd = {}
    for k, v in theirs.items():
        for a, b in renames.items():
            k = k.replace(a, b)
        sd[k] = v
    ours.load_state_dict(sd, strict=True)


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------


def test_rms_norm_matches_llama_gemma_and_t5():
    tf = pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    del tf
    x = torch.randn(3, 5, 24) * 3
    for theirs, offset in ((LlamaRMSNorm(24, eps=1e-5), 0), (T5LayerNorm(24, eps=1e-5), 0),
                           (GemmaRMSNorm(24, eps=1e-5), 1)):  # fmt: skip
        _randomise(theirs)
        ours = RMSNorm(24, eps=1e-5, offset=offset)
        ours.load_state_dict(theirs.state_dict())
        _close(ours(x), theirs(x))
        # half precision: the statistic in float32, cast back where each family does
        xb, ob, tb = x.bfloat16(), ours.bfloat16(), theirs.bfloat16()
        assert torch.equal(ob(xb), tb(xb)), type(theirs).__name__


def test_rms_norm_has_unit_root_mean_square_and_gemma_starts_at_identity():
    x = torch.randn(4, 16) * 5
    y = RMSNorm(16, eps=0.0)(x)
    _close(y.pow(2).mean(-1), torch.ones(4), 1e-5)
    assert torch.equal(RMSNorm(16, eps=0.0, offset=1)(x), y)  # w = 0 -> (1 + w) = 1


def test_make_norm_builds_each_kind_and_refuses_others():
    assert isinstance(make_norm("layer", 8), torch.nn.LayerNorm)
    assert make_norm("rms", 8).offset == 0 and make_norm("rms-gemma", 8).offset == 1
    with pytest.raises(ValueError, match="unknown norm"):
        make_norm("batch", 8)


# ---------------------------------------------------------------------------------------------
# Rotary, rotate-half layout
# ---------------------------------------------------------------------------------------------


def _hf_rotated(config, q, offset):
    """q (B, H, T, D) rotated by transformers' Llama rotary at positions offset .. offset+T-1."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    pos = torch.arange(offset, offset + q.size(2))[None]
    cos, sin = LlamaRotaryEmbedding(config)(q, pos)
    return apply_rotary_pos_emb(q, q, cos, sin)[0]


ROPES = {
    "default": ({"rope_type": "default", "rope_theta": 10000.0}, None),
    "linear": ({"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0},
               RopeScaling("linear", 4.0)),
    "llama3": ({"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64},
               RopeScaling("llama3", 8.0, 1.0, 4.0, 64)),
}  # fmt: skip


@pytest.mark.parametrize("kind", ROPES)
def test_rotate_half_rotary_matches_transformers(kind):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params, scaling = ROPES[kind]
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
                      rope_parameters=dict(params))  # fmt: skip
    base = params["rope_theta"]
    if kind != "default":  # the frequencies themselves, band by band for llama3
        theirs, _ = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
        _close(rotary_frequencies(16, base, scaling), theirs, 0.0)
    rope = RotaryHalf(16, 256, base, scaling=scaling)
    q = torch.randn(2, 4, 40, 16)
    for offset in (0, 7, 200):
        _close(rope(q, offset), _hf_rotated(cfg, q, offset))
    qb = q.bfloat16()  # in half precision the same products in the same order: bit for bit
    assert torch.equal(rope(qb, 5), _hf_rotated(cfg, qb, 5))


def test_llama3_scaling_spans_all_three_bands():
    inv = rotary_frequencies(16, 10000.0)
    wavelen = 2 * math.pi / inv
    assert (
        (wavelen < 16).any() and (wavelen > 64).any() and ((wavelen >= 16) & (wavelen <= 64)).any()
    )


def test_partial_rotary_matches_gpt_neox():
    pytest.importorskip("transformers")
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import (
        GPTNeoXRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    cfg = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                         "partial_rotary_factor": 0.25})  # fmt: skip
    q = torch.randn(2, 4, 20, 16)
    cos, sin = GPTNeoXRotaryEmbedding(cfg)(q, torch.arange(3, 23)[None])
    theirs = apply_rotary_pos_emb(q, q, cos, sin)[0]
    ours = RotaryHalf(16, 64, 10000.0, rot_dim=4)(q, 3)
    _close(ours, theirs)
    assert torch.equal(ours[..., 4:], q[..., 4:])  # the channels past rot_dim pass through


def test_rotate_half_is_the_adjacent_pair_rotation_on_permuted_channels():
    D = 12
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # adjacent -> halves
    x = torch.randn(2, 3, 9, D)
    adjacent = Rotary(D, 16)(x, 4)
    half = RotaryHalf(D, 16)(x[..., perm], 4)
    _close(half, adjacent[..., perm], 1e-6)


@settings(max_examples=20, deadline=None)
@given(p=st.integers(0, 31), n=st.integers(0, 31), rot=st.sampled_from([2, 4, 8]))
def test_rotate_half_shift_moves_positions_down(p, n, rot):
    rope = RotaryHalf(8, 64, rot_dim=rot)
    x = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    rope.cos, rope.sin = rope.cos.double(), rope.sin.double()
    _close(rope.shift(rope(x, p + n), n), rope(x, p), 1e-6)  # the tables' float32 angles


# ---------------------------------------------------------------------------------------------
# T5 relative position bias
# ---------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    buckets=st.sampled_from([4, 8, 32]),
    max_distance=st.sampled_from([20, 40, 128]),  # past half the buckets, as in T5
    bidirectional=st.booleans(),
    rel=st.lists(st.integers(-300, 300), min_size=1, max_size=50),
)
def test_relative_position_bucket_matches_t5(buckets, max_distance, bidirectional, rel):
    pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    r = torch.tensor(rel)
    theirs = T5Attention._relative_position_bucket(r, bidirectional, buckets, max_distance)
    ours = relative_position_bucket(r, bidirectional, buckets, max_distance)
    assert torch.equal(ours, theirs)
    assert int(ours.min()) >= 0 and int(ours.max()) < buckets


def _t5_attention(is_decoder: bool):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    cfg = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=20, is_decoder=is_decoder,
                   dropout_rate=0.0)  # fmt: skip
    cfg._attn_implementation = "eager"
    theirs = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).eval()
    _randomise(theirs)
    return theirs


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_attention_with_relative_bias_matches(is_decoder):
    pytest.importorskip("transformers")
    theirs = _t5_attention(is_decoder)
    T = 30  # past max_distance: the log-spaced buckets and the last one are used
    rpb = RelativePositionBias(4, 8, 20, bidirectional=not is_decoder)
    rpb.embedding.weight.data.copy_(theirs.relative_attention_bias.weight)
    _close(rpb(T, T), theirs.compute_bias(T, T), 0.0)
    _close(rpb(1, T, offset=T - 1), theirs.compute_bias(1, T, past_seen_tokens=T - 1), 0.0)

    ours = MultiHeadAttention(32, 4, bias=False, scale=1.0).eval()
    _load(ours, {k: v for k, v in theirs.state_dict().items() if "relative" not in k},
          {"q.": "q_proj.", "k.": "k_proj.", "v.": "v_proj.", "o.": "out_proj."})  # fmt: skip
    x = torch.randn(2, T, 32)
    hf_mask = None
    if is_decoder:  # T5's decoder adds its causal mask to the scores
        hf_mask = (~causal_mask(T)).float()[None, None] * torch.finfo(torch.float32).min
    with torch.no_grad():
        out, _, weights = theirs(x, mask=hf_mask)
        bias = rpb(T, T)
        ref, w = ours(x, causal=is_decoder, position_bias=bias, return_weights=True)
        fused = ours(x, causal=is_decoder, position_bias=bias)
    _close(ref, out)
    _close(fused, out)
    _close(w, weights)


# ---------------------------------------------------------------------------------------------
# Attention layers against the families' own (layer 0 of a tiny model, eager attention)
# ---------------------------------------------------------------------------------------------


def _hf_model(name: str, config_name: str | None = None, **kw):
    import transformers

    cfg = getattr(transformers, config_name or f"{name}Config")(vocab_size=40, hidden_size=32,
                                                 intermediate_size=48, max_position_embeddings=128,
                                                 **kw)  # fmt: skip
    cfg._attn_implementation = "eager"
    model = getattr(transformers, f"{name}ForCausalLM")(cfg).eval()
    _randomise(model)
    return cfg, model


def _capture(model, module, ids):
    """(input, output, attention weights) of ``module`` in one forward pass of ``model``."""
    got = {}

    def hook(mod, args, kwargs, out):
        got["x"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        got["out"] = out[0] if isinstance(out, tuple) else out
        got["weights"] = out[1] if isinstance(out, tuple) and len(out) > 1 else None

    handle = module.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        got["logits"] = model(ids).logits
    handle.remove()
    return got


ATTN_RENAMES = {"o_proj": "out_proj"}
FAMILIES = {  # name, config, our MultiHeadAttention's options
    "llama-gqa": ("Llama", dict(num_attention_heads=4, num_key_value_heads=2),
                  dict(bias=False, n_kv_heads=2)),
    "llama3-rope": ("Llama", dict(num_attention_heads=4, num_key_value_heads=4,
                                  rope_parameters=ROPES["llama3"][0]),
                    dict(bias=False, rope=ROPES["llama3"][1])),
    "qwen2-mqa-bias": ("Qwen2", dict(num_attention_heads=4, num_key_value_heads=1),
                       dict(bias=False, qkv_bias=True, n_kv_heads=1)),
    "qwen3-qk-norm": ("Qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    rms_norm_eps=1e-5),
                      dict(bias=False, n_kv_heads=2, d_k=16, d_v=16, qk_norm="rms",
                           qk_norm_eps=1e-5)),
    "mistral-window": ("Mistral", dict(num_attention_heads=4, num_key_value_heads=2,
                                       sliding_window=5),
                       dict(bias=False, n_kv_heads=2, window=5)),
    "gemma2-softcap-window": ("Gemma2", dict(num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=16, query_pre_attn_scalar=24,
                                             attn_logit_softcapping=1.5, sliding_window=5,
                                             final_logit_softcapping=3.0),
                              dict(bias=False, n_kv_heads=2, d_k=16, d_v=16, scale=24**-0.5,
                                   softcap=1.5, window=5)),
}  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_layer_matches_the_family(family):
    pytest.importorskip("transformers")
    name, cfg_kw, opts = FAMILIES[family]
    opts = dict(opts)
    cfg, model = _hf_model(name, num_hidden_layers=1, **cfg_kw)
    T = 12  # longer than every window here: differences past the window would show
    got = _capture(model, model.model.layers[0].self_attn, torch.randint(0, 40, (2, T)))
    theta = cfg.rope_parameters["rope_theta"]
    hd = opts.get("d_k", 32 // cfg.num_attention_heads)
    rope = RotaryHalf(hd, 128, theta, scaling=opts.pop("rope", None))
    ours = MultiHeadAttention(32, cfg.num_attention_heads, rotary=rope, **opts).eval()
    _load(ours, model.model.layers[0].self_attn.state_dict(), ATTN_RENAMES)
    with torch.no_grad():
        ref, w = ours(got["x"], causal=True, return_weights=True)
        fused = ours(got["x"], causal=True)
    _close(w, got["weights"])
    _close(ref, got["out"])
    _close(fused, got["out"])


def test_gemma3_layers_take_their_own_rope_base_window_and_qk_norm():
    """Gemma 3: a local (sliding, base 1e4) layer then a global one (base 1e6, linear
    scaling), each with (1 + w) QK-norm; one RotaryHalf per layer type."""
    pytest.importorskip("transformers")
    rope_params = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
    }
    cfg, model = _hf_model("Gemma3", "Gemma3TextConfig", num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           query_pre_attn_scalar=24, sliding_window=5, rms_norm_eps=1e-5,
                           layer_types=["sliding_attention", "full_attention"],
                           rope_parameters=rope_params)  # fmt: skip
    ropes = {
        "sliding_attention": RotaryHalf(16, 128, 10000.0),
        "full_attention": RotaryHalf(16, 128, 1e6, scaling=RopeScaling("linear", 8.0)),
    }
    ids = torch.randint(0, 40, (2, 12))
    for i, kind in enumerate(cfg.layer_types):
        got = _capture(model, model.model.layers[i].self_attn, ids)
        window = 5 if kind == "sliding_attention" else None
        ours = MultiHeadAttention(32, 4, d_k=16, d_v=16, bias=False, n_kv_heads=2,
                                  qk_norm="rms-gemma", qk_norm_eps=1e-5, scale=24**-0.5,
                                  window=window, rotary=ropes[kind]).eval()  # fmt: skip
        _load(ours, model.model.layers[i].self_attn.state_dict(), ATTN_RENAMES)
        with torch.no_grad():
            ref, w = ours(got["x"], causal=True, return_weights=True)
            _close(w, got["weights"])
            _close(ref, got["out"])
            _close(ours(got["x"], causal=True), got["out"])


def test_parallel_block_with_partial_rotary_matches_a_pythia_layer():
    """GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x)), a quarter of each head rotated. Its fused
    query_key_value holds, head by head, [q; k; v] rows: split into our three projections."""
    pytest.importorskip("transformers")
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=40, hidden_size=32, intermediate_size=48,
                        num_attention_heads=4, num_hidden_layers=1, max_position_embeddings=64,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                         "partial_rotary_factor": 0.25})  # fmt: skip
    cfg._attn_implementation = "eager"
    model = GPTNeoXForCausalLM(cfg).eval()
    _randomise(model, std=0.2)
    layer = model.gpt_neox.layers[0]
    got = _capture(model, layer, torch.randint(0, 40, (2, 12)))
    sd = dict(layer.state_dict())
    w = sd.pop("attention.query_key_value.weight").view(4, 3, 8, 32)  # (H, q|k|v, D, C)
    b = sd.pop("attention.query_key_value.bias").view(4, 3, 8)
    for j, name in enumerate("qkv"):
        sd[f"attn.{name}_proj.weight"] = w[:, j].reshape(32, 32)
        sd[f"attn.{name}_proj.bias"] = b[:, j].reshape(32)
    ours = Block(32, 4, 48, causal=True, parallel=True, rotary=RotaryHalf(8, 64, rot_dim=2))
    _load(ours.eval(), sd, {"input_layernorm": "ln1", "post_attention_layernorm": "ln2",
                            "attention.dense": "attn.out_proj", "dense_h_to_4h": "fc1",
                            "dense_4h_to_h": "fc2"})  # fmt: skip
    with torch.no_grad():
        _close(ours(got["x"]), got["out"], 1e-5)


def test_gqa_records_kv_heads_and_per_query_head_patterns():
    from attnlab.hooks import record

    mha = MultiHeadAttention(32, 4, n_kv_heads=2).eval()
    with record(mha) as cache:
        mha(torch.randn(2, 5, 32), causal=True)
    assert cache["q"].shape == (2, 4, 5, 8) and cache["k"].shape == cache["v"].shape == (2, 2, 5, 8)
    assert cache["scores"].shape == cache["weights"].shape == (2, 4, 5, 5)
    # query heads 2 and 3 read K/V head 1
    scores = cache["q"][:, 2:] @ cache["k"][:, 1:2].transpose(-2, -1) / math.sqrt(8)
    _close(cache["scores"][:, 2:], scores, 1e-6)


def test_sliding_window_sees_the_last_window_positions_itself_included():
    pytest.importorskip("transformers")
    from transformers.masking_utils import sliding_window_causal_mask_function

    fn = sliding_window_causal_mask_function(4)
    i, zero = torch.arange(10), torch.tensor(0)
    theirs = fn(zero, zero, i[:, None], i[None, :])  # (T, S) what transformers lets each see
    ours = causal_mask(10) & sliding_window_mask(10, 10, 4)
    assert torch.equal(ours, theirs)
    assert ours.sum(-1).tolist() == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]
    # cached: the last 3 queries of 10 keys see the same rows, aligned bottom-right
    assert torch.equal(causal_mask(3, 10) & sliding_window_mask(3, 10, 4), theirs[-3:])


def test_repeat_kv_is_our_head_sharing():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import repeat_kv

    mha = MultiHeadAttention(24, 6, n_kv_heads=2)
    k = torch.randn(2, 2, 5, 4)
    assert torch.equal(mha._share(k), repeat_kv(k, 3))


# ---------------------------------------------------------------------------------------------
# Gated feed-forwards, blocks, final-logit softcap
# ---------------------------------------------------------------------------------------------


def test_gated_feed_forwards_match_llama_gemma_and_t5():
    pytest.importorskip("transformers")
    from transformers import GemmaConfig, LlamaConfig, T5Config
    from transformers.models.gemma.modeling_gemma import GemmaMLP
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.t5.modeling_t5 import T5DenseGatedActDense

    hf = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    t5 = {"wi_0": "gate", "wi_1": "up", "wo": "down"}
    cases = [
        (LlamaMLP(LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4)), "silu", hf),
        (GemmaMLP(GemmaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4)), "gelu_tanh", hf),
        (T5DenseGatedActDense(T5Config(d_model=16, d_ff=40, dense_act_fn="gelu_new",
                                       dropout_rate=0.0)), "gelu_new", t5),
    ]  # fmt: skip
    x = torch.randn(2, 7, 16) * 2
    for theirs, act, renames in cases:
        theirs.eval()
        _randomise(theirs)
        ours = GatedFeedForward(16, 40, act)
        _load(ours, theirs.state_dict(), renames)
        with torch.no_grad():
            _close(ours(x), theirs(x))


def test_gated_feed_forward_records_the_gated_product():
    from attnlab.hooks import record

    ffn = GatedFeedForward(8, 12, "silu")
    x = torch.randn(2, 3, 8)
    with record(ffn) as cache:
        out = ffn(x)
    h = cache["hidden"]
    _close(h, torch.nn.functional.silu(ffn.gate(x)) * ffn.up(x), 0.0)
    _close(out, ffn.down(h), 0.0)


def _block_case(name, cfg_kw, block_kw, attn_kw, renames, T=12):
    """Layer 0 of a tiny family model against our Block with its weights."""
    cfg, model = _hf_model(name, num_hidden_layers=1, **cfg_kw)
    layer = model.model.layers[0]
    got = _capture(model, layer, torch.randint(0, 40, (2, T)))
    hd = attn_kw.get("d_k", 32 // cfg.num_attention_heads)
    rope = RotaryHalf(hd, 128, cfg.rope_parameters["rope_theta"])
    ours = Block(32, cfg.num_attention_heads, 48, causal=True, bias=False, rotary=rope,
                 ln_eps=cfg.rms_norm_eps, attn_options=attn_kw, **block_kw).eval()  # fmt: skip
    _load(ours, layer.state_dict(), renames)
    with torch.no_grad():
        _close(ours(got["x"]), got["out"], 1e-5)
    return cfg, model, got


LAYER_RENAMES = {"self_attn.": "attn.", "o_proj": "out_proj", "gate_proj": "gate",
                 "up_proj": "up", "down_proj": "down"}  # fmt: skip


def test_rms_swiglu_block_matches_a_llama_layer():
    pytest.importorskip("transformers")
    renames = {**LAYER_RENAMES, "input_layernorm": "ln1", "post_attention_layernorm": "ln2"}
    _block_case("Llama", dict(num_attention_heads=4, num_key_value_heads=2),
                dict(norm="rms", ffn="gated", activation="silu"), dict(n_kv_heads=2), renames)  # fmt: skip


def test_post_norm_block_and_final_softcap_match_a_gemma2_layer():
    pytest.importorskip("transformers")
    renames = {**LAYER_RENAMES, "input_layernorm": "ln1", "post_attention_layernorm": "ln1_post",
               "pre_feedforward_layernorm": "ln2", "post_feedforward_layernorm": "ln2_post"}  # fmt: skip
    attn_kw = dict(n_kv_heads=2, d_k=16, d_v=16, scale=24**-0.5, softcap=1.5, window=5)
    cfg, model, _ = _block_case(
        "Gemma2",
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
             attn_logit_softcapping=1.5, sliding_window=5, final_logit_softcapping=3.0),
        dict(norm="rms-gemma", ffn="gated", activation="gelu_tanh", post_norms=True),
        attn_kw, renames)  # fmt: skip
    got = _capture(model, model.lm_head, torch.randint(0, 40, (2, 12)))
    _close(softcap(got["out"], 3.0), got["logits"])
    assert got["logits"].abs().max() < 3.0


def test_parallel_block_adds_both_sublayers_to_its_input():
    torch.manual_seed(0)
    b = Block(16, 4, 32, causal=True, parallel=True, norm="rms").eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = x + b.attn(b.ln1(x), causal=True) + b.mlp(b.ln2(x))
        _close(b(x), want, 1e-6)


def test_block_refuses_option_mixes_it_does_not_define():
    with pytest.raises(ValueError, match="feed-forward kind"):
        Block(16, 4, ffn="moe")
    with pytest.raises(ValueError, match="pre-norm"):
        Block(16, 4, parallel=True, norm_first=False)
    with pytest.raises(ValueError, match="not both"):
        Block(16, 4, parallel=True, post_norms=True)


def test_default_block_keeps_its_hook_names_and_modules():
    b = Block(16, 4)
    hooks = sorted(n for n, _ in b.named_modules() if n.split(".")[-1].startswith("hook_"))
    assert hooks == sorted(["hook_resid_pre", "hook_ln1", "hook_resid_mid", "hook_resid_post",
                            "hook_ln2", "hook_mlp_out", "attn.hook_q", "attn.hook_k",
                            "attn.hook_v", "attn.hook_weights", "attn.hook_z", "attn.hook_out",
                            "attn.hook_scores", "mlp.hook_hidden",
                            # each reader's own input (circuits: q/k/v per head, the MLP's)
                            "attn.hook_q_in", "attn.hook_k_in", "attn.hook_v_in",
                            "hook_mlp_in", "attn.hook_position_bias"])  # fmt: skip
    assert list(b.state_dict()) == [
        "ln1.weight", "ln1.bias", "attn.q_proj.weight", "attn.q_proj.bias", "attn.k_proj.weight",
        "attn.k_proj.bias", "attn.v_proj.weight", "attn.v_proj.bias", "attn.out_proj.weight",
        "attn.out_proj.bias", "ln2.weight", "ln2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
        "mlp.fc2.weight", "mlp.fc2.bias"]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# attnlab's own identities
# ---------------------------------------------------------------------------------------------


def test_gqa_with_as_many_kv_heads_as_heads_is_plain_attention_bit_for_bit():
    torch.manual_seed(3)
    plain = MultiHeadAttention(32, 4, rotary=RotaryHalf(8, 32)).eval()
    torch.manual_seed(3)
    grouped = MultiHeadAttention(32, 4, rotary=RotaryHalf(8, 32), n_kv_heads=4).eval()
    x = torch.randn(2, 9, 32)
    for kw in ({}, {"return_weights": True}):
        a, b = plain(x, causal=True, **kw), grouped(x, causal=True, **kw)
        for u, v in zip(a if kw else [a], b if kw else [b], strict=True):
            assert torch.equal(u, v)


@settings(max_examples=25, deadline=None)
@given(
    n_kv=st.sampled_from([1, 2, 4]),
    window=st.sampled_from([None, 1, 3, 20]),
    causal=st.booleans(),
    bias=st.booleans(),
    scale=st.sampled_from([None, 1.0, 0.3]),
    pad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_and_reference_paths_agree(n_kv, window, causal, bias, scale, pad, seed):
    torch.manual_seed(seed)
    T = 7
    mha = MultiHeadAttention(32, 4, n_kv_heads=n_kv, window=window, scale=scale,
                             qk_norm="rms", rotary=RotaryHalf(8, 16, rot_dim=4)).eval()  # fmt: skip
    x = torch.randn(3, T, 32)
    mask = None
    if pad:  # row 0 sees nothing at all; row 1 loses its first two keys
        keep = torch.ones(3, T, dtype=torch.bool)
        keep[0], keep[1, :2] = False, False
        mask = keep[:, None, None, :]
    pb = torch.randn(1, 4, T, T) if bias else None
    with torch.no_grad():
        fused = mha(x, mask=mask, causal=causal, position_bias=pb)
        ref, w = mha(x, mask=mask, causal=causal, position_bias=pb, return_weights=True)
    assert not fused.isnan().any() and not w.isnan().any()
    _close(fused, ref, 1e-5)
    if pad:
        assert (w[0] == 0).all()
        _close(ref[0], mha.out_proj.bias.expand(T, -1), 0.0)  # zeros before W_O


def test_softcap_caps_the_scores_before_the_mask():
    q, k, v = torch.randn(3, 1, 4, 6, 8).unbind(0)
    mask = causal_mask(6)
    _, w, s = reference_attention(q * 10, k * 10, v, mask, cap=2.0)
    assert s.abs().max() <= 2.0  # recorded scores are capped (and unmasked)
    _, w2, _ = reference_attention(q * 10, k * 10, v, mask, cap=None)
    assert not torch.allclose(w, w2)
    mha = MultiHeadAttention(16, 2, softcap=2.0).eval()  # softcap always takes the reference path
    x = torch.randn(2, 5, 16)
    assert torch.equal(mha(x, causal=True), mha(x, causal=True, return_weights=True)[0])


def test_empty_rows_give_zeros_with_a_window_and_a_position_bias():
    mha = MultiHeadAttention(16, 2, n_kv_heads=1, window=2, bias=False).eval()
    x = torch.randn(1, 4, 16)
    mask = torch.zeros(1, 1, 1, 4, dtype=torch.bool)
    pb = torch.randn(1, 2, 4, 4)
    with torch.no_grad():
        for kw in ({}, {"position_bias": pb}):
            out = mha(x, mask=mask, causal=True, **kw)
            ref, w = mha(x, mask=mask, causal=True, return_weights=True, **kw)
            assert torch.equal(out, torch.zeros_like(out)) and torch.equal(ref, out)
            assert (w == 0).all()


def _decode(mha, x, cache, rpb=None):
    """Feed x (B, T, C) one position at a time through ``cache``; outputs (B, T, C)."""
    outs = []
    for t in range(x.size(1)):
        pb = None if rpb is None else rpb(1, t + 1, offset=t)
        outs.append(mha(x[:, t : t + 1], causal=True, cache=cache, position_bias=pb))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize(
    "opts",
    [dict(n_kv_heads=2), dict(n_kv_heads=1, window=3), dict(window=4, softcap=3.0),
     dict(n_kv_heads=2, qk_norm="rms-gemma", scale=0.2)],
    ids=["gqa", "mqa-window", "window-softcap", "qk-norm"],
)  # fmt: skip
def test_cached_decoding_equals_uncached(opts):
    torch.manual_seed(0)
    T = 10
    mha = MultiHeadAttention(32, 4, rotary=RotaryHalf(8, 16, rot_dim=6), **opts).eval()
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        full = mha(x, causal=True)
        cache = mha.new_cache(2, T)
        assert cache.k.shape == (2, mha.n_kv_heads, T, 8)  # the cache holds the K/V heads only
        stepped = _decode(mha, x, cache)
        # a prompt of 6 in one pass, then one at a time
        cache.clear()
        first = mha(x[:, :6], causal=True, cache=cache)
        rest = _decode_from(mha, x, cache, 6)
    _close(stepped, full, 1e-5)
    _close(torch.cat([first, rest], 1), full, 1e-5)


def _decode_from(mha, x, cache, start):
    return torch.cat([mha(x[:, t : t + 1], causal=True, cache=cache)
                      for t in range(start, x.size(1))], dim=1)  # fmt: skip


def test_cached_decoding_with_relative_position_bias_equals_uncached():
    torch.manual_seed(0)
    T = 9
    mha = MultiHeadAttention(16, 2, bias=False, scale=1.0).eval()
    rpb = RelativePositionBias(2, 8, 6, bidirectional=False)
    x = torch.randn(1, T, 16)
    with torch.no_grad():
        full = mha(x, causal=True, position_bias=rpb(T, T))
        stepped = _decode(mha, x, mha.new_cache(1, T), rpb)
    _close(stepped, full, 1e-5)


def test_ring_cache_with_rotate_half_equals_attention_over_the_last_positions():
    torch.manual_seed(0)
    block, T = 6, 15
    rope = RotaryHalf(8, block, rot_dim=4)
    mha = MultiHeadAttention(32, 4, n_kv_heads=2, rotary=rope).eval()
    x = torch.randn(1, T, 32)
    cache = mha.new_cache(1, block, ring=True)
    assert isinstance(cache, RingKVCache)
    with torch.no_grad():
        for t in range(T):
            if cache.length == block:
                cache.rebase(block // 2, rope.shift)
            out = mha(x[:, t : t + 1], causal=True, cache=cache)
            window = x[:, max(0, t + 1 - block) : t + 1]  # what the ring holds, from position 0
            _close(out[:, -1], mha(window, causal=True)[:, -1], 1e-5)


def test_ring_cache_refuses_a_sliding_window_it_cannot_hold():
    mha = MultiHeadAttention(16, 2, window=3, rotary=RotaryHalf(8, 8)).eval()
    with pytest.raises(ValueError, match="sliding window of 3"):
        mha(torch.randn(1, 1, 16), causal=True, cache=mha.new_cache(1, 6, ring=True))
    assert isinstance(MultiHeadAttention(16, 2, window=6).new_cache(1, 6), KVCache)


def test_attention_refuses_bad_options():
    with pytest.raises(ValueError, match="must divide"):
        MultiHeadAttention(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="positive"):
        MultiHeadAttention(32, 4, window=0)
    with pytest.raises(ValueError, match="rot_dim"):
        RotaryHalf(8, 8, rot_dim=3)
    with pytest.raises(ValueError, match="rope scaling"):
        RopeScaling("yarn", 2.0)


def test_rotate_half_tables_are_rebuilt_after_a_meta_device_build():
    """A checkpoint is built on the meta device; its rotary tables are not in the file."""
    with torch.device("meta"):
        rope = RotaryHalf(8, 32, 500.0, rot_dim=6, scaling=RopeScaling("llama3", 4.0, 1, 4, 16))
    rope.to_empty(device="cpu")
    rope.reset_buffers()
    fresh = RotaryHalf(8, 32, 500.0, rot_dim=6, scaling=RopeScaling("llama3", 4.0, 1, 4, 16))
    assert torch.equal(rope.cos, fresh.cos) and torch.equal(rope.sin, fresh.sin)
