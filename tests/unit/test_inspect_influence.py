"""similarity and influence: definitions checked against recomputation and constructed models."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from attnlab import hooks
from attnlab.inspect import influence, similarity
from attnlab.inspect.recording import record
from look_helpers import SENTENCE, char_tokenizer, make_run, run_main, tiny_gpt
from printed import Printed


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory):
    """The tier's tiny run with three layers (influence compares layers)."""
    return make_run(tmp_path_factory.mktemp("look") / "run", n_layer=3)


def test_similarity_is_the_cosine_of_the_residual_stream(deep_run):
    _, model, tok = deep_run
    rec = record(model, tok, SENTENCE)
    sim = similarity(rec)
    assert [ly.label for ly in sim.layers] == ["layer 0", "layer 1", "layer 2"]
    N = len(SENTENCE)
    for ly in sim.layers:
        for m in (ly.before, ly.after):
            assert m.shape == (N, N)
            np.testing.assert_allclose(np.diag(m), 1.0, atol=1e-6)
            np.testing.assert_allclose(m, m.T, atol=1e-9)
            assert np.all(np.abs(m) <= 1 + 1e-9)
    for a, b in zip(sim.layers, sim.layers[1:]):
        np.testing.assert_allclose(a.after, b.before)  # one block's output is the next one's input
    h = rec.cache["blocks.1.resid_post"][0].double()
    i, j = 3, 11
    ref = torch.nn.functional.cosine_similarity(h[i], h[j], dim=0)
    assert sim.layers[1].after[i, j] == pytest.approx(float(ref), abs=1e-9)
    shown = Printed(str(sim))
    assert "mean cosine similarity" in shown and "before layer 0" in shown
    assert "after layer 1" in Printed(str(similarity(rec, layer=1)))
    d = json.loads(sim.to_json())
    assert len(d["layers"]) == 3 and len(d["layers"][0]["after"]) == N


