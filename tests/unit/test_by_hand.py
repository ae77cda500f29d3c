"""Attention by hand (attnlab.inspect.by_hand): reading matrices, refusing shapes that do not
fit, and the walk's numbers checked against the equations computed another way."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.inspect.by_hand import (
    HandMatrices,
    MatrixError,
    Settings,
    entropy_bits,
    matrices_from,
    parse_matrix,
    random_matrices,
    read_matrix,
    walk,
)


def softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- reading --------------------------------------------------------------------------------------


def test_a_matrix_reads_from_json_csv_whitespace_and_one_line():
    want = np.array([[1.0, 2.0], [3.0, -4.5]])
    for text in ("[[1, 2], [3, -4.5]]", "1,2\n3,-4.5\n", "1 2\n3\t-4.5", "1 2; 3 -4.5"):
        m, labels = parse_matrix(text, "X")
        np.testing.assert_array_equal(m, want)
        assert labels is None


def test_rows_may_carry_their_token_and_a_header_is_skipped():
    m, labels = parse_matrix("token,a,b\nI,1,2\nlike,3,4\n", "X")
    assert labels == ["I", "like"] and m.tolist() == [[1, 2], [3, 4]]
    m, labels = parse_matrix('{"rows": ["x", "y"], "values": [[1], [2]]}', "X")
    assert labels == ["x", "y"] and m.shape == (2, 1)


@pytest.mark.parametrize("text, says", [
    ("1 2; 3", "row 2 has 1 number, row 1 has 2"),
    ("1 x; 3 4", "row 1 has 'x', which is not a number"),
    ("", "empty"),
    ("1 inf", "finite"),
    ("[[1, 2], [3, true]]", "row 2 holds something that is not a number"),
    ("a 1; 2", "label every row or none"),
    ("[1, 2", "not valid JSON"),
])  # fmt: skip
def test_a_bad_matrix_is_one_line_saying_what_is_wrong(text, says):
    with pytest.raises(MatrixError) as e:
        parse_matrix(text, "X")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_file_or_the_text_itself(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("1,2\n3,4\n")
    assert read_matrix(str(f), "X")[0].tolist() == [[1, 2], [3, 4]]
    assert read_matrix("5 6", "X")[0].tolist() == [[5, 6]]
    with pytest.raises(MatrixError, match="no such file"):
        read_matrix(str(tmp_path / "missing.csv"), "X")


# -- shapes ---------------------------------------------------------------------------------------


def test_mismatched_shapes_are_refused_naming_them():
    x, w = np.ones((3, 4)), np.ones((4, 2))
    with pytest.raises(
        MatrixError, match=r"X is 3 x 4 but W_Q is 5 x 2: X W_Q needs W_Q to have M = 4 rows"
    ):
        HandMatrices(["a", "b", "c"], x, np.ones((5, 2)), w, w)
    with pytest.raises(MatrixError, match=r"W_Q is 4 x 2 and W_K is 4 x 3: Q K\^T needs d_q = d_k"):
        HandMatrices(["a", "b", "c"], x, w, np.ones((4, 3)), w)
    with pytest.raises(MatrixError, match="2 token labels for the 3 rows of X"):
        HandMatrices(["a", "b"], x, w, w, w)
    with pytest.raises(MatrixError, match="transpose"):  # stored (d, M), as nn.Linear holds it
        HandMatrices(["a", "b", "c"], x, np.ones((2, 4)), w, w)  # fmt: skip


def test_d_v_may_differ_from_d_k():
    m = random_matrices(m=16, d_k=24, d_v=28, seed=123, tokens="Life is short, eat dessert first")
    w = walk(m)
    shapes = {s.name: s.shape for s in w.steps}
    assert shapes["X"] == (6, 16) and shapes["W_Q"] == (16, 24) and shapes["W_V"] == (16, 28)
    assert shapes["Q"] == shapes["K"] == (6, 24) and shapes["V"] == (6, 28)
    assert shapes["raw_scores"] == shapes["weights"] == (6, 6) and shapes["z"] == (6, 28)


# -- the walk's numbers ---------------------------------------------------------------------------


def test_the_walk_is_the_equations():
    m = random_matrices(m=6, d_k=4, d_v=3, seed=7, tokens="I like to eat apples", init="rand")
    w = walk(m)
    q, k, v = m.x @ m.w_q, m.x @ m.w_k, m.x @ m.w_v
    np.testing.assert_allclose(w.step("Q").value, q)
    np.testing.assert_allclose(w.step("raw_scores").value, q @ k.T)
    scaled = q @ k.T / math.sqrt(4)
    np.testing.assert_allclose(w.step("scaled_scores").value, scaled)
    masked = np.where(np.tril(np.ones((5, 5), bool)), scaled, -np.inf)
    np.testing.assert_array_equal(np.isinf(w.step("masked_scores").value), np.isinf(masked))
    weights = softmax_rows(masked)
    np.testing.assert_allclose(w.step("weights").value, weights, atol=1e-12)
    np.testing.assert_allclose(w.step("z").value, weights @ v, atol=1e-12)
    np.testing.assert_allclose(w.step("similarity_dot").value, m.x @ m.x.T)
    norms = np.linalg.norm(m.x, axis=1)
    np.testing.assert_allclose(
        w.step("similarity_cosine").value, m.x @ m.x.T / np.outer(norms, norms)
    )


def test_each_switch_changes_what_it_says():
    m = random_matrices(m=6, d_k=4, seed=1, tokens="I like to eat apples")
    raw = walk(m).step("raw_scores").value
    np.testing.assert_allclose(walk(m, scale=False).step("scaled_scores").value, raw)
    np.testing.assert_allclose(walk(m, temperature=2.0).step("scaled_scores").value,
                               raw / math.sqrt(4) / 2.0)  # fmt: skip
    open_ = walk(m, causal=False)
    assert "no_mask" in [s.name for s in open_.steps]
    assert (open_.step("weights").value > 0).all()  # every token reads every token
    causal = walk(m).step("weights").value
    assert np.triu(causal, 1).max() == 0.0


def test_padding_needs_its_mask_except_where_the_causal_mask_hides_it():
    m = random_matrices(m=6, d_k=4, seed=2, tokens="I like to eat apples")
    alone = walk(m, causal=False).step("weights").value
    padded = walk(m, causal=False, pad=2)  # pads after the text
    assert padded.tokens == m.tokens + ["<pad>", "<pad>"]
    np.testing.assert_allclose(padded.step("weights").value[:5, :5], alone, atol=1e-12)
    leaky = walk(m, causal=False, pad=2, padding_mask=False).step("weights").value
    assert leaky[:5, 5:].sum(-1).min() > 0  # without the mask the text reads the pads
    left = walk(m, pad=2)  # under the causal mask the pads come first
    assert left.tokens[:2] == ["<pad>", "<pad>"]
    np.testing.assert_allclose(left.step("weights").value[2:, 2:], walk(m).step("weights").value,
                               atol=1e-12)  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 7), m=st.integers(1, 9), d_k=st.integers(1, 6), d_v=st.integers(1, 6),
       causal=st.booleans(), seed=st.integers(0, 10**6))  # fmt: skip
def test_the_walk_gives_attnlabs_own_attention(n, m, d_k, d_v, causal, seed):
    """The weights and output are scaled_dot_product_attention's (its reference path)."""
    from attnlab.attention import scaled_dot_product_attention

    hm = random_matrices(n, m, d_k, d_v, seed)
    w = walk(hm, causal=causal)
    q, k, v = (torch.as_tensor(hm.x @ a) for a in (hm.w_q, hm.w_k, hm.w_v))
    out, weights = scaled_dot_product_attention(q, k, v, causal=causal, return_weights=True)
    np.testing.assert_allclose(w.step("weights").value, weights.numpy(), atol=1e-12)
    np.testing.assert_allclose(w.step("z").value, out.numpy(), atol=1e-12)
    np.testing.assert_allclose(w.step("weights").value.sum(-1), 1.0, atol=1e-12)


