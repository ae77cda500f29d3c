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


def heat(ax, m, rows: list[str], cols: list[str], title: str, diverging: bool = True,
         fmt: str = "{:.2f}", vmax: float | None = None, annotate: bool = True):  # fmt: skip
    """A labelled heatmap on ``ax`` (render.plots.heatmap): diverging (red-blue, symmetric
    around 0) or sequential (0 to the largest value); values written in when it has at most
    160 cells."""
    import numpy as np

    from attnlab.render.plots import heatmap

    m = np.asarray(m, dtype=float)
    finite = m[np.isfinite(m)]
    top = vmax or (float(np.abs(finite).max()) if finite.size else 1.0) or 1.0
    colours = dict(cmap="RdBu_r", vmin=-top, vmax=top) if diverging else dict(vmin=0.0, vmax=top)
    return heatmap(ax, m, rows, cols, title=title, aspect="auto", fontsize=7, xlabel="",
                   ylabel="", annotate=annotate and m.size <= 160, fmt=fmt, **colours)  # fmt: skip
