"""Head scores (previous-token, duplicate-token, induction, first-token, self, entropy) on
hand-built attention patterns, the probes, ablation through the hooks, and composition."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import MultiHeadAttention
from attnlab.inspect.heads import (
    SCORES,
    composition_scores,
    head_matrices,
    head_scores,
    kind_of,
    repeated_tokens,
    run_probe,
    score_heads,
)
from attnlab.inspect.recording import InspectError
from attnlab.models.gpt import GPT, PRESETS, GPTConfig
from attnlab.models.graph import LowRank, composition


def pattern(T: int, key_of) -> torch.Tensor:
    """(1, 1, T, T): query t puts all its attention on key key_of(t)."""
    w = torch.zeros(1, 1, T, T)
    for t in range(T):
        w[0, 0, t, key_of(t)] = 1.0
    return w


def repeat_ids(half: int, seed: int = 0) -> torch.Tensor:
    r = torch.randperm(50, generator=torch.Generator().manual_seed(seed))[:half]  # distinct
    return torch.cat([r, r])[None]  # (1, 2 * half)


def score(w, ids=None, causal=True) -> dict[str, float | None]:
    return {k: None if v is None else float(v[0]) for k, v in head_scores(w, ids, causal).items()}


def test_a_pure_previous_token_pattern_scores_one_and_nothing_else():
    s = score(pattern(12, lambda t: max(t - 1, 0)), repeat_ids(6))
    assert s["previous-token"] == 1.0
    assert s["self"] == 0.0 and s["induction"] == 0.0 and s["duplicate-token"] == 0.0
    assert s["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert kind_of(s) == "previous-token"


@pytest.mark.parametrize("half", [3, 8, 20])
def test_a_pure_induction_pattern_on_r_r_scores_one(half):
    """In r r, the token at t >= half first occurred at t - half; the one after it, at
    t - half + 1, is what an induction head attends to."""
    ids = repeat_ids(half)
    w = pattern(2 * half, lambda t: t - half + 1 if t >= half else 0)
    s = score(w, ids)
    assert s["induction"] == 1.0 and s["duplicate-token"] == 0.0
    assert kind_of(s) == "induction"
    dup = score(pattern(2 * half, lambda t: t - half if t >= half else 0), ids)
    assert dup["duplicate-token"] == 1.0 and dup["induction"] == 0.0
    assert kind_of(dup) == "duplicate-token"


def test_sink_self_and_uniform_patterns():
    T = 10
    assert score(pattern(T, lambda t: 0))["first-token"] == 1.0
    assert kind_of(score(pattern(T, lambda t: 0))) == "sink"
    assert score(pattern(T, lambda t: t))["self"] == 1.0
    uniform = torch.tril(torch.ones(T, T))
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    s = score(uniform, repeat_ids(5))
    assert s["entropy"] == pytest.approx(1.0, abs=1e-6)
    # each row t >= 1 puts 1/(t+1) on its previous token: the mean of those
    assert s["previous-token"] == pytest.approx(sum(1 / (t + 1) for t in range(1, T)) / (T - 1))
    assert kind_of(s) is None


def test_scores_need_token_ids_only_for_duplicates_and_induction():
    s = score(pattern(6, lambda t: max(t - 1, 0)), None)
    assert s["duplicate-token"] is None and s["induction"] is None
    assert s["previous-token"] == 1.0


def test_an_encoder_map_counts_every_row_and_every_key():
    T = 6
    w = torch.full((1, 1, T, T), 1.0 / T)  # bidirectional, uniform over all T keys
    s = score(w, causal=False)
    assert s["entropy"] == pytest.approx(1.0, abs=1e-6)
    assert s["self"] == pytest.approx(1.0 / T) and s["first-token"] == pytest.approx(1.0 / T)


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 4), T=st.integers(2, 24), seed=st.integers(0, 10**6),
       causal=st.booleans())  # fmt: skip
def test_every_score_of_any_attention_lies_in_zero_one(B, H, T, seed, causal):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, H, T, T, generator=g) * 3
    if causal:
        logits = logits.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), -math.inf)
    w = torch.softmax(logits, -1)
    ids = torch.randint(0, 4, (B, T), generator=g)  # few symbols: many duplicates
    for name, v in head_scores(w, ids, causal).items():
        if v is not None:
            finite = v[~torch.isnan(v)]
            assert ((finite >= -1e-6) & (finite <= 1 + 1e-6)).all(), name


def test_scores_refuse_a_cross_attention_map():
    with pytest.raises(ValueError, match="T == S"):
        head_scores(torch.rand(1, 1, 3, 5))


# -- probes on real models -------------------------------------------------------------------


def attn_only(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=32, **{**PRESETS["attn-only-2l"], "block_size": 32, **kw}))


def test_an_attention_only_gpt_has_no_mlp_and_records_no_mlp_activations():
    model = attn_only()
    assert all(b.mlp is None for b in model.blocks)
    assert not any("mlp" in name for name, _ in model.named_parameters())
    _, cache = model(torch.randint(0, 32, (1, 8)), record=True)
    assert "blocks.1.resid_post" in cache and not any("mlp" in k for k in cache)
    torch.testing.assert_close(cache["blocks.0.resid_post"], cache["blocks.0.resid_mid"])


def test_repeated_probe_is_r_r_within_the_vocabulary_and_block():
    model = attn_only(block_size=20)
    x = repeated_tokens(model, n=5, seed=3)
    assert x.shape == (5, 20)
    assert torch.equal(x[:, :10], x[:, 10:]) and int(x.max()) < 32
    assert torch.equal(x, repeated_tokens(model, n=5, seed=3))


def test_run_probe_scores_every_head_and_measures_both_halves():
    model = attn_only()
    r = run_probe(model, repeated_tokens(model, n=4), repeated=True)
    assert list(r.maps) == ["blocks.0.attn.weights", "blocks.1.attn.weights"]
    assert all(r.scores[m]["induction"].shape == (2,) for m in r.maps)
    assert r.loss_first_half > 0 and r.loss_repeated_half > 0


def test_score_heads_names_an_induction_head_built_by_hand():
    """Layer 1 head 0's pattern replaced (through the hooks) by a pure induction pattern: the
    report names it an induction head and no other."""
    from attnlab import hooks

    model = attn_only()
    ids = repeated_tokens(model, n=4, seed=0)  # what score_heads will feed

    def induction(w, name):
        """Each query attends to the token after the first earlier occurrence of its own
        token (r may repeat a token by chance), or to the first token when there is none."""
        w = w.clone()
        for b in range(w.size(0)):
            x = ids[b].tolist()
            w[b, 0] = pattern(len(x), lambda t, x=x: next(
                (j for j in range(1, t) if x[j - 1] == x[t]), 0))[0, 0]  # fmt: skip
        return w

    with hooks.record(model, names=[], edit={"blocks.1.attn.weights": induction}):
        report = score_heads(model, n=4)
    rows = {r["name"]: r for r in report.rows}
    assert rows["1.0"]["scores"]["induction"] == 1.0 and rows["1.0"]["kind"] == "induction"
    assert sum(r["kind"] == "induction" for r in report.rows) == 1
    assert set(rows["0.0"]["scores"]) == set(SCORES)


def test_score_heads_refuses_a_model_without_self_attention():
    from attnlab.models.rnn import RNNConfig, RNNSeq2Seq

    model = RNNSeq2Seq(RNNConfig(src_vocab_size=10, tgt_vocab_size=10, d_embed=8, d_hidden=8))
    with pytest.raises(InspectError, match="no self-attention heads"):
        score_heads(model, n=2)


# -- ablating what the scores name -------------------------------------------------------------


@pytest.mark.parametrize("heads", [[(0, 1)], [(1, 0), (1, 1)], [(0, 0), (1, 1)]])
def test_ablating_heads_of_an_attention_only_gpt_removes_their_columns_of_w_o(heads):
    """The names ``heads`` reports ("1.0") are what interventions.ablate takes; zeroing head
    h's output z is the same as zeroing its d_v columns of W_O."""
    from attnlab.interventions import ablate

    model = attn_only()
    x = torch.randint(0, 32, (3, 16))
    names = [r["name"] for r in score_heads(model, n=2).rows]
    spec = ",".join(f"{layer}.{h}" for layer, h in heads)
    assert set(spec.split(",")) <= set(names)
    with torch.no_grad(), ablate(model, heads=spec, mode="zero"):
        edited = model(x)
    cut = attn_only()
    D = 32  # head width of the preset (64 / 2)
    with torch.no_grad():
        for layer, h in heads:
            cut.blocks[layer].attn.out_proj.weight[:, h * D : (h + 1) * D] = 0
    torch.testing.assert_close(edited, cut(x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(edited, model(x))


# -- composition -----------------------------------------------------------------------------


def test_composition_tells_keys_from_queries():
    """A head reading its keys from direction e2 (W_QK = e1 e2^T) K-composes fully with a
    head that writes into e2 (W_OV = e2 e3^T), and does not Q-compose with it."""
    C = 6
    e = torch.eye(C)

    def mat(m: torch.Tensor) -> LowRank:  # a dense C x C map as factors: m @ I
        return LowRank(m.double(), torch.eye(C, dtype=torch.float64))

    def scores(qk, ov, writer) -> dict[str, float]:
        return {k.upper(): composition(k, mat(writer), mat(qk), mat(ov)) for k in "qkv"}

    writer = torch.outer(e[1], e[2])  # writes into e2 (index 1)
    c = scores(torch.outer(e[0], e[1]), torch.outer(e[4], e[5]), writer)
    assert c["K"] == pytest.approx(1.0) and c["Q"] == pytest.approx(0.0)
    assert c["V"] == pytest.approx(0.0)
    c = scores(torch.outer(e[1], e[3]), torch.outer(e[1], e[3]), writer)
    assert c["Q"] == pytest.approx(1.0) and c["K"] == pytest.approx(0.0)
    # against the dense definition, |M W_OV| / (|M| |W_OV|), on random maps
    g = torch.Generator().manual_seed(0)
    qk, ov, w = (torch.randn(C, C, generator=g, dtype=torch.float64) for _ in range(3))
    dense = {"Q": qk.T, "K": qk, "V": ov}
    for k, m in dense.items():
        want = float((m @ w).norm() / (m.norm() * w.norm()))
        assert scores(qk, ov, w)[k] == pytest.approx(want, rel=1e-9)


def test_head_matrices_reproduce_the_module_s_scores_and_outputs():
    """x_q^T W_QK x_k is head h's unscaled score, and W_OV x its contribution to the output
    (biases off, no rotary)."""
    torch.manual_seed(1)
    attn = MultiHeadAttention(12, 3, bias=False)
    mats = head_matrices(attn)
    xq, xk = torch.randn(12), torch.randn(12)
    D = 4
    for h, m in enumerate(mats):
        q = attn.q_proj.weight[h * D : (h + 1) * D] @ xq
        k = attn.k_proj.weight[h * D : (h + 1) * D] @ xk
        torch.testing.assert_close(xq @ m["QK"] @ xk, q @ k, atol=1e-5, rtol=1e-5)
        v = attn.v_proj.weight[h * D : (h + 1) * D] @ xk
        out = attn.out_proj.weight[:, h * D : (h + 1) * D] @ v
        torch.testing.assert_close(m["OV"] @ xk, out, atol=1e-5, rtol=1e-5)


def test_composition_scores_cover_every_pair_of_consecutive_layers():
    rows = composition_scores(attn_only(n_layer=3))
    assert len(rows) == 2 * (2 * 2)  # 2 layer pairs x 2 readers x 2 writers
    assert {r["reader"][0] for r in rows} == {"1", "2"}
    assert all(0 <= r[k] <= 1 for r in rows for k in "QKV")


def test_composition_from_the_factors_equals_the_c_by_c_maps_multiplied_out():
    """The composition scores are taken in the heads' widths (attnlab.models.graph.LowRank);
    they equal Elhage et al.'s norms of the C x C products, on grouped-query heads behind an
    RMSNorm with a gain (Gemma's offset included)."""
    from attnlab.models.graph import LowRank, head_factors, norm_gain, product_norm
    from attnlab.norms import RMSNorm

    torch.manual_seed(3)
    attn = MultiHeadAttention(24, 6, n_kv_heads=2, bias=False)
    ln = RMSNorm(24)
    ln.offset = 1.0
    with torch.no_grad():
        ln.weight.normal_()
    gain = norm_gain(ln, 24)
    maps = [head_factors(attn, h, gain) for h in range(6)]
    for (qk, ov), (_, writer) in zip(maps, maps[::-1]):
        for m in (qk, qk.T, ov):
            full = m.full() @ writer.full()
            assert product_norm(m, writer) == pytest.approx(float(full.norm()), rel=1e-10)
            assert m.norm() == pytest.approx(float(m.full().norm()), rel=1e-10)
    a, b = LowRank(torch.randn(5, 2).double(), torch.randn(2, 5).double()), maps[0][0]
    assert a.T.full().equal(a.full().T) and b.T.T.full().equal(b.full())
