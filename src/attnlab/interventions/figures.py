"""Figures of intervention results: PNG written atomically, and the same figure inline in HTML."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from attnlab.interventions.subjects import InterventionError


def new_figure(*args, **kw):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)


def save_png(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (a .png in an existing directory) atomically, then close it."""
    import matplotlib.pyplot as plt

    from attnlab.checkpoint import atomic_write

    path = Path(path)
    try:
        if path.suffix.lower() != ".png":
            raise InterventionError(f"{path}: figures are written as PNG; name the file *.png")
        if not path.parent.is_dir():
            raise InterventionError(f"{path.parent}: no such directory")
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)
    return path


def figure_html(fig, caption: str = "") -> str:
    """The figure as an inline <img> (what a notebook shows), then closed."""
    import html

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    cap = f"<div><b>{html.escape(caption)}</b></div>" if caption else ""
    return f'<div>{cap}<img src="data:image/png;base64,{data}"/></div>'


def heat(ax, m, rows: list[str], cols: list[str], title: str, diverging: bool = True,
         fmt: str = "{:.2f}", vmax: float | None = None, annotate: bool = True):  # fmt: skip
    """A labelled heatmap on ``ax``; diverging (red-blue around 0) or sequential."""
    import numpy as np

    m = np.asarray(m, dtype=float)
    finite = m[np.isfinite(m)]
    top = vmax or (float(np.abs(finite).max()) if finite.size else 1.0) or 1.0
    kw = (
        dict(cmap="RdBu_r", vmin=-top, vmax=top)
        if diverging
        else dict(cmap="viridis", vmin=0, vmax=top)
    )
    im = ax.imshow(m, aspect="auto", **kw)
    if len(cols) <= 64:
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    if len(rows) <= 64:
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
    if annotate and m.size <= 160:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                if np.isfinite(m[i, j]):
                    ax.text(j, i, fmt.format(m[i, j]), ha="center", va="center", fontsize=6,
                            color="white" if abs(m[i, j]) > 0.6 * top else "black")  # fmt: skip
    ax.set_title(title, fontsize=9)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return im
