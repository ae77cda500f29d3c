"""Is a picture readable? A check of a matplotlib figure's layout, from where matplotlib itself
draws each piece of text: what any test (ours, or one for a new picture) runs on a figure.

    problems(fig)            -> list[str], empty when the figure passes; one sentence each
    lay_out(fig, dpi)        -> the renderer, once every text is placed (no pixel painted)
    check_figures()          a context in which every figure saved (``Figure.savefig``) is
                             checked as it is written; its list holds (figure, problems)

The rules, each read from the drawn figure (text extents in pixels, at the dpi it is saved at):

- nothing is cut: every visible text lies inside the picture (a fixed-size figure's edge; a
  figure saved with ``bbox_inches="tight"`` grows to hold its text, so there only a text that
  is cut by its own axes counts);
- nothing collides: no two texts overlap (tick labels with each other or with an axis label,
  a title with a colour bar's ticks, cell values with each other), and no axis label, tick
  label or title runs into another axes;
- everything is named: every axis that has tick labels has a label (its own, the figure's
  ``supxlabel``/``supylabel``, or a neighbour's in the same row or column), every colour bar
  has a label, and an axes with lines of several colours has a legend;
- it is legible as it is shown: no text under MIN_POINTS points, no picture wider than
  MAX_WIDTH pixels, and no tick labels are turned that would fit upright with room to
  spare (a turned "I", "l" and "i" all look like dashes).
"""

from __future__ import annotations

import contextlib

import numpy as np

MIN_POINTS = 5.0  # the smallest text worth drawing (points)
MAX_WIDTH = 1600  # pixels: a wider picture is shown shrunk (a README, a notebook, a page)
SLACK = 1.0  # pixels two boxes may share before they count as overlapping


def problems(fig, tight: bool = True, dpi: float | None = None) -> list[str]:
    """Every readability problem of ``fig`` as it would be saved (``tight``: with
    ``bbox_inches="tight"``, as ``attnlab.render.plots.save_png`` saves), at ``dpi`` (the
    figure's own if None). Empty when it passes."""
    renderer = lay_out(fig, dpi)
    out: list[str] = []
    texts = _texts(fig, renderer)
    region = fig.get_tightbbox(renderer) if tight else None
    width = (region.width * fig.dpi + 0.2 * fig.dpi) if tight else fig.bbox.width
    if width > MAX_WIDTH:
        out.append(f"the picture is {width:.0f} pixels wide (more than {MAX_WIDTH}): it is shown "
                   "shrunk and its text with it")  # fmt: skip
    out += _small(texts)
    out += _cut(fig, texts, tight)
    out += _overlaps(texts)
    out += _into_other_axes(fig, texts, renderer)
    out += _unlabelled(fig, renderer)
    out += _turned(fig, renderer)
    out += _legends(fig)
    return list(dict.fromkeys(out))


