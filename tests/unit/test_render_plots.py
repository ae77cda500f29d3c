"""The one heatmap renderer (attnlab.render.plots): checked on the figure objects."""

from __future__ import annotations

import ast
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attnlab.errors import AttnlabError  # noqa: E402
from attnlab.render.plots import MAX_LABELS, heatmap, overlay, png_html, save_png  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"


def draw(m, *args, **kw):
    fig, ax = plt.subplots(figsize=(5, 4))
    im = heatmap(ax, m, *args, **kw)
    fig.canvas.draw()  # lays the axes out (aspect, insets) as saving would
    return fig, ax, im


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from(["equal", "auto"]))
def test_the_colourbar_is_exactly_as_tall_as_the_matrix_drawn(rows, cols, aspect):
    m = np.random.default_rng(rows * 100 + cols).random((rows, cols))
    fig, ax, im = draw(m, aspect=aspect)
    cax = im.colorbar.ax
    drawn, bar = ax.get_position(original=False), cax.get_position(original=False)
    assert bar.height == pytest.approx(drawn.height, rel=1e-6)
    assert bar.y0 == pytest.approx(drawn.y0, rel=1e-6, abs=1e-9)
    assert bar.x0 > drawn.x1  # beside the matrix, not over it
    plt.close(fig)


def test_tokens_label_the_axes_and_spaces_are_visible():
    rows, cols = ["I", " like", "\n"], ["a", " b"]
    fig, ax, im = draw(np.eye(3, 2), rows, cols, title="layer 0 head 1")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["I", "␣like", "↵"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "␣b"]
    assert ax.get_title() == "layer 0 head 1"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("key (attended to)", "query")


def test_past_the_label_limit_the_axes_show_positions():
    n = MAX_LABELS + 1
    fig, ax, im = draw(np.zeros((n, n)), ["x"] * n, ["x"] * n)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("key position", "query position")
    assert "x" not in {t.get_text() for t in ax.get_xticklabels()}


def test_no_labels_means_no_ticks_and_the_range_is_the_matrix_own():
    m = np.array([[0.2, 0.4], [0.1, 0.3]])
    fig, ax, im = draw(m, colorbar=False)
    assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []
    assert im.get_clim() == (0.0, 0.4) and im.colorbar is None
    assert draw(m, vmin=None, colorbar=False)[2].get_clim() == (0.1, 0.4)
    assert draw(m, vmin=0.0, vmax=1.0)[2].get_clim() == (0.0, 1.0)


def luminance(rgba) -> float:
    r, g, b, _ = rgba
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["viridis", "Blues", "RdBu_r", "inferno"]), st.integers(0, 10_000))
def test_annotations_are_white_on_dark_cells_and_black_on_light_ones(cmap, seed):
    m = np.random.default_rng(seed).uniform(-1, 1, (3, 4))
    m[0, 0] = np.nan  # a cell with no value gets no text
    fig, ax, im = draw(m, annotate=True, cmap=cmap, vmin=-1.0, vmax=1.0, fmt="{:+.1f}")
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
    assert set(texts) == {(i, j) for i in range(3) for j in range(4)} - {(0, 0)}
    for (i, j), t in texts.items():
        assert t.get_text() == f"{m[i, j]:+.1f}"
        dark = luminance(im.cmap(im.norm(m[i, j]))) < 0.5
        assert t.get_color() == ("white" if dark else "black")
    plt.close(fig)


def test_an_overlay_tints_each_patch_and_leaves_the_image_visible():
    """Issue 32 item 4: the ViT's overlay hid the digit (an opaque colour over it). Each patch
    is tinted more opaque the larger its value, never more than 60%: the image shows through
    everywhere, and a patch that scores nothing is left as it is."""
    img = np.random.default_rng(0).random((8, 8))
    grid = np.arange(4.0).reshape(2, 2)  # 2 x 2 patches of 4 x 4 pixels
    fig, ax = plt.subplots()
    mappable = overlay(ax, img, grid, title="[CLS] rollout", colorbar_label="rollout")
    fig.canvas.draw()
    base, top = ax.get_images()
    assert base.get_extent() == top.get_extent() == [-0.5, 7.5, 7.5, -0.5]
    np.testing.assert_array_equal(base.get_array(), img)  # the image itself, untouched
    alpha = np.asarray(top.get_array())[..., 3]  # (2, 2): the tint's opacity per patch
    assert alpha[0, 0] == 0 and alpha.max() == pytest.approx(0.6) and alpha[1, 1] == alpha.max()
    assert mappable.get_clim() == (0.0, 3.0)
    assert list(ax.get_xticks()) == [] and ax.get_title() == "[CLS] rollout"
    bar = mappable.colorbar.ax.get_position(original=False)
    assert bar.height == pytest.approx(ax.get_position(original=False).height, rel=1e-6)
    assert mappable.colorbar.ax.get_ylabel() == "rollout"
    assert overlay(ax, img, grid, vmin=-5, vmax=5, colorbar=False).get_clim() == (-5, 5)


