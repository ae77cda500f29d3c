"""Attention maps: rows sum to 1, causal zeros, hand-computable values, PNGs, and the CLI verb."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.inspect import InspectError, attention, attention_grid
from look_helpers import SENTENCE, char_tokenizer, make_run, run_main, tiny_gpt

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("look") / "run")


def test_attention_rows_sum_to_one_and_ignore_the_future(run):
    _, model, tok = run
    rec = model.record_text(tok, SENTENCE)
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
    rec = model.record_text(tok, SENTENCE)
    N = len(SENTENCE)
    expected = np.tril(np.ones((N, N))) / np.arange(1, N + 1)[:, None]
    for h in (0, 1):
        np.testing.assert_allclose(attention(rec, head=h).weights, expected, atol=1e-6)


def test_attention_renders_for_terminal_json_and_notebook(run):
    _, model, tok = run
    m = attention(model.record_text(tok, SENTENCE), layer=1, head=1)
    text = str(m)
    assert "layer 1 self-attention, head 1" in text
    assert "apples"[0] in text and "␣" in text  # spaces made visible
    d = json.loads(m.to_json())
    assert d["shape"] == [len(SENTENCE)] * 2 and d["head"] == 1
    np.testing.assert_allclose(np.array(d["weights"]).sum(-1), 1.0, atol=1e-4)
    html = m._repr_html_()
    assert html.count("<tr>") == len(SENTENCE) + 1 and "background:rgba" in html


def test_long_input_table_is_cut_with_a_message():
    tok = char_tokenizer()
    model = tiny_gpt(tok, block_size=80).eval()
    text = (SENTENCE + " ") * 3
    m = attention(model.record_text(tok, text))
    assert f"showing tokens 0..31 of {len(text)}" in str(m)
    assert f"showing tokens 10..41 of {len(text)}" in str(
        attention(model.record_text(tok, text), start=10)
    )


def test_heatmap_and_grid_pngs(run, tmp_path):
    _, model, tok = run
    rec = model.record_text(tok, SENTENCE)
    one = attention(rec, layer=0, head=1).save_png(tmp_path / "one.png")
    grid = attention_grid(rec)
    assert [m.name for m in grid.maps] == ["blocks.0.attn.weights", "blocks.1.attn.weights"]
    grid.save_png(tmp_path / "grid.png")
    for p in (one, tmp_path / "grid.png"):
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 2000
    assert "head 1" in str(grid)
    with pytest.raises(InspectError, match="PNG"):
        attention(rec).save_png(tmp_path / "map.jpg")
    assert not (tmp_path / "map.jpg").exists()


def test_attention_cli(run, cli, tmp_path):
    path, _, _ = run
    r = cli(
        "attention", path, SENTENCE, "--layer", "1", "--head", "1", "--json"
    )  # real entry point
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["layer"], d["head"], d["queries"]) == (1, 1, list(SENTENCE))
    np.testing.assert_allclose(np.array(d["weights"]).sum(-1), 1.0, atol=1e-4)


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


# ---------------------------------------------------------------------------------------------
# The pictures, read from the figure objects
# ---------------------------------------------------------------------------------------------


def _drawn(fig):
    fig.canvas.draw()  # lays the axes out (aspect, insets) as saving would
    return fig


def _colourbars(fig) -> set:
    """Every distinct colourbar of the figure's images (insets included)."""
    axes = [*fig.axes, *(c for ax in fig.axes for c in ax.child_axes)]
    return {id(im.colorbar) for ax in axes for im in ax.images if im.colorbar is not None}


def _seq2seq_rec(lstm: bool):
    from attnlab.inspect import record
    from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
    from attnlab.tokenizers import CharTokenizer, PairTokenizer

    torch.manual_seed(0)
    tok = PairTokenizer(CharTokenizer("abcdefgh "), CharTokenizer("0123"))
    sizes = dict(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size)
    if lstm:
        model = RNNSeq2Seq(RNNConfig(**sizes, attention="additive"))
    else:
        model = Seq2SeqTransformer(Seq2SeqConfig(**sizes, max_len=24, d_model=16, n_head=2,
                                                 dropout=0.0))  # fmt: skip
    return record(model.eval(), tok, "bad cafe deaf bead")