def lay_out(fig, dpi: float | None = None):
    """Place and measure every piece of ``fig`` as drawing it at ``dpi`` (its own if None)
    would, without painting a pixel (layout is about half of a draw's time; painting the
    rest); returns the renderer its sizes are measured with. A figure laid out before and not
    changed since (matplotlib marks any change ``stale``) is not laid out again."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if dpi is not None and dpi != fig.dpi:
        fig.set_dpi(dpi)
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
        fig.stale = True
    if fig.stale:
        fig.draw_without_rendering()
    return fig.canvas.get_renderer()


@contextlib.contextmanager
def check_figures(tight_only: bool = False):
    """Inside the block, every ``Figure.savefig`` first checks the figure (``problems``, with
    ``tight`` as the call's ``bbox_inches`` says). Yields the list of ``(label, problems)``,
    one per figure saved; ``label`` is its title or file name."""
    from matplotlib.figure import Figure

    seen: list[tuple[str, list[str]]] = []
    real = Figure.savefig

    def savefig(self, fname, *args, **kw):
        box = kw.get("bbox_inches")  # "tight", or the box it gives (render.plots.tight_box)
        tight = box == "tight" if isinstance(box, str) else box is not None
        found = problems(self, tight=tight, dpi=kw.get("dpi"))
        seen.append((_label(self, fname), found))
        return real(self, fname, *args, **kw)

    Figure.savefig = savefig
    try:
        yield seen
    finally:
        Figure.savefig = real


def _label(fig, fname) -> str:
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    title = title or next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
    name = fname if isinstance(fname, str) else getattr(fname, "name", "")
    return " ".join(x for x in (str(name).rsplit("/", 1)[-1], repr(title) if title else "") if x)


# ---------------------------------------------------------------------------------------------
# the texts of a figure
# ---------------------------------------------------------------------------------------------


class _Text:
    """A drawn text: the artist, its box (pixels), where it belongs and what it is."""

    def __init__(self, artist, box, ax, role: str):
        self.artist, self.box, self.ax, self.role = artist, box, ax, role

    @property
    def words(self) -> str:
        return repr(self.artist.get_text().replace("\n", " "))

    def where(self) -> str:
        t = _axes_name(self.ax) if self.ax is not None else "the figure"
        return f"{self.role} {self.words} ({t})"


def _axes_name(ax) -> str:
    if getattr(ax, "_colorbar", None) is not None:
        return "a colour bar"
    title = ax.get_title() or ax.get_title(loc="left")
    return f"axes {title!r}" if title else "an axes"


def _all_axes(fig) -> list:
    """Every axes drawn, insets (a colour bar beside its heatmap) included."""
    out = []

    def walk(ax):
        if ax not in out:
            out.append(ax)
            for child in ax.child_axes:
                walk(child)

    for ax in fig.axes:
        walk(ax)
    return out


def _visible(artist) -> bool:
    a = artist
    while a is not None:
        if not a.get_visible():
            return False
        a = getattr(a, "axes", None) if a is not getattr(a, "axes", None) else None
    return bool(artist.get_text().strip())


def _texts(fig, renderer) -> list[_Text]:
    out: list[_Text] = []

    def add(artist, ax, role):
        if artist is None or not _visible(artist):
            return
        box = artist.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            out.append(_Text(artist, box, ax, role))

    for t in fig.texts:  # suptitle, supxlabel, fig.text
        add(t, None, "figure text")
    for legend in fig.legends:
        for t in legend.get_texts():
            add(t, None, "legend entry")
    for ax in _all_axes(fig):
        if not ax.get_visible():
            continue
        for loc in ("center", "left", "right"):
            t = ax._left_title if loc == "left" else ax._right_title if loc == "right" else ax.title
            add(t, ax, "title")
        if ax.axison:
            for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
                add(axis.label, ax, f"{name} label")
                for tick in _ticks_shown(ax, axis):
                    add(tick.label1, ax, f"{name} tick label")
                    add(tick.label2, ax, f"{name} tick label")
        for t in ax.texts:
            add(t, ax, "text")
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            for t in legend.get_texts():
                add(t, ax, "legend entry")
    return out


def _ticks_shown(ax, axis):
    lo, hi = sorted(axis.get_view_interval())
    for tick in axis.get_major_ticks():
        loc = tick.get_loc()
        if loc is not None and lo - 1e-9 * (1 + abs(lo)) <= loc <= hi + 1e-9 * (1 + abs(hi)):
            yield tick


# ---------------------------------------------------------------------------------------------
# the rules
# ---------------------------------------------------------------------------------------------


def _small(texts: list[_Text]) -> list[str]:
    return [f"{t.where()} is {t.artist.get_fontsize():g} points (under {MIN_POINTS:g})"
            for t in texts if t.artist.get_fontsize() < MIN_POINTS]  # fmt: skip


def _cut(fig, texts: list[_Text], tight: bool) -> list[str]:
    out = []
    edge = fig.bbox
    for t in texts:
        b = t.box
        if not tight and not _inside(b, edge):
            out.append(f"{t.where()} is cut by the edge of the picture")
        clip = t.artist.get_clip_box() if t.artist.get_clip_on() else None
        if clip is not None and t.role == "text" and not _inside(b, clip):
            out.append(f"{t.where()} is cut by its axes")
    return out


def _inside(box, edge) -> bool:
    return (box.x0 >= edge.x0 - SLACK and box.y0 >= edge.y0 - SLACK
            and box.x1 <= edge.x1 + SLACK and box.y1 <= edge.y1 + SLACK)  # fmt: skip


def _overlaps(texts: list[_Text]) -> list[str]:
    if len(texts) < 2:
        return []
    b = np.array([[t.box.x0, t.box.y0, t.box.x1, t.box.y1] for t in texts])
    x = np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0])
    y = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
    hit = (x > SLACK) & (y > SLACK)
    out = []
    for i, j in zip(*np.nonzero(np.triu(hit, 1))):
        out.append(f"{texts[i].where()} overlaps {texts[j].where()}")
    return out


def _families(fig) -> dict:
    """axes -> the axes drawn as one with it: its insets (a colour bar beside a heatmap) and
    the axes it is an inset of."""
    fam = {ax: {ax} for ax in _all_axes(fig)}
    for ax in list(fam):
        for child in ax.child_axes:
            fam[ax].add(child)
            fam.setdefault(child, {child}).add(ax)
    return fam


def _into_other_axes(fig, texts: list[_Text], renderer) -> list[str]:
    out = []
    family = _families(fig)
    boxes = [(ax, ax.get_window_extent(renderer)) for ax in _all_axes(fig) if ax.get_visible()
             and ax.axison]  # fmt: skip
    for t in texts:
        if t.ax is None or t.role in ("text", "legend entry"):
            continue
        mine = family.get(t.ax, {t.ax})
        for ax, box in boxes:
            if ax in mine and ax is not t.ax:
                continue
            if ax is t.ax:  # its own axes: a label sits outside the area it labels
                box = _shrunk(box, 2.0)
            if (min(t.box.x1, box.x1) - max(t.box.x0, box.x0) > SLACK
                    and min(t.box.y1, box.y1) - max(t.box.y0, box.y0) > SLACK):  # fmt: skip
                what = "is drawn over its own axes" if ax is t.ax else f"runs into {_axes_name(ax)}"
                out.append(f"{t.where()} {what}")
    return out


def _shrunk(box, by: float):
    from matplotlib.transforms import Bbox

    return Bbox.from_extents(box.x0 + by, box.y0 + by, box.x1 - by, box.y1 - by)


def _has_data(ax) -> bool:
    return bool(ax.images or ax.lines or ax.collections or ax.patches or ax.containers)


def _shows_tick_labels(ax, axis) -> bool:
    return any(t.label1.get_visible() and t.label1.get_text().strip()
               for t in _ticks_shown(ax, axis))  # fmt: skip


def _unlabelled(fig, renderer) -> list[str]:
    out = []
    sup_x = getattr(fig, "_supxlabel", None)
    sup_y = getattr(fig, "_supylabel", None)
    axes = [ax for ax in _all_axes(fig) if ax.get_visible() and ax.axison]
    for ax in axes:
        bar = getattr(ax, "_colorbar", None)
        if bar is not None:
            long_axis = ax.yaxis if bar.orientation == "vertical" else ax.xaxis
            if not long_axis.label.get_text().strip():
                out.append("a colour bar has no label (say what its colours measure)")
            continue
        if not _has_data(ax):
            continue
        box = ax.get_window_extent(renderer)
        for axis, name, sup in ((ax.xaxis, "x", sup_x), (ax.yaxis, "y", sup_y)):
            if not _shows_tick_labels(ax, axis) or axis.label.get_text().strip():
                continue
            if sup is not None and sup.get_text().strip():
                continue
            if _neighbour_labelled(ax, box, axes, name, renderer):
                continue
            out.append(f"the {name} axis of {_axes_name(ax)} has tick labels but no label")
    return out


def _grid_place(ax) -> tuple | None:
    """(grid, rows, columns) an axes spans in its subplot grid, or None (an inset, an axes
    placed by hand)."""
    spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
    if spec is None:
        return None
    return spec.get_gridspec(), spec.rowspan, spec.colspan


def _neighbour_labelled(ax, box, axes, name: str, renderer) -> bool:
    """An axes in the same column (x) or row (y) of its grid, or drawn over the same span,
    labels what this one's ticks mean."""
    mine = _grid_place(ax)
    for other in axes:
        if other is ax or getattr(other, "_colorbar", None) is not None:
            continue
        label = (other.xaxis if name == "x" else other.yaxis).label.get_text().strip()
        if not label:
            continue
        theirs = _grid_place(other)
        if mine is not None and theirs is not None and mine[0] is theirs[0]:
            if (mine[2] if name == "x" else mine[1]) == (theirs[2] if name == "x" else theirs[1]):
                return True
            continue
        ob = other.get_window_extent(renderer)
        if name == "x" and min(box.x1, ob.x1) - max(box.x0, ob.x0) > 0.5 * box.width:
            return True
        if name == "y" and min(box.y1, ob.y1) - max(box.y0, ob.y0) > 0.5 * box.height:
            return True
    return False


def _turned(fig, renderer) -> list[str]:
    """x tick labels turned although, upright, each fits well inside the room between two
    ticks (at most 60% of it)."""
    from matplotlib.text import Text

    out = []
    for ax in _all_axes(fig):
        if not ax.get_visible() or not ax.axison:
            continue
        ticks = [t for t in _ticks_shown(ax, ax.xaxis)
                 if t.label1.get_visible() and t.label1.get_text().strip()]  # fmt: skip
        turned = [t for t in ticks if abs(t.label1.get_rotation() % 180) > 1]
        if len(turned) < 2:
            continue
        xs = sorted(ax.transData.transform([(t.get_loc(), 0) for t in ticks])[:, 0])
        room = float(np.min(np.diff(xs))) if len(xs) > 1 else float("inf")
        widest = 0.0
        for t in turned:
            probe = Text(0, 0, t.label1.get_text(), fontproperties=t.label1.get_fontproperties())
            probe.set_figure(fig)
            widest = max(widest, probe.get_window_extent(renderer).width)
        if widest <= 0.6 * room:  # clearly fits: a label near its room's width may be turned
            out.append(f"the x tick labels of {_axes_name(ax)} are turned, though upright each "
                       f"fits ({widest:.0f} of {room:.0f} pixels)")  # fmt: skip
    return out


def _legends(fig) -> list[str]:
    out = []
    for ax in _all_axes(fig):
        if not ax.get_visible() or getattr(ax, "_colorbar", None) is not None:
            continue
        colours = {(_rgb(line.get_color()), line.get_linestyle()) for line in ax.lines
                   if line.get_visible()}  # fmt: skip
        if len(colours) > 1 and ax.get_legend() is None and not fig.legends:
            out.append(f"{_axes_name(ax)} draws lines of {len(colours)} colours or styles but "
                       "has no legend")  # fmt: skip
    return out


def _rgb(colour) -> tuple:
    from matplotlib.colors import to_rgb

    return tuple(round(c, 3) for c in to_rgb(colour))
