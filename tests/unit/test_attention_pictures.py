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


def _tiles(fig):
    """The one image axes of a tiled grid (the other axes is its colour bar)."""
    (ax,) = [ax for ax in fig.axes if ax.images]
    (bar,) = [b for b in fig.axes if b is not ax]
    assert getattr(bar, "_colorbar", None) is not None  # and one colour bar
    return ax


def test_a_grid_whose_tokens_do_not_fit_is_one_image_of_tiles_named_by_head_and_map():
    import matplotlib.pyplot as plt

    tok = char_tokenizer()
    model = tiny_gpt(tok, block_size=80).eval()
    grid = attention_grid(record(model, tok, (SENTENCE + " ") * 3))
    fig = _drawn(grid.figure())
    ax = _tiles(fig)  # one image, not an axes a head: no token labels to place
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["layer 0 self", "layer 1 self"]
    n = len((SENTENCE + " ") * 3)
    assert f"every layer x head ({n} x {n} tokens a tile)" in ax.get_title()
    plt.close(fig)


def test_an_encoder_decoder_grid_labels_each_map_self_and_cross():
    import matplotlib.pyplot as plt

    rec = _seq2seq_rec(lstm=False)
    grid = attention_grid(rec)
    fig = _drawn(grid.figure())  # the decoder's 24 positions do not fit as labels: tiles
    labels = [t.get_text() for t in _tiles(fig).get_yticklabels()]
    assert [i.label for i in grid.maps] == labels and "decoder layer 1 cross" in labels
    assert _tiles(fig).get_title().startswith("'bad cafe deaf bead'")
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


@pytest.mark.parametrize("layers, heads, tokens", [(12, 1, 5), (24, 14, 16)])
def test_a_tall_grid_passes_the_readability_check(layers, heads, tokens):
    """A 24-layer, 14-head model's grid (Qwen2.5-0.5B's shape: tiles) and a tall grid of axes
    whose tokens fit: the title once ran into the heads' names on both."""
    import matplotlib.pyplot as plt
    import numpy as np

    from attnlab.inspect.attention import AttentionGrid
    from attnlab.inspect.recording import AttentionInfo
    from attnlab.render.layout import problems
    from attnlab.render.plots import fit_tick_labels

    rng = np.random.default_rng(0)
    causal = np.tril(np.ones((tokens, tokens)))
    maps = [AttentionInfo(f"blocks.{i}.attn.weights", "", i, "self", "", "", heads)
            for i in range(layers)]  # fmt: skip
    weights = [rng.random((heads, tokens, tokens)) * causal for _ in maps]
    labels = [([f"t{i}" for i in range(tokens)],) * 2 for _ in maps]
    fig = AttentionGrid(maps, [w / w.sum(-1, keepdims=True) for w in weights], labels, "'x'",
                        [None] * layers).figure()  # fmt: skip
    fit_tick_labels(fig, 110)
    assert problems(fig, dpi=110) == []
    plt.close(fig)
