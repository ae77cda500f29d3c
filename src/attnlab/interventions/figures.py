"""Figures of intervention results: PNG written atomically, and the same figure inline in HTML."""

from __future__ import annotations

from pathlib import Path

from attnlab.interventions.subjects import InterventionError


def new_figure(*args, **kw):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)


def save_png(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (a .png in an existing directory) atomically, then close it."""
    from attnlab.errors import AttnlabError
    from attnlab.render.plots import save_png as write_png

    try:
        return write_png(fig, path)
    except AttnlabError as e:  # a path a figure cannot go to: said as the interventions say it
        raise InterventionError(str(e)) from None


def figure_html(fig, caption: str = "") -> str:
    """The figure as an inline <img> (what a notebook shows), then closed."""
    import html

    from attnlab.render.plots import png_html

    cap = f"<div><b>{html.escape(caption)}</b></div>" if caption else ""
    return f"<div>{cap}{png_html(fig)}</div>"


def heat(ax, m, rows: list[str], cols: list[str], title: str, *, xlabel: str, ylabel: str,
         colorbar_label: str, diverging: bool = True, fmt: str = "{:.2f}",
         vmax: float | None = None, annotate: bool = True, row_tokens: bool = False,
         col_tokens: bool = True):  # fmt: skip
    """A labelled heatmap on ``ax`` (render.plots.heatmap): diverging (red-blue, symmetric
    around 0) or sequential (0 to the largest value); values written in when it has at most
    160 cells and each fits its cell. Both axes and the colour bar say what they hold. Rows
    are names (a layer, a stream point) unless ``row_tokens``; columns tokens unless not
    ``col_tokens``."""
    import numpy as np

    from attnlab.render.plots import heatmap

    m = np.asarray(m, dtype=float)
    finite = m[np.isfinite(m)]
    top = vmax or (float(np.abs(finite).max()) if finite.size else 1.0) or 1.0
    colours = dict(cmap="RdBu_r", vmin=-top, vmax=top) if diverging else dict(vmin=0.0, vmax=top)
    return heatmap(ax, m, rows, cols, title=title, aspect="auto", fontsize=7, xlabel=xlabel,
                   ylabel=ylabel, colorbar_label=colorbar_label,
                   annotate=annotate and m.size <= 160 and values_fit(ax, m, fmt),
                   fmt=fmt, row_tokens=row_tokens, col_tokens=col_tokens, **colours)  # fmt: skip


def values_fit(ax, m, fmt: str, fontsize: float = 5) -> bool:
    """Would each value, written in its cell at ``fontsize``, fit the cell (width and
    height, where the axes stand now)?"""
    import numpy as np

    fig = ax.figure
    box = ax.get_position()
    R, C = np.shape(m)
    cell_w = box.width * fig.bbox.width / max(1, C)
    cell_h = box.height * fig.bbox.height / max(1, R)
    widest = max((len(fmt.format(v)) for v in np.ravel(m) if np.isfinite(v)), default=1)
    points = fontsize * fig.dpi / 72
    return 0.62 * points * widest <= 0.9 * cell_w and 1.3 * points <= cell_h


def token_ticks(ax, tokens: list[str], label: str = "token", fontsize: float = 7,
                max_labels: int = 64) -> None:  # fmt: skip
    """The x axis of a bar chart over tokens: each token under its bar (upright where each
    fits its bar, turned a quarter otherwise), positions past ``max_labels``; and its label."""
    from attnlab.render.display import show_token
    from attnlab.render.plots import upright_fits

    shown = [show_token(t) for t in tokens]
    if len(shown) <= max_labels:
        upright = upright_fits(ax, shown, fontsize, (1, len(shown)), "auto")
        ax.set_xticks(range(len(shown)), shown, fontsize=fontsize, rotation=0 if upright else 90)
        ax.set_xlabel(label, fontsize=8)
    else:
        ax.set_xlabel(f"{label} position", fontsize=8)
