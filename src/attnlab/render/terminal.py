"""The one width rule for everything attnlab prints, and the stream that keeps it.

    terminal_width(stream)   COLUMNS where set; else the terminal's width; 80 into a pipe
    FittedStream(raw, width) text written to it reaches ``raw`` folded to ``width`` columns,
                             each folded line keeping its indent (plus two, so a continued line
                             reads as one), and with no trailing spaces
    fitted_stdout()          sys.stdout as a FittedStream for the duration (the CLI and the demo)

Tables lay themselves out for the width (``attnlab.render.tables``), so they pass through
unchanged; prose (a note, a sentence naming a file) is folded here rather than by rich, which
would restart a folded line at column 0. Terminal colour codes take no columns and are kept.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

PIPE_WIDTH = 80  # the width of output that goes to a pipe or a file
MIN_WIDTH = 20  # a narrower COLUMNS or terminal is taken as this
HANG = 2  # a folded line's extra indent

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def terminal_width(stream=None) -> int:
    """The columns output to ``stream`` (sys.stdout) may use: ``COLUMNS`` when it is set to a
    number; else the terminal's width when ``stream`` is one; else 80 (a pipe, a file)."""
    stream = sys.stdout if stream is None else stream
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    raw = getattr(stream, "raw_stream", stream)
    try:
        if raw.isatty():
            return max(MIN_WIDTH, os.get_terminal_size(raw.fileno()).columns)
    except (AttributeError, OSError, ValueError):
        pass
    return PIPE_WIDTH


def _units(text: str) -> list[tuple[str, int]]:
    """``text`` as (piece, columns): each character with its width, each colour code as 0."""
    from rich.cells import cell_len

    out: list[tuple[str, int]] = []
    at = 0
    for m in _ESCAPE.finditer(text):
        out += [(c, cell_len(c)) for c in text[at : m.start()]]
        out.append((m.group(), 0))
        at = m.end()
    out += [(c, cell_len(c)) for c in text[at:]]
    return out


def _rstrip(units: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Trailing spaces dropped; colour codes among them kept (they reset a style)."""
    end, codes = len(units), []
    while end and (units[end - 1][0] in (" ", "\t") or units[end - 1][1] == 0):
        if units[end - 1][1] == 0 and units[end - 1][0] not in (" ", "\t"):
            codes.append(units[end - 1])
        end -= 1
    return units[:end] + codes[::-1]


def _text(units: list[tuple[str, int]]) -> str:
    return "".join(u for u, _ in units)


def fold(line: str, width: int, start: int = 0, indent: int | None = None) -> list[str]:
    """``line`` (no newline) as lines of at most ``width`` columns: broken at the last space
    that fits (mid-word only where a word is wider than a line), each continuation indented
    as the line is plus HANG, no trailing spaces. ``start``: the columns already written on
    this output line, whose indent was ``indent``; the first piece goes beside them."""
    units = _rstrip(_units(line))
    if indent is None:
        indent = _indent(units)
    hang = indent + HANG if indent + HANG <= width // 2 else min(indent, width // 2)
    out: list[str] = []
    room, lead = width - start, start == 0  # lead: the line's own indent is no place to break
    while sum(w for _, w in units) > room:
        used, i = 0, 0
        if lead:  # the indent is not a place to break
            while i < len(units) and (units[i][0] == " " or units[i][1] == 0):
                used += units[i][1]
                i += 1
        cut, fits = None, i
        for j in range(i, len(units)):
            u, w = units[j]
            if used + w > room:
                break
            used, fits = used + w, j + 1
            if u == " ":
                cut = j
        if fits < len(units) and units[fits][0] == " ":
            cut = fits  # the first piece ends exactly at the edge
        if cut is not None and cut > i:
            head, rest = units[:cut], units[cut + 1 :]
        elif start and not out:  # nothing fits beside what is written: go on below it
            head, rest = [], units
        else:  # a word wider than a line: split it
            hard = max(fits, i + 1)
            head, rest = units[:hard], units[hard:]
        out.append(_text(_rstrip(head)))
        units = [(" ", 1)] * hang + _lstrip(rest)
        room, lead = width, True
    out.append(_text(units))
    return out


def _indent(units: list[tuple[str, int]]) -> int:
    n = 0
    for u, w in units:
        if u == " ":
            n += 1
        elif w:
            break
    return n


def _lstrip(units: list[tuple[str, int]]) -> list[tuple[str, int]]:
    i = 0
    while i < len(units) and units[i][0] == " ":
        i += 1
    return units[i:]


class FittedStream:
    """A text stream that writes to ``raw`` what it is given, each line folded to ``width``
    columns (``fold``) and without trailing spaces. Whole lines are folded as they complete;
    ``flush`` writes a line in progress as far as it goes (its trailing spaces wait for what
    follows them), so output streamed a piece at a time still shows at once."""

    def __init__(self, raw, width: int | None = None):
        self.raw_stream = raw
        self.width = width or terminal_width(raw)
        self._line = ""  # written to us, not yet passed on
        self._col = 0  # columns of the current output line already passed on
        self._indent: int | None = None  # that line's indent

    def write(self, s: str) -> int:
        self._line += s
        while "\n" in self._line:
            line, _, self._line = self._line.partition("\n")
            self._emit(line, end="\n")
        return len(s)

    def _emit(self, line: str, end: str) -> None:
        from rich.cells import cell_len

        units = _units(line)
        if end:  # a whole line
            pieces = fold(line, self.width, self._col, self._indent)
            self.raw_stream.write("\n".join(pieces) + end)
            self._col, self._indent = 0, None
            return
        # a line in progress: pass on what is there but its trailing spaces, which wait
        kept = _rstrip(units)
        waiting = _text(units[len(kept) :])
        pieces = fold(_text(kept), self.width, self._col, self._indent)
        self.raw_stream.write("\n".join(pieces))
        if self._indent is None:
            self._indent = _indent(kept)
        last = cell_len(_ESCAPE.sub("", pieces[-1]))
        self._col = last if len(pieces) > 1 else self._col + last
        self._line = waiting

    def flush(self) -> None:
        if self._line.strip(" "):
            self._emit(self._line, end="")
        self.raw_stream.flush()

    def isatty(self) -> bool:
        return self.raw_stream.isatty()

    def fileno(self) -> int:
        return self.raw_stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return getattr(self.raw_stream, "encoding", "utf-8")

    def close_line(self) -> None:
        """Pass on a line left unfinished (no trailing newline), but its trailing spaces."""
        if self._line.strip(" "):
            self._emit(self._line, end="")
        self._line = ""

    def __getattr__(self, name):  # errors, buffer, ...: the raw stream's
        return getattr(self.raw_stream, name)


@contextlib.contextmanager
def fitted_stdout(width: int | None = None):
    """``sys.stdout`` folded to the terminal's width (80 into a pipe, ``COLUMNS`` where set)
    and without trailing spaces while the block runs; already fitted, it is left as it is."""
    if isinstance(sys.stdout, FittedStream):
        yield sys.stdout
        return
    raw = sys.stdout
    fitted = FittedStream(raw, width)
    sys.stdout = fitted
    try:
        yield fitted
    finally:
        try:
            fitted.close_line()
            raw.flush()
        finally:
            if sys.stdout is fitted:
                sys.stdout = raw