def test_the_grid_has_a_title_layer_and_head_labels_and_one_colourbar(run):
    import matplotlib.pyplot as plt

    _, model, tok = run
    rec = model.record_text(tok, SENTENCE)
    fig = _drawn(attention_grid(rec, title=f"runs/mine: {SENTENCE!r}").figure())
    assert fig._suptitle.get_text().splitlines()[0] == "runs/mine: 'I like to eat apples'"
    bars = {im.colorbar.ax for ax in fig.axes for im in ax.images if im.colorbar is not None}
    grid = [ax for ax in fig.axes if ax.images and ax not in bars]
    assert len(grid) == 4  # 2 layers x 2 heads
    assert [ax.get_title() for ax in grid] == ["head 0", "head 1", "", ""]
    assert [ax.get_ylabel().splitlines()[0] for ax in grid[::2]] == ["layer 0 self", "layer 1 self"]
    assert [ax.get_xlabel() for ax in grid[2:]] == ["key", "key"]
    for ax in grid:  # 20 tokens fit: the ticks are the tokens, spaces visible
        assert [t.get_text() for t in ax.get_xticklabels()] == list(SENTENCE.replace(" ", "␣"))
        assert [t.get_text() for t in ax.get_yticklabels()] == list(SENTENCE.replace(" ", "␣"))
    assert len(_colourbars(fig)) == 1 and not any(ax.child_axes for ax in grid)
    assert {ax.images[0].get_clim() for ax in grid} == {grid[0].images[0].get_clim()}
    (bar,) = [ax for ax in fig.axes if ax not in grid]
    boxes = [ax.get_position(original=False) for ax in grid]
    top, bottom = max(b.y1 for b in boxes), min(b.y0 for b in boxes)
    box = bar.get_position(original=False)
    assert box.height == pytest.approx(top - bottom, rel=1e-6) and box.y0 == pytest.approx(bottom)
    assert box.x0 > max(b.x1 for b in boxes)
    plt.close(fig)


def test_a_long_input_grid_shows_positions_not_tokens():
    import matplotlib.pyplot as plt

    tok = char_tokenizer()
    model = tiny_gpt(tok, block_size=80).eval()
    fig = _drawn(attention_grid(model.record_text(tok, (SENTENCE + " ") * 3)).figure())
    assert all(not ax.get_xticklabels() for ax in fig.axes[:4])
    plt.close(fig)


def test_an_encoder_decoder_grid_labels_each_map_self_and_cross():
    import matplotlib.pyplot as plt

    rec = _seq2seq_rec(lstm=False)
    grid = attention_grid(rec)
    fig = _drawn(grid.figure())
    labels = [ax.get_ylabel().split("\n")[0] for ax in fig.axes if ax.get_ylabel()]
    assert [i.label for i in grid.maps] == [x for x in labels if x != "attention weight"]
    assert "decoder layer 1 cross" in labels and len(_colourbars(fig)) == 1
    assert fig._suptitle.get_text().startswith("'bad cafe deaf bead'")
    plt.close(fig)


@pytest.mark.parametrize("which", ["gpt", "transformer-cross", "lstm-cross"])
def test_each_heatmap_has_one_colourbar_exactly_as_tall_as_its_matrix(run, which):
    import matplotlib.pyplot as plt

    if which == "gpt":
        _, model, tok = run
        m = attention(model.record_text(tok, SENTENCE), layer=1, head=1)
    else:
        m = attention(_seq2seq_rec(lstm=which == "lstm-cross"), name="cross", mean=True)
        assert m.kind == "cross" and len(m.queries) != len(m.keys)
    fig = _drawn(m.figure())
    (ax,) = fig.axes
    (bars,) = _colourbars(fig) and [c for c in ax.child_axes]
    drawn, bar = ax.get_position(original=False), bars.get_position(original=False)
    assert bar.height == pytest.approx(drawn.height, rel=1e-6)
    assert bar.y0 == pytest.approx(drawn.y0, rel=1e-6) and bar.x0 > drawn.x1
    plt.close(fig)


def test_attention_all_prints_the_grid_summary_not_one_heads_table(run, capsys, tmp_path):
    path, _, _ = run
    code, out, err = run_main(
        capsys, "attention", path, SENTENCE, "--all", "--png", tmp_path / "g.png"
    )
    assert code == 0, err
    assert out.strip() == (
        f"{tmp_path / 'g.png'}: attention grid, 2 maps x 2 heads (layer 0 self, layer 1 self), "
        "20 x 20 tokens"
    )
    assert "wrote attention grid" in err and (tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC
    code, out, err = run_main(
        capsys, "attention", path, SENTENCE, "--all", "--png", tmp_path / "h.png", "--json"
    )
    d = json.loads(out)
    assert d["png"] == str(tmp_path / "h.png") and d["title"] == f"{path}: {SENTENCE!r}"
    assert [m["name"] for m in d["maps"]] == ["blocks.0.attn.weights", "blocks.1.attn.weights"]
