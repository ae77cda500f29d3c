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
MASKED = "#c8c8c8"  # a cell the mask hides (a query may not attend to that key): no colour of
# the scales (viridis, Blues, RdBu) is this grey, so it never reads as a weight of 0


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
    xtick_rotation: float | None = None,
    aspect: str = "equal",
    max_labels: int = MAX_LABELS,
    masked=None,
    row_tokens: bool = True,
    col_tokens: bool = True,
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
      axes; pass "" for none. Every picture names both axes and its colour bar (a test
      checks every figure attnlab writes: ``attnlab.render.layout``).
    - ``xtick_rotation``: None turns the column labels upright when each fits its column
      (single characters always do), a quarter turn when not.
    - ``row_tokens``/``col_tokens`` False: those labels are names ("layer 0", "head 1"),
      written as they are, not tokens made visible (a space as ␣).
    - ``masked`` (R, C) bool: cells the mask hides, drawn grey (no colour of the scale) and
      said so on the colour bar, never as the colour of a weight of 0.
    """
    import matplotlib

    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    hidden = None if masked is None else np.asarray(masked, dtype=bool)
    if hidden is not None and not hidden.any():
        hidden = None
    finite = m[np.isfinite(m) & (True if hidden is None else ~hidden)]
    if vmax is None:
        vmax = max(1e-9, float(finite.max())) if finite.size else 1.0
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    shown, colours = m, cmap
    if hidden is not None:
        shown = np.ma.masked_array(m, mask=hidden | ~np.isfinite(m))
        base = matplotlib.colormaps[cmap] if isinstance(cmap, str) else cmap
        colours = base.with_extremes(bad=MASKED)
    im = ax.imshow(shown, cmap=colours, vmin=vmin, vmax=vmax, aspect=aspect,
                   interpolation="nearest")  # fmt: skip
    too_many = max(len(rows or ()), len(cols or ())) > max_labels
    if too_many:
        xlabel = "key position" if xlabel is None else xlabel
        ylabel = "query position" if ylabel is None else ylabel
    else:
        if xtick_rotation is None and cols is not None:
            shown = [show_token(str(c)) if col_tokens else str(c) for c in cols]
            xtick_rotation = 0 if upright_fits(ax, shown, fontsize, m.shape, aspect) else 90
        _ticks(ax.set_xticks, ax.set_xticklabels, cols, fontsize, rotation=xtick_rotation or 0,
               tokens=col_tokens)  # fmt: skip
        _ticks(ax.set_yticks, ax.set_yticklabels, rows, fontsize, rotation=None,
               tokens=row_tokens)  # fmt: skip
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
            if np.isfinite(v) and (hidden is None or not hidden[i, j]):
                ax.text(j, i, fmt.format(v), ha="center", va="center",
                        fontsize=max(fontsize - 2, 5), color=text_colour(im, v))  # fmt: skip
    if colorbar:
        label = colorbar_label
        if hidden is not None:  # the bar says what the grey cells are
            label = f"{label or 'value'}  (grey: masked, may not attend)"
        _colorbar(ax, im, fontsize, label)
    return im


def upright_fits(ax, labels, fontsize: float, shape: tuple[int, int], aspect: str) -> bool:
    """Does each column label fit its column written upright? Measured with the figure's
    renderer against the width a column has where the axes stand now (with a margin for the
    layout still to come); single characters always fit."""
    from matplotlib.text import Text

    shown = [show_token(str(t)) for t in labels]
    if max((len(t) for t in shown), default=0) <= 1:
        return True
    fig = ax.figure
    get_renderer = getattr(fig.canvas, "get_renderer", None)
    if get_renderer is None:
        return max(len(t) for t in shown) <= 2
    renderer = get_renderer()
    widest = 0.0
    for t in shown:
        probe = Text(0, 0, t, fontsize=fontsize)
        probe.set_figure(fig)
        widest = max(widest, probe.get_window_extent(renderer).width)
    box = ax.get_position()
    R, C = shape
    width_px, height_px = box.width * fig.bbox.width, box.height * fig.bbox.height
    column = width_px / max(1, C)
    if aspect == "equal":
        column = min(column, height_px / max(1, R))
    return widest <= 0.75 * column


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
    fig.draw_without_rendering()  # applies each axes' aspect: positions as they are drawn
    boxes = [ax.get_position(original=False) for ax in axes]
    x1 = max(b.x1 for b in boxes)
    y0, y1 = min(b.y0 for b in boxes), max(b.y1 for b in boxes)
    cax = fig.add_axes((x1 + 0.012, y0, 0.012, y1 - y0))
    bar = fig.colorbar(im, cax=cax)
    bar.ax.tick_params(labelsize=fontsize)
    if label:
        bar.set_label(label, fontsize=fontsize)
    return bar


def tiles(
    ax,
    grid: list[list[np.ndarray | None]],
    vmax: float,
    masked: list[np.ndarray | None] | None = None,
    cmap: str = "viridis",
):
    """Many matrices in one image: ``grid[r][c]`` (T, S), or None for an empty tile, drawn in
    row r, column c of ``ax``, one colour range (0 to ``vmax``) for all, a white gap between
    tiles; ``masked[r]`` (T, S) True: cells every matrix of row r hides, grey. One image
    instead of an axes a matrix (a 24-layer, 14-head model's 336 axes took 10 s to draw; this
    takes a fraction of one). Returns (ScalarMappable for a colour bar, tile row centres, tile
    column centres) in data coordinates."""
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize, to_rgba

    rows, cols = len(grid), max(len(r) for r in grid)
    t = max(m.shape[0] for r in grid for m in r if m is not None)
    s = max(m.shape[1] for r in grid for m in r if m is not None)
    gap = max(1, round(max(t, s) / 10))  # cells of white between two tiles
    img = np.ones((rows * (t + gap) - gap, cols * (s + gap) - gap, 4))  # RGBA, white
    norm = Normalize(0.0, vmax)
    colours = matplotlib.colormaps[cmap]
    grey = np.array(to_rgba(MASKED))
    for r, row in enumerate(grid):
        hidden = masked[r] if masked is not None else None
        for c, m in enumerate(row):
            if m is None:
                continue
            y, x = r * (t + gap), c * (s + gap)
            cells = colours(norm(np.nan_to_num(m)))  # (T, S, 4)
            if hidden is not None and hidden.shape == m.shape:
                cells[hidden] = grey
            img[y : y + m.shape[0], x : x + m.shape[1]] = cells
    ax.imshow(img, interpolation="nearest", aspect="equal")
    for side in ax.spines.values():
        side.set_visible(False)
    centres_r = [r * (t + gap) + (t - 1) / 2 for r in range(rows)]
    centres_c = [c * (s + gap) + (s - 1) / 2 for c in range(cols)]
    return ScalarMappable(norm=norm, cmap=colours), centres_r, centres_c


def matrix(ax, m, cmap: str = "viridis", vmin=None, vmax=None, origin=None, aspect=None):
    """A plain colour map of ``m`` (rows x columns) on ``ax``, its ticks left to the caller
    (an experiment's map over (a, b), or over layers x heads); the image, for a colour bar."""
    return ax.imshow(np.asarray(m), cmap=cmap, vmin=vmin, vmax=vmax, origin=origin, aspect=aspect)


def side_colorbar(fig, axes, im, label: str, fraction: float = 0.03, pad: float = 0.02):
    """One labelled colour bar beside ``axes`` (a row of maps on one colour range)."""
    bar = fig.colorbar(im, ax=list(axes), fraction=fraction, pad=pad)
    bar.set_label(label)
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
    cmap: str = "Reds",
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar: bool = True,
    colorbar_label: str | None = None,
    fontsize: float = 8,
    title_size: float = 9,
):
    """``grid`` (g, g), one value per image patch (row by row, as a ViT numbers them), laid
    over ``img`` (H, W) in grey: patch (r, c) covers rows r*H/g .. (r+1)*H/g and the same for
    columns. Each patch is tinted by its value, more opaque the larger it is (at most 60%),
    so the image shows through everywhere and a patch that scores nothing is left as it is.
    A diverging ``cmap`` (RdBu_r) tints by the size of the value either way. ``vmin``/``vmax``
    None: the grid's own range. Returns the mappable the colour bar reads."""
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    g = np.asarray(grid, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"overlay needs a 2-D grid, got shape {g.shape}")
    image(ax, img, title, title_size)
    H, W = np.asarray(img).squeeze().shape[:2]
    finite = g[np.isfinite(g)]
    lo = (float(finite.min()) if finite.size else 0.0) if vmin is None else vmin
    hi = (float(finite.max()) if finite.size else 1.0) if vmax is None else vmax
    norm = Normalize(lo, max(hi, lo + 1e-9))
    colours = matplotlib.colormaps[cmap]
    level = np.clip(norm(np.nan_to_num(g, nan=lo)), 0.0, 1.0)  # (g, g) in 0..1
    strength = np.abs(2 * level - 1) if lo < 0 < hi else level  # diverging: away from 0
    rgba = colours(level)  # (g, g, 4)
    rgba[..., 3] = 0.6 * strength
    ax.imshow(rgba, extent=(-0.5, W - 0.5, H - 0.5, -0.5), interpolation="nearest")
    mappable = ScalarMappable(norm=norm, cmap=colours)
    if colorbar:
        _colorbar(ax, mappable, fontsize, colorbar_label)
    return mappable


