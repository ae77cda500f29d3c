"""How results show themselves: terminal (rich), JSON (``to_dict``) and Jupyter (``_repr_html_``).

Every result object of ``attnlab.inspect`` derives from ``Result``: ``__rich__`` builds the
terminal rendering, ``str(result)`` is that rendering as plain text, ``to_dict()`` is the same
data for JSON, and ``_repr_html_`` is what a notebook shows.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
import sys

import numpy as np

from attnlab.render.tables import Matrix

TERMINAL_TOKENS = 32  # rows of each of trace's matrices (its columns page to the width)


VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "\\r"}


def show_token(t: str) -> str:
    """A token made visible: a space shows as ␣, a newline as ↵, a tab as ⇥, and any other
    character that prints nothing as its escape (a byte token's \\x10, a zero-width space's
    \\u200b): symbols the terminal and the plots' font both have."""
    if t == "":
        return "∅"
    return "".join(_visible(c) for c in t)


def _visible(c: str) -> str:
    if c in VISIBLE:
        return VISIBLE[c]
    if c.isprintable():
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def rounded(x, digits: int = 4):
    """Nested lists of floats rounded for JSON (inf and NaN become strings JSON can hold)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        v = float(a)
        return v if math.isfinite(v) else str(v)
    out = np.round(a, digits).tolist()
    bad = ~np.isfinite(a)
    for idx in zip(*np.nonzero(bad)) if bad.any() else ():  # only the few non-finite entries
        row = out
        for i in idx[:-1]:
            row = row[i]
        row[idx[-1]] = str(float(a[idx]))
    return out


def console(file=None, width: int | None = None, plain: bool = False):
    """A rich Console on ``file`` (stdout) as wide as the one width rule says
    (``attnlab.render.terminal``: ``COLUMNS``, else the terminal's width, else 80), or
    ``width``. Tables lay themselves out for it (``attnlab.render.tables``); prose is folded
    keeping its indent and no line keeps trailing spaces (``FittedStream``). ``plain``: no
    ANSI codes whatever the environment says (FORCE_COLOR included): what ``str(result)`` and
    a notebook's fallback use."""
    from rich.console import Console

    from attnlab.render.terminal import FittedStream, terminal_width

    file = file or sys.stdout
    width = width or getattr(file, "width", None) or terminal_width(file)
    if not isinstance(file, FittedStream) or file.width != width:
        file = FittedStream(file, width)
    extra = {"color_system": None, "force_terminal": False} if plain else {}
    return Console(
        file=file, width=width, highlight=False, soft_wrap=True, force_jupyter=False, **extra
    )


class Result:
    """Base of every inspection result. ``about`` (set by the tool from its Recording) says what
    the model is; the JSON starts with it."""

    about: dict | None = None

    def __rich__(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def to_dict(self) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError

    def to_json(self, indent: int | None = 2) -> str:
        d = self.to_dict()
        if self.about and "about" not in d:
            d = {"about": self.about, **d}
        return json.dumps(d, indent=indent, ensure_ascii=False)

    def __str__(self) -> str:
        """The terminal rendering as plain text, at the width ``print`` would show it with."""
        from attnlab.render.terminal import terminal_width

        buf = io.StringIO()
        console(buf, width=terminal_width(sys.stdout), plain=True).print(self.__rich__())
        return buf.getvalue().rstrip("\n")

    def _repr_html_(self) -> str:  # a plain fallback; most results draw heatmaps
        return f"<pre>{html.escape(str(self))}</pre>"


# ---------------------------------------------------------------------------------------------
# HTML for notebooks: escaped, spaces made visible, never ANSI codes
# ---------------------------------------------------------------------------------------------

CELL = "padding:1px 3px;font:11px monospace;text-align:right;min-width:2.6em"


def script_json(data) -> str:
    """``data`` as JSON to inline in an HTML page's ``<script>``: compact, its text as UTF-8,
    and ``</`` escaped so no string in it (a token, a title) can close the script."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


def token_html(t: str) -> str:
    """A token as HTML text: made visible (a space shows as ␣), then escaped."""
    return html.escape(show_token(str(t)))


NUMBER = re.compile(r"^[+\-−]?[\d.,]+(%|e[+\-]?\d+)?(\.\.[+\-−]?[\d.,]+%?)?$|^(n/a|-)$")


def table_html(header: list[str], rows: list[list], title: str = "", caption: str = "") -> str:
    """A plain HTML table; every header and cell is escaped text (str() of the value). Numbers
    (and ranges of them) are right-aligned, so their digits line up; words read from the left."""

    def td(c) -> str:
        align = "right" if NUMBER.match(str(c).strip()) else "left"
        return f'<td style="{CELL};text-align:{align}">{html.escape(str(c))}</td>'

    th = "".join(f'<th style="{CELL};text-align:left">{html.escape(str(h))}</th>' for h in header)
    body = "".join("<tr>" + "".join(td(c) for c in row) + "</tr>" for row in rows)
    cap = f"<div><b>{html.escape(title)}</b></div>" if title else ""
    note = f"<div><i>{html.escape(caption)}</i></div>" if caption else ""
    return (
        f'<div style="overflow:auto">{cap}<table style="border-collapse:collapse">'
        f"<tr>{th}</tr>{body}</table>{note}</div>"
    )


def tokens_html(tokens: list[str], label: str = "") -> str:
    """One table row of tokens under their positions (spaces visible, escaped)."""
    pos = "".join(f'<th style="{CELL};color:#888">{i}</th>' for i in range(len(tokens)))
    toks = "".join(f'<td style="{CELL};border:1px solid #ddd">{token_html(t)}</td>'
                   for t in tokens)  # fmt: skip
    name = f'<th style="{CELL}">{html.escape(label)}</th>'
    return (
        '<table style="border-collapse:collapse">'
        f"<tr><th></th>{pos}</tr><tr>{name}{toks}</tr></table>"
    )


# ---------------------------------------------------------------------------------------------
# Matrices
# ---------------------------------------------------------------------------------------------


def matrix_table(
    m,
    rows: list[str],
    cols: list[str],
    title: str = "",
    digits: int = 2,
    heat: bool = True,
    sign: bool = False,
    limit: int | None = None,
    start: int = 0,
    col_tokens: bool = True,
    more: str = "--json has every value",
    row_name: str = "rows",
    col_name: str = "columns",
    max_lines: int = 96,
):
    """Matrix ``m`` (R, C) labelled by rows and columns, laid out when printed for the width
    it is printed at (``attnlab.render.tables.Matrix``: whole labels, whole numbers, pages of
    columns from ``start``; the first ``limit`` rows, all if None). ``more`` is how the verb shows what does
    not fit (``{next}``: the first column left out); ``col_tokens=False`` prints the column
    labels as they are (not as tokens)."""
    rows = [show_token(str(r)) for r in rows]
    cols = [show_token(str(c)) if col_tokens else str(c) for c in cols]
    return Matrix(m, rows, cols, title, digits=digits, heat=heat, sign=sign, start=start,
                  max_rows=limit, max_lines=max_lines, more=more,
                  row_name=row_name, col_name=col_name)  # fmt: skip


def heatmap_html(
    m,
    rows: list[str],
    cols: list[str],
    title: str = "",
    digits: int = 2,
    limit: int = 64,
    diverging: bool = False,
    col_tokens: bool = True,
) -> str:
    """A labelled heatmap as an HTML table: a header row of column labels, then one row per
    row label, each cell its value coloured by its size (blue; red for negative values when
    ``diverging``). Labels are tokens made visible (a space shows as ␣) and escaped;
    ``col_tokens=False`` writes the column labels as they are (e.g. "layer 0")."""
    m = np.asarray(m, dtype=np.float64)
    r1, c1 = min(len(rows), limit), min(len(cols), limit)
    finite = m[np.isfinite(m)]
    top = float(np.abs(finite).max()) if finite.size else 1.0
    top = top or 1.0
    cell = CELL
    head = "".join(
        f'<th style="{cell};writing-mode:vertical-rl">'
        f"{token_html(c) if col_tokens else html.escape(str(c))}</th>"
        for c in cols[:c1]
    )
    body = []
    for i in range(r1):
        tds = []
        for j in range(c1):
            v = m[i, j]
            if not math.isfinite(v):
                tds.append(f'<td style="{cell};color:#bbb">-inf</td>')
                continue
            a = min(1.0, abs(v) / top)
            rgb = "214,39,40" if (diverging and v < 0) else "31,119,180"
            fg = "#fff" if a > 0.55 else "#000"
            tds.append(
                f'<td style="{cell};background:rgba({rgb},{a:.3f});color:{fg}" '
                f'title="{token_html(rows[i])} → {html.escape(show_token(str(cols[j])))}: {v:.4f}">'
                f"{v:.{digits}f}</td>"
            )
        body.append(f'<tr><th style="{cell}">{token_html(rows[i])}</th>{"".join(tds)}</tr>')
    note = ""
    if r1 < len(rows) or c1 < len(cols):
        note = f"<div><i>showing the first {r1} x {c1} of {len(rows)} x {len(cols)}</i></div>"
    cap = f"<div><b>{html.escape(title)}</b></div>" if title else ""
    return (
        f'<div style="overflow:auto">{cap}<table style="border-collapse:collapse">'
        f"<tr><th></th>{head}</tr>{''.join(body)}</table>{note}</div>"
    )


def preview(x, rows: int = 4, cols: int = 6, digits: int = 3) -> list:
    """The top-left corner of a tensor as nested lists (what trace prints as a numeric preview)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        return rounded(a, digits)
    if a.ndim == 1:
        return rounded(a[:cols], digits)
    return rounded(a[:rows, :cols], digits)


class Preview:
    """``preview_text`` of ``x`` indented by ``indent``, with as many of its first 6 columns as
    fit the width it is printed at (a row never wraps)."""

    def __init__(self, x, indent: int = 4):
        self.x, self.indent = x, indent

    def __rich_console__(self, console, options):
        from rich.text import Text

        cols = max(1, min(6, (options.max_width - self.indent - 6) // 9))
        pad = " " * self.indent
        lines = preview_text(self.x, cols=cols).splitlines()
        yield Text("\n".join(pad + line for line in lines))


def preview_text(x, rows: int = 4, cols: int = 6) -> str:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        return f"{float(a):.4g}"

    def fmt_row(r, n):
        cells = [
            f"{v:8.3f}" if math.isfinite(v) else f"{'-inf' if v < 0 else 'nan':>8}"
            for v in r[:cols]
        ]
        return "[" + " ".join(cells) + (" ..." if n > cols else "") + "]"

    if a.ndim == 1:
        return fmt_row(a, a.shape[0])
    lines = [fmt_row(a[i], a.shape[1]) for i in range(min(rows, a.shape[0]))]
    if a.shape[0] > rows:
        lines.append(f"... ({a.shape[0] - rows} more rows)")
    return "\n".join(lines)
