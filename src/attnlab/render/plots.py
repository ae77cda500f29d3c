"""Heatmaps as pictures: the one renderer behind every heatmap PNG attnlab draws (attention
maps and grids, cross-attention, MiniLM heads, and the interventions' tables and image maps).

    heatmap(ax, m, rows, cols, title=...)   draw matrix m (R, C) on a matplotlib Axes
    overlay(ax, image, grid, ...)           a (g, g) patch grid drawn over an image (ViT)
    image(ax, img)                          an image as it is, grey, no ticks
    shared_colorbar(fig, axes, im)          one colourbar for a grid of heatmaps, as tall as it
    save_png(fig, path)                     write a figure as PNG atomically, then close it
    png_html(fig)                           the figure as an <img> a notebook shows

Row i of ``m`` is drawn as row i of the picture, labelled ``rows[i]``; column j is labelled
``cols[j]``. For attention, rows are the queries and columns the keys, so row i shows how much
token i reads from each token j. Titles, colour map, colour range and the colourbar are
arguments, so every picture looks the same unless it asks otherwise. No other module draws
rasters (imshow) or colourbars; a test holds src/ to that.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.render.display import show_token

MAX_LABELS = 64  # past this many tokens a side, ticks show positions instead of tokens


def heatmap(
    ax,
    matrix,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    *,
    title: str | None = None,
    cmap: str = "viridis",
    vmin: float | None = 0.0,
    vmax: float | None = None,
    colorbar: bool = True,
    colorbar_label: str | None = None,
    annotate: bool = False,
    fmt: str = "{:.2f}",
    xlabel: str | None = None,
    ylabel: str | None = None,
    fontsize: float = 8,
    title_size: float = 9,
    xtick_rotation: float = 90,
    aspect: str = "equal",
    max_labels: int = MAX_LABELS,
):
    """Draw ``matrix`` (R, C) on ``ax`` and return the image.

    - ``rows``/``cols``: tick labels (tokens are made visible: a space shows as ␣); None draws
      no ticks on that axis. When a side has more than ``max_labels`` labels, the ticks show
      positions and the axes say "query position" / "key position".
    - ``vmin``/``vmax``: the colour range; ``vmax=None`` is the matrix's largest value (so a
      head that spreads its attention thinly still shows contrast), ``vmin=None`` its smallest.
    - ``colorbar``: one colourbar to the right, exactly as tall as the drawn matrix whatever
      its shape (an inset of ``ax``, not a share of the figure).
    - ``annotate``: write each finite cell's value in it, ``fmt``-formatted (for small
      matrices), white on dark colours and black on light ones.
    - ``xlabel``/``ylabel``: default "key (attended to)" and "query" when tokens label the
      axes; pass "" for none.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    finite = m[np.isfinite(m)]
    if vmax is None:
        vmax = max(1e-9, float(finite.max())) if finite.size else 1.0
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect=aspect, interpolation="nearest")
    too_many = max(len(rows or ()), len(cols or ())) > max_labels
    if too_many:
        xlabel = "key position" if xlabel is None else xlabel
        ylabel = "query position" if ylabel is None else ylabel
    else:
        _ticks(ax.set_xticks, ax.set_xticklabels, cols, fontsize, rotation=xtick_rotation)
        _ticks(ax.set_yticks, ax.set_yticklabels, rows, fontsize)
        labelled = rows is not None or cols is not None
        xlabel = ("key (attended to)" if labelled else "") if xlabel is None else xlabel
        ylabel = ("query" if labelled else "") if ylabel is None else ylabel
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=fontsize)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=fontsize)
    if title:
        ax.set_title(title, fontsize=title_size)
    if annotate:
        for (i, j), v in np.ndenumerate(m):
            if np.isfinite(v):
                ax.text(j, i, fmt.format(v), ha="center", va="center",
                        fontsize=max(fontsize - 2, 5), color=text_colour(im, v))  # fmt: skip
    if colorbar:
        _colorbar(ax, im, fontsize, colorbar_label)
    return im


def text_colour(im, value: float) -> str:
    """White on a dark cell, black on a light one: by the relative luminance of the colour the
    image gives ``value`` (0.2126 R + 0.7152 G + 0.0722 B, on the sRGB values)."""
    r, g, b, _ = im.cmap(im.norm(value))
    return "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else "black"