def _ticks(set_ticks, set_labels, labels, fontsize, rotation: float | None = None,
           tokens: bool = True) -> None:  # fmt: skip
    """Tick labels for one axis; ``rotation`` None is the y axis (labels end at the axis);
    ``tokens``: made visible (a space as ␣), else written as they are."""
    if labels is None:
        set_ticks([])
        return
    set_ticks(range(len(labels)))
    shown = [show_token(str(t)) if tokens else str(t) for t in labels]
    if rotation is None:
        set_labels(shown, fontsize=fontsize)
        return
    ha = "right" if 0 < rotation < 90 else "center"
    set_labels(shown, fontsize=fontsize, rotation=rotation, ha=ha)


MIN_TICK_POINTS = 5.0  # tick labels are not made smaller than this (render.layout's floor)


def fit_tick_labels(fig, dpi: float | None = None) -> None:
    """Tick labels that would run into their neighbours are made to fit, on every axis of
    ``fig`` whose labels were set by hand (tokens, names; an automatic axis spaces its own):
    smaller, down to MIN_TICK_POINTS, where that is enough; else every k-th label is kept
    (at its own tick), k the fewest that leaves a gap. Measured as the figure is drawn at
    ``dpi`` (its own if None), along the axis: a label's height on a y axis, its width (or
    height, turned) on an x axis, against the distance between two ticks."""
    import math

    from matplotlib.ticker import FixedLocator

    from attnlab.render.layout import lay_out

    axes: list = []

    def walk(ax):
        if ax not in axes:
            axes.append(ax)
            for child in ax.child_axes:
                walk(child)

    for ax in fig.axes:
        walk(ax)
    for _ in range(3):  # a smaller label can move the layout: measure again
        renderer = lay_out(fig, dpi)
        changed = False
        for ax in axes:
            if not ax.get_visible() or not ax.axison:
                continue
            for axis, along in ((ax.xaxis, 0), (ax.yaxis, 1)):
                if not isinstance(axis.get_major_locator(), FixedLocator):
                    continue
                changed |= _fit_axis(ax, axis, along, renderer, math)
        if not changed:
            return
        fig.stale = True  # a tick label's size or visibility does not mark it (matplotlib)


