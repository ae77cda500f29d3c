"""Attention maps: rows sum to 1, causal zeros, hand-computable values, PNGs, and the CLI verb."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.inspect import InspectError, attention, attention_grid
from attnlab.inspect.recording import record
from attnlab.render.display import show_token
from look_helpers import SENTENCE, char_tokenizer, run_main, tiny_gpt
from printed import Printed

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_attention_rows_sum_to_one_and_ignore_the_future(run):
    _, model, tok = run
    rec = record(model, tok, SENTENCE)
    N = len(SENTENCE)
    for layer in (0, 1):
        for head in (0, 1):
            m = attention(rec, layer=layer, head=head)
            assert m.weights.shape == (N, N)
            np.testing.assert_allclose(m.weights.sum(-1), 1.0, atol=1e-5)
            assert np.all(np.triu(m.weights, k=1) == 0)
            assert m.queries == m.keys == list(SENTENCE)
        mean = attention(rec, layer=layer, mean=True)
        both = np.stack([attention(rec, layer=layer, head=h).weights for h in (0, 1)])
        np.testing.assert_allclose(mean.weights, both.mean(0), atol=1e-6)
    with pytest.raises(InspectError, match="no head 7"):
        attention(rec, head=7)


def test_zero_query_weights_give_uniform_causal_attention_by_hand():
    """W_Q = 0 and no bias: every score is 0, so query i spreads 1/(i+1) over keys 0..i."""
    tok = char_tokenizer()
    model = tiny_gpt(tok, n_layer=1, n_head=2).eval()
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.zero_()
        model.blocks[0].attn.q_proj.bias.zero_()
    rec = record(model, tok, SENTENCE)
    N = len(SENTENCE)
    expected = np.tril(np.ones((N, N))) / np.arange(1, N + 1)[:, None]
    for h in (0, 1):
        np.testing.assert_allclose(attention(rec, head=h).weights, expected, atol=1e-6)


def test_attention_renders_for_terminal_json_and_notebook(run):
    _, model, tok = run
    m = attention(record(model, tok, SENTENCE), layer=1, head=1)
    text = Printed(str(m))
    assert "layer 1 self-attention, head 1" in text
    assert "apples"[0] in text and "␣" in text  # spaces made visible
    d = json.loads(m.to_json())
    assert d["shape"] == [len(SENTENCE)] * 2 and d["head"] == 1
    np.testing.assert_allclose(np.array(d["weights"]).sum(-1), 1.0, atol=1e-4)
    html = m._repr_html_()
    assert html.count("<tr>") == len(SENTENCE) + 1 and "background:rgba" in html


def test_long_input_table_pages_its_keys_and_says_how_to_see_the_rest():
    tok = char_tokenizer()
    model = tiny_gpt(tok, block_size=80).eval()
    text = (SENTENCE + " ") * 3
    out = str(attention(record(model, tok, text)))  # 160 columns: more than one page
    last = out.splitlines()[-1]
    assert last.startswith("keys 0..") and f"of {len(text)} shown; --start " in last, last
    n = int(last.split("keys 0..")[1].split()[0]) + 1
    assert f"--start {n} shows the keys from {n}" in last
    assert sum(line.startswith("I ") for line in out.splitlines()) >= 1  # every query row
    shifted = str(attention(record(model, tok, text), start=10)).splitlines()
    assert shifted[1].startswith("keys 10..")  # each page says which keys it holds
    assert shifted[2].split()[0] == show_token(text[10])  # the first key shown is token 10
    assert shifted[-1].startswith("keys 10..") and shifted[-1].endswith("all of them")


def test_heatmap_and_grid_pngs(run, tmp_path):
    _, model, tok = run
    rec = record(model, tok, SENTENCE)
    one = attention(rec, layer=0, head=1).save_png(tmp_path / "one.png")
    grid = attention_grid(rec)
    assert [m.name for m in grid.maps] == ["blocks.0.attn.weights", "blocks.1.attn.weights"]
    grid.save_png(tmp_path / "grid.png")
    for p in (one, tmp_path / "grid.png"):
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 2000
    assert "head 1" in Printed(str(grid))
    with pytest.raises(AttnlabError, match="PNG"):  # the rendering layer says it
        attention(rec).save_png(tmp_path / "map.jpg")
    assert not (tmp_path / "map.jpg").exists()


def test_attention_cli_pngs_and_bad_input(run, capsys, tmp_path):
    path, _, _ = run
    code, out, err = run_main(
        capsys, "attention", path, SENTENCE, "--mean", "--png", tmp_path / "m.png"
    )
    assert code == 0, err
    assert "mean over heads" in out and "wrote attention heatmap" in err
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG_MAGIC
    code, out, err = run_main(
        capsys, "attention", path, SENTENCE, "--all", "--png", tmp_path / "g.png"
    )
    assert code == 0 and (tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC

    for args, msg in [
        (["--head", "9"], "no head 9"),
        (["--layer", "4"], "no layer 4"),
        (["--all"], "--all draws the grid"),
        (["--png", tmp_path / "nodir" / "x.png"], "does not exist"),
        (["--png", tmp_path / "x.txt"], "expected a .png"),
    ]:
        code, _, err = run_main(capsys, "attention", path, SENTENCE, *args)
        assert code == 2, (args, err)
        assert msg in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "attention", path, "a" * 200)
    assert code == 2 and "reads at most 48" in err
    code, _, err = run_main(capsys, "attention", path, "I like €")
    assert code == 2 and "not in the vocabulary" in err
    code, _, err = run_main(capsys, "attention", tmp_path / "missing", SENTENCE)
    assert code == 2 and "no such run directory" in err
    assert not list(tmp_path.glob(".*.tmp")) and not (tmp_path / "x.txt").exists()
