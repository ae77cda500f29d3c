"""The attention pictures, read from the figure objects (not pixels): the grid's title, layer and
head labels, its one colourbar and token ticks; each map's colourbar as tall as its matrix; and
what `attention --all --png` prints."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402
import torch  # noqa: E402

from attnlab.inspect import attention, attention_grid  # noqa: E402
from attnlab.inspect.recording import record
from look_helpers import SENTENCE, char_tokenizer, run_main, tiny_gpt  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
    rec = record(model, tok, SENTENCE)
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
    fig = _drawn(attention_grid(record(model, tok, (SENTENCE + " ") * 3)).figure())
    assert all(not ax.get_xticklabels() for ax in fig.axes[:4])
    plt.close(fig)


def test_an_encoder_decoder_grid_labels_each_map_self_and_cross():
    import matplotlib.pyplot as plt

    rec = _seq2seq_rec(lstm=False)
    grid = attention_grid(rec)
    fig = _drawn(grid.figure())
    labels = [ax.get_ylabel().split("\n")[0] for ax in fig.axes if ax.get_ylabel()]
    assert [i.label for i in grid.maps] == [x for x in labels
                                            if not x.startswith("attention weight")]  # fmt: skip
    assert "decoder layer 1 cross" in labels and len(_colourbars(fig)) == 1
    assert fig._suptitle.get_text().startswith("'bad cafe deaf bead'")
    plt.close(fig)


@pytest.mark.parametrize("which", ["gpt", "transformer-cross", "lstm-cross"])
def test_each_heatmap_has_one_colourbar_exactly_as_tall_as_its_matrix(run, which):
    import matplotlib.pyplot as plt

    if which == "gpt":
        _, model, tok = run
        m = attention(record(model, tok, SENTENCE), layer=1, head=1)
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
    assert " ".join(out.split()) == (  # a line folded to the width, joined
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