def test_save_png_is_atomic_refuses_other_formats_and_closes_the_figure(tmp_path):
    fig, ax, im = draw(np.eye(3))
    path = save_png(fig, tmp_path / "map.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plt.get_fignums() == []
    fig, ax, im = draw(np.eye(3))
    with pytest.raises(AttnlabError, match="PNG"):
        save_png(fig, tmp_path / "map.jpg")
    assert plt.get_fignums() == [] and sorted(p.name for p in tmp_path.iterdir()) == ["map.png"]
    fig, ax, im = draw(np.eye(3))
    assert png_html(fig).startswith('<img src="data:image/png;base64,iVBOR')


def test_every_heatmap_in_src_is_drawn_by_the_one_renderer():
    """No module but render/plots.py calls imshow, pcolormesh or matshow, or adds a colourbar (the
    interventions' tables and image maps included)."""
    drawers = {"imshow", "pcolormesh", "matshow", "pcolor", "colorbar"}
    found = []
    for path in sorted((SRC / "attnlab").rglob("*.py")):
        if path == SRC / "attnlab" / "render" / "plots.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in drawers:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.attr}")
    assert found == []


@pytest.mark.parametrize("tight_layout", [False, True])
def test_save_png_writes_what_a_tight_savefig_writes_with_one_layout_pass_less(
    tmp_path, monkeypatch, tight_layout
):
    """save_png crops to the box it has just measured, so matplotlib does not lay the figure
    out a second time (with "tight", or after ``tight_layout``): one layout pass and one
    painted draw where the labels fit, and the same pixels as ``bbox_inches="tight"``."""
    from matplotlib.figure import Figure

    from attnlab.render.plots import fit_tick_labels

    def figure():
        fig, axes = plt.subplots(1, 2, figsize=(6, 3))
        for i, ax in enumerate(axes):
            heatmap(ax, np.arange(9.0).reshape(3, 3) + i, list("abc"), list("xyz"))
        fig.suptitle("two maps")
        if tight_layout:
            fig.tight_layout()
        return fig

    fig = figure()
    fit_tick_labels(fig, 110)
    fig.savefig(tmp_path / "tight.png", format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    draws = []
    real = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, r: draws.append(1) or real(self, r))
    save_png(figure(), tmp_path / "ours.png")
    assert len(draws) == 2  # the layout fit_tick_labels measures, then the pixels
    assert (tmp_path / "ours.png").read_bytes() == (tmp_path / "tight.png").read_bytes()


def test_tiles_put_each_matrix_in_its_place_on_one_colour_range_with_masked_cells_grey():
    from matplotlib.colors import to_rgba

    from attnlab.render.plots import MASKED, tiles

    rng = np.random.default_rng(0)
    grid = [[rng.random((3, 4)), rng.random((3, 4))], [rng.random((2, 4)), None]]  # ragged
    hidden = [np.zeros((3, 4), bool), None]
    hidden[0][0, 3] = True
    fig, ax = plt.subplots()
    bar, ys, xs = tiles(ax, grid, vmax=2.0, masked=hidden)
    img = ax.images[0].get_array()  # (rows, cols, RGBA)
    colour = bar.to_rgba  # the colour bar's map: 0..2
    for r, row in enumerate(grid):
        for c, m in enumerate(row):
            y0, x0 = round(ys[r] - (3 - 1) / 2), round(xs[c] - (4 - 1) / 2)
            if m is None:
                assert (img[y0 : y0 + 3, x0 : x0 + 4] == 1).all()  # white: no map there
                continue
            want = colour(m)
            if hidden[r] is not None:
                want[hidden[r]] = to_rgba(MASKED)
            assert np.allclose(img[y0 : y0 + m.shape[0], x0 : x0 + 4], want)
    assert (img[3, :] == 1).all() and (img[:, 4] == 1).all()  # a white gap between tiles
    assert bar.norm.vmin == 0.0 and bar.norm.vmax == 2.0