def _colorbar(ax, im, fontsize: float, label: str | None = None):
    """One colourbar right of ``ax``, exactly as tall as it (an inset in ax's own coordinates,
    not a share of the figure)."""
    cax = ax.inset_axes([1.03, 0.0, 0.045, 1.0])
    bar = ax.figure.colorbar(im, cax=cax)
    bar.ax.tick_params(labelsize=fontsize)
    if label:
        bar.set_label(label, fontsize=fontsize)
    return bar


def shared_colorbar(fig, axes, im, label: str | None = None, fontsize: float = 8):
    """One colourbar right of a grid of heatmaps drawn with the same colour range, exactly as
    tall as the grid (from the lowest axes' bottom to the highest one's top). Call it once the
    layout is final (after ``tight_layout``): it reads where the axes were drawn."""
    fig.canvas.draw()  # applies each axes' aspect, so positions are where they are drawn
    boxes = [ax.get_position(original=False) for ax in axes]
    x1 = max(b.x1 for b in boxes)
    y0, y1 = min(b.y0 for b in boxes), max(b.y1 for b in boxes)
    cax = fig.add_axes((x1 + 0.012, y0, 0.012, y1 - y0))
    bar = fig.colorbar(im, cax=cax)
    bar.ax.tick_params(labelsize=fontsize)
    if label:
        bar.set_label(label, fontsize=fontsize)
    return bar


def image(ax, img, title: str | None = None, title_size: float = 9):
    """``img`` (H, W), or (H, W, C) channels last, in grey with no ticks."""
    im = ax.imshow(np.asarray(img).squeeze(), cmap="gray", interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=title_size)
    return im


def overlay(
    ax,
    img,
    grid,
    *,
    title: str | None = None,
    cmap: str = "inferno",
    vmin: float | None = None,
    vmax: float | None = None,
    alpha: float = 0.6,
    colorbar: bool = True,
    fontsize: float = 8,
    title_size: float = 9,
):
    """``grid`` (g, g), one value per image patch (row by row, as a ViT numbers them), drawn
    over ``img`` (H, W): patch (r, c) covers rows r*H/g .. (r+1)*H/g and the same for columns.
    ``vmin``/``vmax`` None: the grid's own range. Returns the grid's image."""
    g = np.asarray(grid, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"overlay needs a 2-D grid, got shape {g.shape}")
    image(ax, img, title, title_size)
    H, W = np.asarray(img).squeeze().shape[:2]
    finite = g[np.isfinite(g)]
    lo = (float(finite.min()) if finite.size else 0.0) if vmin is None else vmin
    hi = (float(finite.max()) if finite.size else 1.0) if vmax is None else vmax
    im = ax.imshow(g, cmap=cmap, vmin=lo, vmax=max(hi, lo + 1e-9), alpha=alpha,
                   extent=(-0.5, W - 0.5, H - 0.5, -0.5), interpolation="nearest")  # fmt: skip
    if colorbar:
        _colorbar(ax, im, fontsize)
    return im


def _ticks(set_ticks, set_labels, labels, fontsize, rotation: float = 0) -> None:
    if labels is None:
        set_ticks([])
        return
    set_ticks(range(len(labels)))
    ha = "right" if 0 < rotation < 90 else "center"
    set_labels([show_token(str(t)) for t in labels], fontsize=fontsize, rotation=rotation, ha=ha)


def save_png(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG atomically (never a half-written file) and close it."""
    import matplotlib.pyplot as plt

    from attnlab.files import atomic_write

    path = Path(path)
    try:
        if path.suffix.lower() != ".png":
            raise AttnlabError(f"{path}: figures are written as PNG; name the file *.png")
        if not path.parent.is_dir():
            raise AttnlabError(f"{path.parent}: no such directory")
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight"))
    finally:
        plt.close(fig)
    return path


def png_html(fig, dpi: int = 80) -> str:
    """``fig`` as an inline ``<img>`` (a notebook's rendering), then closed; its alt text is
    the figure's title."""
    import base64
    import html
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""  # matplotlib >= 3.8
    title = title or next((ax.get_title() for ax in fig.axes if ax.get_title()), "a figure")
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(title)}"/>'
