"""The readability check every picture attnlab writes passes (attnlab.render.layout, issue 32
item 4): each rule flags the fault it names, and a clean picture passes. Any test can run it on
a new picture: ``problems(fig)``, or ``check_figures()`` around code that saves figures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attnlab.render.layout import check_figures, problems  # noqa: E402
from attnlab.render.plots import MASKED, heatmap, save_png  # noqa: E402

TOKENS = list("I like apples")


def clean_heatmap():
    fig, ax = plt.subplots(figsize=(4, 4))
    heatmap(ax, np.eye(len(TOKENS)), TOKENS, TOKENS, title="a head",
            colorbar_label="attention weight")  # fmt: skip
    return fig


def test_a_clean_heatmap_passes():
    fig = clean_heatmap()
    assert problems(fig) == []
    plt.close(fig)


def test_single_characters_are_upright_and_turning_them_is_flagged():
    fig = clean_heatmap()
    ax = fig.axes[0]
    assert all(t.get_rotation() == 0 for t in ax.get_xticklabels())
    for t in ax.get_xticklabels():
        t.set_rotation(90)
    assert any("turned" in p for p in problems(fig))
    plt.close(fig)


def test_an_unlabelled_colour_bar_or_axis_is_flagged():
    fig, ax = plt.subplots()
    heatmap(ax, np.eye(3), list("abc"), list("abc"), xlabel="", ylabel="", title="t")
    found = problems(fig)
    assert any("colour bar has no label" in p for p in found)
    assert any("x axis" in p and "no label" in p for p in found)
    assert any("y axis" in p and "no label" in p for p in found)
    plt.close(fig)


def test_labels_that_collide_or_are_cut_are_flagged():
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    ax.set_xticks([0, 0.02], ["a long tick label", "another long one"])
    ax.set_xlabel("x")
    ax.set_ylabel("a y label far longer than the picture is tall, so it is cut " * 2)
    found = problems(fig, tight=False)
    assert any("overlaps" in p for p in found)
    assert any("cut by the edge" in p for p in found)
    plt.close(fig)


def test_a_tick_label_over_its_own_axes_is_flagged():
    """The ViT map's centred y labels ran into the matrix ("r0c|0")."""
    fig, ax = plt.subplots()
    ax.imshow(np.eye(3))
    ax.set_yticks(range(3), ["r0c0", "r0c1", "r0c2"], ha="center")
    ax.set_xticks([])
    ax.set_ylabel("query")
    assert any("drawn over its own axes" in p for p in problems(fig))
    plt.close(fig)


def test_lines_of_several_colours_need_a_legend():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], color="tab:blue")
    ax.plot([0, 1], [1, 0], color="0.6")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    assert any("no legend" in p for p in problems(fig))
    ax.legend(["importance order", "random order"])
    assert problems(fig) == []
    plt.close(fig)


def test_a_picture_too_wide_to_show_or_with_tiny_text_is_flagged():
    fig, ax = plt.subplots(figsize=(20, 2), dpi=110)
    ax.plot([0, 1], [0, 1])
    ax.set_xlabel("x", fontsize=3)
    ax.set_ylabel("y")
    found = problems(fig)
    assert any("pixels wide" in p for p in found) and any("points" in p for p in found)
    plt.close(fig)


def test_masked_cells_are_grey_not_the_colour_of_a_weight_of_0(tmp_path):
    """Issue 32 item 4: a causal map's future cells were drawn as weight 0."""
    w = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]  # (T, T), causal rows
    fig, ax = plt.subplots(figsize=(4, 4))
    im = heatmap(ax, w, list("abcd"), list("abcd"), colorbar_label="attention weight",
                 masked=np.triu(np.ones((4, 4), bool), 1))  # fmt: skip
    fig.canvas.draw()
    rgba = im.to_rgba(im.get_array())  # (T, T, 4) as drawn
    grey = matplotlib.colors.to_rgba(MASKED)
    assert np.allclose(rgba[0, 3], grey) and not np.allclose(rgba[1, 1], grey)
    assert not np.allclose(im.cmap(im.norm(0.0)), grey)  # a weight of 0 is another colour
    (bar,) = ax.child_axes
    assert "grey: masked" in bar.get_ylabel()  # and the colour bar says what grey is
    assert problems(fig) == []
    with check_figures() as seen:
        save_png(fig, tmp_path / "a.png")
    assert len(seen) == 1 and seen[0][1] == []


@pytest.mark.parametrize("n", [5, 30, 70])
def test_heatmaps_of_every_size_pass(n):
    """Upright labels while they fit, a quarter turn when not, positions past 64."""
    words = [f"word{i}" for i in range(n)]
    fig, ax = plt.subplots(figsize=(min(12, 0.3 * n + 2), min(12, 0.3 * n + 2)))
    heatmap(ax, np.random.default_rng(0).random((n, n)), words, words, title="map",
            colorbar_label="weight")  # fmt: skip
    assert problems(fig) == []
    plt.close(fig)


@pytest.mark.parametrize("rows", [24, 60])
def test_tick_labels_too_close_for_their_rows_are_fitted_when_saved(tmp_path, rows):
    """render.plots._ticks set one label per row whatever the row's height: a short panel of
    many rows (similarity's grid on a deep model) drew its y labels over each other. Saved,
    they are made smaller or every k-th is kept, each still at its own row."""
    tokens = [chr(ord("a") + i % 26) for i in range(rows)]
    fig, ax = plt.subplots(figsize=(2.4, 2.4))
    heatmap(ax, np.zeros((rows, rows)), tokens, tokens, title="a panel", fontsize=8,
            colorbar_label="weight")  # fmt: skip
    assert any("y tick label" in p and "overlaps" in p for p in problems(fig))  # as drawn
    with check_figures() as seen:
        save_png(fig, tmp_path / "a.png")
    assert seen[0][1] == []
    shown = [t for t in ax.yaxis.get_major_ticks() if t.label1.get_visible()]
    assert 2 <= len(shown) <= rows
    assert all(t.label1.get_text() == tokens[int(t.get_loc())] for t in shown)  # its own row


def test_labels_fitted_after_a_layout_are_checked_as_fitted_not_as_first_laid_out():
    """lay_out reuses a layout the figure has not changed since; fitting tick labels changes
    them without matplotlib marking the figure, so fit_tick_labels marks it: what the check
    then measures is the labels as saved (small and thinned), not as first laid out."""
    import matplotlib.pyplot as plt

    from attnlab.render.layout import lay_out
    from attnlab.render.plots import fit_tick_labels

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(range(40), [f"token{i}" for i in range(40)], rotation=90)
    ax.set_yticks(range(40), [f"token{i}" for i in range(40)])
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    renderer = lay_out(fig, 100)
    before = [t.label1.get_window_extent(renderer).height for t in ax.yaxis.get_major_ticks()]
    assert problems(fig, dpi=100)  # forty labels in two inches collide
    fit_tick_labels(fig, 100)
    shown = [t for t in ax.yaxis.get_major_ticks() if t.label1.get_visible()]
    assert len(shown) < 40 and shown[0].label1.get_window_extent(renderer).height < before[0]
    # the axis label stands where a layout of the fitted labels puts it (not where it stood
    # beside the first, larger ones)
    where = ax.yaxis.label.get_window_extent(renderer).x0
    fig.draw_without_rendering()
    assert ax.yaxis.label.get_window_extent(renderer).x0 == where
    assert not [p for p in problems(fig, dpi=100) if "overlap" in p], problems(fig, dpi=100)
    plt.close(fig)
