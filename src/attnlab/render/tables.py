"""Terminal tables laid out, when they are printed, for the width they are printed at.

Every table attnlab prints in a terminal is one of two renderables made here, and both take
their width from rich at print time (the terminal's; ``COLUMNS``; 100 columns when stdout is
not a terminal, see ``display.console``):

``FitTable``  rows of cells under headers (check's results, heads' scores, ...).
``Matrix``    a labelled matrix of numbers (attention weights, QK^T, cosine similarities, ...).

The rules, the same for both:

- Labels are whole. The label columns (a matrix's row tokens, a table's first column) are as
  wide as their widest entry and repeat on every page. Only a label wider than the whole
  terminal less one column folds onto a second line; no label is ever shortened.
- Cells are whole. A number is never wrapped or cut. A matrix is printed at its precision
  (two decimals unless told), or without the leading zero (``.42``, ``-.07``) where that puts
  more of its columns on a page. A column header longer than its numbers first widens its
  column, and folds over two lines only where that puts more columns on a page.
- Free text (a check's detail, a list of sources) wraps inside its column.
- Columns that do not fit side by side page: each page is a block of columns under the same
  row labels, printed one under the other (a matrix's pages each say which columns they hold:
  ``keys 15..19``). A matrix prints at most ``max_lines`` rows of
  pages (and ``max_rows`` rows) from column ``start``; if it stops before the end, one line
  says which rows and columns were shown and names the verb's option that shows the rest.

Nothing is ever cut to an ellipsis: every column is laid out no narrower than its content, and
where nothing else fits, text folds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

GAP = 2  # spaces between the columns of a table
MATRIX_GAP = 1  # between the columns of a matrix of numbers (right-aligned, so they read apart)
WRAP_MIN = 16  # a wrapping column may narrow to this (or its longest word, if shorter)


def _text(cell, style: str = ""):
    """A cell as rich Text; a string is taken literally (``[SEP]`` is a token, not markup)."""
    from rich.text import Text

    if isinstance(cell, Text):
        return cell
    return Text("" if cell is None else str(cell), style=style)


def _width(t) -> int:
    """Display width of the widest line of a Text (wide characters count two)."""
    from rich.cells import cell_len

    return max((cell_len(line) for line in t.plain.split("\n")), default=0)


def _longest_word(t) -> int:
    from rich.cells import cell_len

    return max((cell_len(w) for w in t.plain.split()), default=0)


@dataclass
class _Column:
    header: str
    justify: str = "left"
    style: str = ""
    wrap: bool = False  # free text: wraps inside the column; else whole on one line


def _pages(
    keep: list[int], data: list[int], mins: list[int], width: int, gap: int
) -> list[list[int]]:
    """Split the data columns (their widths ``data``; wrapping ones may narrow to ``mins``) into
    pages that fit ``width`` beside the ``keep`` columns. Every page has at least one column."""
    base = sum(keep) + gap * max(0, len(keep) - 1)
    pages: list[list[int]] = []
    cur: list[int] = []
    used = base
    for j, w in enumerate(mins):
        need = w + (gap if (cur or keep) else 0)
        if cur and used + need > width:
            pages.append(cur)
            cur, used = [], base
            need = w + (gap if keep else 0)
        cur.append(j)
        used += need
    if cur:
        pages.append(cur)
    return pages


def _grid(
    header: list,
    body: list[list],
    columns: list[_Column],
    keep: int,
    width: int,
    gap: int,
):
    """Widths and pages for one table: ``(widths, pages)``, pages as lists of data column
    indices (counted after the ``keep`` label columns)."""
    cols = list(zip(*([header] + body))) if body else [(h,) for h in header]
    natural, least = [], []
    for c, cells in zip(columns, cols):
        head, values = cells[0], cells[1:]
        cell_w = max((_width(v) for v in values), default=0)
        if c.wrap:
            n = max(cell_w, _width(head))
            word = max([_longest_word(v) for v in values] + [_longest_word(head)])
            natural.append(n)
            least.append(min(n, max(WRAP_MIN, min(word, 2 * WRAP_MIN))))
        else:
            n = max(cell_w, _width(head), 1)
            natural.append(n)
            least.append(n)
    k = natural[:keep]
    room = width - (sum(k) + gap * len(k))  # what the data columns have beside the labels
    if keep and room < max(least[keep:], default=1):  # labels wider than the terminal allows
        widest = max(least[keep:], default=1)
        cap = max(4, (width - gap * len(k) - widest) // max(1, len(k)))
        k = [min(w, cap) for w in k]
    mins = least[keep:]
    pages = _pages(k, natural[keep:], mins, width, gap)
    widths = k + list(natural[keep:])
    # a page's wrapping columns share what is left of its width, up to their natural width
    for page in pages:
        used = sum(k) + gap * (len(k) + len(page) - 1) + sum(mins[j] for j in page)
        spare = max(0, width - used)
        for j in page:
            widths[keep + j] = mins[j]
        for j in page:
            if columns[keep + j].wrap:
                extra = min(spare, natural[keep + j] - mins[j])
                widths[keep + j] += extra
                spare -= extra
        for j in page:  # a lone column wider than the terminal folds rather than spill
            limit = width - sum(k) - gap * len(k)
            widths[keep + j] = max(1, min(widths[keep + j], limit))
    return widths, pages


def _page_table(header, body, columns, widths, show: list[int], gap: int, show_header=True):
    from rich.table import Table

    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, gap, 0, 0),
              show_header=show_header, expand=False, title=None)  # fmt: skip
    for i in show:
        c = columns[i]
        t.add_column(_text(header[i]), justify=c.justify, style=c.style or None,
                     width=widths[i], no_wrap=False, overflow="fold")  # fmt: skip
    for row in body:
        t.add_row(*[row[i] for i in show])
    return t


class FitTable:
    """A table of cells that fits the width it is printed at (see the module's rules).

    Build it as a rich Table: ``add_column(header, justify=, style=, wrap=)`` then
    ``add_row(*cells)``; cells are strings (taken literally, never as markup) or rich Text.
    ``keep`` leading columns are the row labels and repeat on every page; ``wrap=True`` marks
    a column of free text that may wrap; every other cell stays whole on one line."""

    def __init__(self, title: str = "", caption: str = "", keep: int = 1):
        self.title, self.caption, self.keep = title, caption, keep
        self.columns: list[_Column] = []
        self.rows: list[list] = []

    def add_column(self, header: str, justify: str = "left", style: str = "",
                   wrap: bool = False) -> None:  # fmt: skip
        self.columns.append(_Column(header, justify, style, wrap))

    def add_row(self, *cells, style: str | None = None) -> None:
        cells = list(cells) + [""] * (len(self.columns) - len(cells))
        self.rows.append([_text(c, style or "") for c in cells])

    def __rich_console__(self, console, options):
        from rich.text import Text

        width = options.max_width
        header = [_text(c.header) for c in self.columns]
        keep = min(self.keep, len(self.columns) - 1) if len(self.columns) > 1 else 0
        widths, pages = _grid(header, self.rows, self.columns, keep, width, GAP)
        if self.title:
            yield Text(self.title, style="italic")
        for n, page in enumerate(pages):
            if n:
                yield Text("")
            show = list(range(keep)) + [keep + j for j in page]
            yield _page_table(header, self.rows, self.columns, widths, show, GAP)
        if self.caption:
            yield Text(self.caption, style="dim italic")


# ---------------------------------------------------------------------------------------------
# Matrices
# ---------------------------------------------------------------------------------------------


def number(v: float, digits: int, compact: bool = False, sign: bool = False) -> str:
    """``v`` at ``digits`` decimals (``sign``: with its + too); ``compact`` drops the leading
    zero (``.42``, ``-.07``). Infinities and NaN are written as Python writes them (``-inf``),
    so every cell parses as a number."""
    if not math.isfinite(v):
        return "-inf" if v < 0 else ("inf" if v > 0 else "nan")
    s = f"{v:.{digits}f}"
    if s.startswith("-") and float(s) == 0:
        s = s[1:]  # -0.00 reads as 0.00
    if sign and not s.startswith("-"):
        s = "+" + s
    if compact:
        for lead in ("", "-", "+"):
            if s.startswith(lead + "0."):
                s = lead + s[len(lead) + 1 :]
    return s


class Matrix:
    """A labelled matrix ``m`` (R, C) laid out for the width it is printed at.

    Rows are labelled by ``rows``, columns by ``cols``, as they are to be printed (tokens
    already made visible: ``display.matrix_table`` does that). The columns from ``start`` are printed in
    pages under the row labels (the first ``max_rows`` rows; all if None), at most
    ``max_lines`` rows of pages in all. If anything is left out, one line names it
    (``row_name``/``col_name``: "queries", "keys") and how to see it: ``more``, with ``{next}``
    replaced by the first column not shown, or where only rows are left out, ``--json``."""

    def __init__(
        self,
        m,
        rows: list[str],
        cols: list[str],
        title: str = "",
        digits: int = 2,
        heat: bool = True,
        start: int = 0,
        sign: bool = False,
        max_rows: int | None = None,
        max_lines: int = 96,
        more: str = "--json has every value",
        row_name: str = "rows",
        col_name: str = "columns",
    ):
        self.m = np.asarray(m, dtype=np.float64)
        self.rows, self.cols = [str(r) for r in rows], [str(c) for c in cols]
        self.title, self.digits, self.heat, self.sign = title, digits, heat, sign
        self.start, self.max_rows, self.max_lines = start, max_rows, max_lines
        self.more, self.row_name, self.col_name = more, row_name, col_name

    def windows(self) -> tuple[int, int, int]:
        """(first row, end row, first column) shown: the first ``max_rows`` rows, the columns
        from ``start``."""
        n_rows, n_cols = self.m.shape
        c0 = max(0, min(self.start, n_cols - 1))
        return 0, min(n_rows, self.max_rows or n_rows), c0

    def _cells(self, r0: int, r1: int, c0: int, compact: bool) -> list[list]:
        from rich.text import Text

        m = self.m
        finite = m[np.isfinite(m)]
        top = float(np.abs(finite).max()) if finite.size else 0.0
        body = []
        for i in range(r0, r1):
            cells = [Text(self.rows[i], style="bold")]
            for j in range(c0, m.shape[1]):
                v = float(m[i, j])
                style = "dim"
                if self.heat and math.isfinite(v) and top > 0:
                    level = abs(v) / top
                    style = "bold" if level > 0.66 else ("" if level > 0.2 else "dim")
                elif not self.heat and math.isfinite(v):
                    style = ""
                cells.append(Text(number(v, self.digits, compact, self.sign), style=style))
            body.append(cells)
        return body

    def __rich_console__(self, console, options):
        from rich.text import Text

        width = options.max_width
        n_rows, n_cols = self.m.shape
        r0, r1, c0 = self.windows()
        columns = [_Column("", "right", "bold")] + [_Column("", "right")] * (n_cols - c0)
        best = None
        for compact in (False, True):
            body = self._cells(r0, r1, c0, compact)
            value_w = max((_width(c) for row in body for c in row[1:]), default=1)
            for fold_headers in (False, True):
                header = [Text("")] + [Text(c) for c in self.cols[c0:]]
                # a folded header is as wide as the values under it
                heads = [Text("")] + [Text("x" * value_w) for _ in self.cols[c0:]]
                widths, pages = _grid(heads if fold_headers else header, body, columns, 1,
                                      width, MATRIX_GAP)  # fmt: skip
                if best is None or len(pages) < len(best[3]):
                    best = (body, header, widths, pages)
        body, header, widths, pages = best
        rows_shown = max(1, r1 - r0)
        n_pages = max(1, self.max_lines // rows_shown)
        shown = pages[:n_pages]
        if self.title:
            yield Text(self.title, style="italic")
        paged = len(pages) > 1 or c0 > 0
        for n, page in enumerate(shown):
            if n:
                yield Text("")
            if paged:  # which columns this page holds: tokens repeat, positions do not
                yield Text(f"{self.col_name} {c0 + page[0]}..{c0 + page[-1]}", style="dim")
            show = [0] + [1 + j for j in page]
            yield _page_table(header, body, columns, widths, show, MATRIX_GAP)
        last = c0 + shown[-1][-1] if shown and shown[-1] else c0
        if (c0, last, r0, r1) != (0, n_cols - 1, 0, n_rows):
            note = f"{self.col_name} {c0}..{last} of {n_cols}"
            if (r0, r1) != (0, n_rows):
                note += f", {self.row_name} {r0}..{r1 - 1} of {n_rows}"
            note += " shown"
            if last < n_cols - 1:
                note += "; " + self.more.format(next=last + 1)
            elif (r0, r1) != (0, n_rows):
                note += "; --json has every value"
            yield Text(note, style="dim italic")