def test_influence_matches_its_definition(deep_run):
    _, model, tok = deep_run
    rec = record(model, tok, SENTENCE)
    inf = influence(model, rec)
    N = len(SENTENCE)
    assert len(inf.rows) == 3 * N
    moved = [r.context for r in inf.rows]  # ranked by context, not by the raw change
    assert moved == sorted(moved, reverse=True)
    c = rec.cache
    for r in inf.rows[:: max(1, len(inf.rows) // 9)]:
        p = f"blocks.{r.block}."
        before, mid, after = (
            c[p + n][0, r.position].double() for n in ("resid_pre", "resid_mid", "resid_post")
        )
        assert r.rel_change == pytest.approx(
            float((after - before).norm() / before.norm()), rel=1e-9
        )
        cos = torch.nn.functional.cosine_similarity(before, after, dim=0)
        assert r.cosine == pytest.approx(float(cos), abs=1e-9)
        a, f = (mid - before).norm(), (after - mid).norm()
        assert r.attn_share == pytest.approx(float(a / (a + f)), rel=1e-9)
        assert r.attn_share + r.ffn_share == pytest.approx(1.0)
        shares = [s for _, _, s in r.sources]
        assert shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-9
        assert all(j <= r.position for j, _, _ in r.sources)  # causal: no source from the future
        assert all(t == SENTENCE[j] for j, t, _ in r.sources)


def test_sources_weigh_attention_by_what_each_value_sends():
    """W_Q = 0 gives uniform weights 1/(i+1), so the sources rank by ||W_O^h v_j|| alone."""
    tok = char_tokenizer()
    model = tiny_gpt(tok, n_layer=1, n_head=2).eval()
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.q_proj.weight.zero_()
        attn.q_proj.bias.zero_()
    rec = record(model, tok, SENTENCE)
    inf = influence(model, rec, n_sources=30)
    v = rec.cache["blocks.0.attn.v"][0].double()  # (H, N, d_v)
    WO = attn.out_proj.weight.detach().double()  # (C, H * d_v)
    d = attn.d_v
    size = sum((v[h] @ WO[:, h * d : (h + 1) * d].T).norm(dim=-1) for h in range(2))  # (N,)
    i = len(SENTENCE) - 1
    expected = size / size.sum()  # uniform weights over keys 0..i (the last row)
    row = next(r for r in inf.rows if r.position == i)
    got = {j: s for j, _, s in row.sources}
    for j in range(i + 1):
        assert got[j] == pytest.approx(float(expected[j]), rel=1e-6)


def test_sources_follow_an_output_projection_changed_in_place():
    """The per-head W_O^h^T W_O^h kept between texts is made again when W_O is edited in place
    (an intervention's edit, a reloaded checkpoint copied into the same tensor)."""
    from attnlab.inspect.influence import source_contributions

    tok = char_tokenizer()
    model = tiny_gpt(tok, n_layer=1, n_head=2).eval()
    attn = model.blocks[0].attn

    def direct(rec):  # sum_h w_h[i, j] ||W_O^h v_h[j]||, rows normalised
        w, v = rec.cache["blocks.0.attn.weights"][0].double(), rec.cache["blocks.0.attn.v"][0]
        WO, d = attn.out_proj.weight.detach().double(), attn.d_v
        c = sum(w[h] * (v[h].double() @ WO[:, h * d : (h + 1) * d].T).norm(dim=-1)[None, :]
                for h in range(2))  # fmt: skip
        return (c / c.sum(-1, keepdim=True)).numpy()

    rec = record(model, tok, SENTENCE)
    np.testing.assert_allclose(source_contributions(model, rec, "blocks.0.attn.weights"),
                               direct(rec), rtol=1e-9, atol=1e-12)  # fmt: skip
    with torch.no_grad():
        attn.out_proj.weight[:, : attn.d_v].mul_(5.0)  # head 0 now sends five times as much
    rec = record(model, tok, SENTENCE)
    np.testing.assert_allclose(source_contributions(model, rec, "blocks.0.attn.weights"),
                               direct(rec), rtol=1e-9, atol=1e-12)  # fmt: skip


def test_a_silenced_attention_layer_has_no_attention_share():
    tok = char_tokenizer()
    model = tiny_gpt(tok, n_layer=1).eval()
    with torch.no_grad():
        model.blocks[0].attn.out_proj.weight.zero_()
        model.blocks[0].attn.out_proj.bias.zero_()
    inf = influence(model, record(model, tok, "I like"))
    assert all(r.attn_share == 0.0 and r.ffn_share == pytest.approx(1.0) for r in inf.rows)


def test_influence_cli_writes_the_ranked_csv(deep_run, tmp_path, capsys):
    path, _, _ = deep_run
    out = tmp_path / "inf.csv"
    code, stdout, err = run_main(capsys, "influence", path, SENTENCE, "--csv", out, "--top", "5")
    assert code == 0, err
    assert (
        "tokens moved most by their context (top 5 of 60)" in stdout
        and "wrote influence table" in err
    )
    rows = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8-sig"))))
    assert len(rows) == 60 and [int(r["rank"]) for r in rows] == list(range(1, 61))
    vals = [float(r["context"]) for r in rows]  # ranked by context (issue 24.11)
    assert vals == sorted(vals, reverse=True)
    assert {r["layer"] for r in rows} == {"layer 0", "layer 1", "layer 2"}
    code, stdout, _ = run_main(capsys, "similarity", path, SENTENCE, "--json")
    assert code == 0 and len(json.loads(stdout)["layers"]) == 3
    code, _, err = run_main(capsys, "influence", path, SENTENCE, "--csv", tmp_path / "x.json")
    assert code == 2 and "expected a .csv" in err


def test_the_csv_shows_spaces_quotes_commas_and_never_starts_a_formula(tmp_path):
    """Read back with the csv module: every token as the terminal shows it (a space is ␣), a
    comma or a quote inside its quoted cell, and a cell a spreadsheet would run as a formula
    (= + - @) prefixed with '."""
    from attnlab.tokenizers import CharTokenizer

    text = '=1+2, "x" -@y'
    torch.manual_seed(0)
    tok = CharTokenizer.from_text(text + "abc")
    model = tiny_gpt(tok, n_layer=2).eval()
    inf = influence(model, record(model, tok, text))
    path = inf.to_csv(tmp_path / "inf.csv")
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw  # UTF-8 BOM, RFC 4180 rows
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(inf.rows) == 2 * len(text)
    shown = {"=": "'=", "+": "'+", "-": "'-", "@": "'@", " ": "␣", ",": ",", '"': '"'}
    for row, r in zip(rows, inf.rows):
        assert row["token"] == shown.get(r.token, r.token) and int(row["position"]) == r.position
        assert text[r.position] == r.token
        assert float(row["rel_change"]) == pytest.approx(r.rel_change, abs=1e-6)
        assert float(row["cosine"]) == pytest.approx(r.cosine, abs=1e-6)  # numbers stay numbers
        for col in ("layer", "token", "top_sources"):
            assert not row[col].startswith(("=", "+", "-", "@")), row
        sources = [s.split(":") for s in row["top_sources"].split("; ")]
        assert [int(s[0]) for s in sources] == [j for j, _, _ in r.sources]
    assert {row["token"] for row in rows} >= {"'=", "'+", "'-", "'@", "␣", ",", '"'}


def _one_hot_rows(target: dict[int, int]):
    """An edit of attention weights (B, H, T, S): every token attends only to itself, except
    row i, which attends only to target[i]."""

    def edit(w, name):
        T = w.size(-2)
        out = torch.zeros_like(w)
        for i in range(T):
            out[..., i, target.get(i, i)] = 1.0
        return out

    return edit


def test_a_token_made_to_read_another_ranks_first_by_context():
    """Issue 24.11: the ranking measured the change against a small embedding, mostly FFN work.
    Here every token attends only to itself except one, which reads an earlier token: it alone
    was moved by context, whatever the FFNs and the raw changes say."""
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = tiny_gpt(tok, n_layer=2).eval()
    with torch.no_grad():
        model.blocks[0].mlp.fc2.weight.mul_(50.0)  # layer 0's per-token work dominates change
    text, reader, read = "I like to eat apples", 14, 2
    edit = {"blocks.0.attn.weights": _one_hot_rows({}),
            "blocks.1.attn.weights": _one_hot_rows({reader: read})}  # fmt: skip
    with hooks.record(model, names=[], edit=edit):
        rec = record(model, tok, text)
    inf = influence(model, rec)
    first = inf.rows[0]
    assert (first.block, first.position) == (1, reader) and first.context > 0.01
    assert all(r.context == pytest.approx(0.0, abs=1e-12) for r in inf.rows[1:])
    assert max(inf.rows, key=lambda r: r.rel_change).block == 0  # the old ranking's top
    assert first.sources[0][0] == read


def test_scaling_a_feed_forward_network_leaves_the_context_ranking_alone(run):
    _, model, tok = run
    before = influence(model, record(model, tok, SENTENCE))
    last = model.blocks[-1].mlp.fc2
    w, b = last.weight.detach().clone(), last.bias.detach().clone()
    try:
        with torch.no_grad():
            last.weight.mul_(30.0)
            last.bias.mul_(30.0)
        after = influence(model, record(model, tok, SENTENCE))
    finally:
        with torch.no_grad():
            last.weight.copy_(w)
            last.bias.copy_(b)
    key = lambda inf: [(r.block, r.position) for r in inf.rows]  # noqa: E731
    assert key(after) == key(before)
    np.testing.assert_allclose([r.context for r in after.rows],
                               [r.context for r in before.rows], rtol=1e-9)  # fmt: skip
    top_change = lambda inf: max(inf.rows, key=lambda r: r.rel_change)  # noqa: E731
    assert top_change(after).block == len(model.blocks) - 1  # the raw change follows the FFN
    assert top_change(after).ffn_share > 0.8


def test_influence_says_what_context_means(run, capsys):
    path, _, _ = run
    code, out, err = run_main(capsys, "influence", path, SENTENCE, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["definition"]["ranked_by"] == "context"
    assert "attention to itself" in d["definition"]["context"]
    assert all("context" in r and "ffn_share" in r for r in d["rows"])
    code, out, err = run_main(capsys, "influence", path, SENTENCE)
    assert code == 0 and "attention to itself" in " ".join(out.split()), out