def test_random_matrices_are_seeded_and_drawn_as_said():
    a, b = random_matrices(4, 16, 8, seed=3), random_matrices(4, 16, 8, seed=3)
    np.testing.assert_array_equal(a.w_q, b.w_q)
    assert not np.array_equal(a.w_q, random_matrices(4, 16, 8, seed=4).w_q)
    assert np.abs(a.w_q).max() <= 1 / math.sqrt(16) and a.w_q.min() < 0  # nn.Linear's range
    r = random_matrices(4, 16, 8, seed=3, init="rand")
    assert r.w_q.min() >= 0 and r.w_q.max() < 1


def test_the_json_carries_the_inputs_back():
    m = random_matrices(m=5, d_k=3, d_v=2, seed=0, tokens="I like to eat apples")
    d = json.loads(walk(m, temperature=0.5).to_json())
    again = matrices_from(d)
    np.testing.assert_array_equal(again.x, m.x)
    np.testing.assert_array_equal(again.w_v, m.w_v)
    assert again.tokens == m.tokens and d["settings"]["temperature"] == 0.5
    weights = next(s for s in d["steps"] if s["name"] == "weights")
    assert weights["rows"] == weights["cols"] == m.tokens and len(weights["entropy_bits"]) == 5


def test_entropy_in_bits():
    np.testing.assert_allclose(entropy_bits(np.full((1, 8), 1 / 8)), [3.0])
    np.testing.assert_allclose(entropy_bits(np.array([[1.0, 0, 0], [0, 0, 0]])), [0.0, 0.0])


def test_settings_refuse_a_temperature_of_zero():
    with pytest.raises(MatrixError, match="temperature"):
        Settings(temperature=0.0)


def test_a_notebook_draws_the_walk_and_the_what_ifs():
    from attnlab.inspect.what_if import what_if_by_hand

    m = random_matrices(m=4, d_k=2, seed=0, tokens="<s> I like")
    page = walk(m, pad=1)._repr_html_()
    assert page.count("<table") >= 10 and "&lt;pad&gt;" in page and "&lt;s&gt;" in page
    assert "<s>" not in page.replace("<script", "")  # every token escaped
    w = what_if_by_hand(m)._repr_html_()
    assert w.count("<table") == 1 + 5 and "no causal mask" in w