def _fit_axis(ax, axis, along: int, renderer, math) -> bool:
    """One axis of ``fit_tick_labels``; True when it changed a label."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = [t for t in axis.get_major_ticks()
             if t.get_loc() is not None and lo <= t.get_loc() <= hi
             and t.label1.get_visible() and t.label1.get_text().strip()]  # fmt: skip
    if len(ticks) < 2:
        return False
    boxes = [t.label1.get_window_extent(renderer) for t in ticks]
    centres = sorted((b.x0 + b.x1) / 2 if along == 0 else (b.y0 + b.y1) / 2 for b in boxes)
    pitch = min(b - a for a, b in zip(centres, centres[1:]))
    need = max(b.width if along == 0 else b.height for b in boxes)
    room = pitch - 2.0  # a pixel each side: render.layout counts an overlap past one
    if need <= room or pitch <= 0:
        return False
    size = ticks[0].label1.get_fontsize()
    smaller = size * room / need
    if smaller >= MIN_TICK_POINTS:
        for t in ticks:
            t.label1.set_fontsize(smaller)
        return True
    for t in ticks:
        t.label1.set_fontsize(MIN_TICK_POINTS)
    need_min = need * MIN_TICK_POINTS / size
    k = math.ceil((need_min + 2.0) / pitch)
    for i, t in enumerate(sorted(ticks, key=lambda t: t.get_loc())):
        if i % k:
            t.label1.set_visible(False)
    return True


def save_png(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG atomically (never a half-written file) and close it; tick labels
    that would overlap are fitted first (``fit_tick_labels``)."""
    import matplotlib.pyplot as plt

    from attnlab.files import atomic_write

    path = Path(path)
    try:
        if path.suffix.lower() != ".png":
            raise AttnlabError(f"{path}: figures are written as PNG; name the file *.png")
        if not path.parent.is_dir():
            raise AttnlabError(f"{path.parent}: no such directory")
        fit_tick_labels(fig, dpi)
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi,
                                                   bbox_inches=tight_box(fig, dpi)))  # fmt: skip
    finally:
        plt.close(fig)
    return path


def tight_box(fig, dpi: float):
    """What ``savefig(bbox_inches="tight")`` would crop ``fig`` to at ``dpi`` (inches, padded
    by ``savefig.pad_inches``), read from the layout ``fit_tick_labels`` has just measured, so
    that saving draws the figure once more instead of twice.

    matplotlib lays a figure out again before saving when it is asked for "tight", and also
    when the figure keeps a layout engine: ``Figure.tight_layout`` leaves a placeholder one
    that lays nothing out. That placeholder is dropped here (the layout it stands for is
    done); a real engine (constrained layout) is kept, and matplotlib runs it as before."""
    import matplotlib as mpl

    from attnlab.render.layout import lay_out

    renderer = lay_out(fig, dpi)
    engine = fig.get_layout_engine()
    if type(engine).__name__ == "PlaceHolderLayoutEngine" and hasattr(fig, "_layout_engine"):
        fig._layout_engine = None
    stale = fig.stale
    box = fig.get_tightbbox(renderer)
    fig.stale = stale  # it places the titles where the layout already had them, and says so
    return box.padded(mpl.rcParams["savefig.pad_inches"])


def png_html(fig, dpi: int = 80) -> str:
    """``fig`` as an inline ``<img>`` (a notebook's rendering), then closed; its alt text is
    the figure's title."""
    import base64
    import html
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fit_tick_labels(fig, dpi)
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches=tight_box(fig, dpi))
    finally:
        plt.close(fig)
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""  # matplotlib >= 3.8
    title = title or next((ax.get_title() for ax in fig.axes if ax.get_title()), "a figure")
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(title)}"/>'
