"""One width rule for everything attnlab prints (issue 32, item 2): COLUMNS, else the terminal's
width, else 80 into a pipe; a folded line keeps its indent; no line has trailing spaces."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from attnlab.render.terminal import FittedStream, fitted_stdout, fold, terminal_width


def test_the_width_is_columns_else_80_into_a_pipe(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal_width(io.StringIO()) == 80
    monkeypatch.setenv("COLUMNS", "57")
    assert terminal_width(io.StringIO()) == 57
    monkeypatch.setenv("COLUMNS", "wide")
    assert terminal_width(io.StringIO()) == 80


def test_a_folded_line_keeps_its_indent_and_breaks_between_words():
    line = "    note: " + " ".join(f"word{i}" for i in range(30))
    out = fold(line, 40)
    assert len(out) > 1 and all(cell_len(x) <= 40 for x in out)
    assert out[0].startswith("    note: word0")
    assert all(x.startswith("      ") and not x.startswith("       ") for x in out[1:])
    assert " ".join(x.strip() for x in out) == line.strip()  # every word, in order, whole


def test_a_word_wider_than_the_line_is_split_rather_than_spilled():
    out = fold("x" * 100, 30)
    assert all(cell_len(x) <= 30 for x in out) and "".join(x.strip() for x in out) == "x" * 100


def test_colour_codes_take_no_columns_and_are_kept():
    red, reset = "\x1b[31m", "\x1b[0m"
    line = f"{red}{'a' * 20}{reset}   "
    assert fold(line, 20) == [f"{red}{'a' * 20}{reset}"]


@settings(deadline=None)  # a busy machine: time is not what is checked
@given(st.lists(st.text(alphabet="ab ␣é界\t", max_size=120), max_size=6),
       st.integers(min_value=20, max_value=100))  # fmt: skip
def test_every_line_fits_and_no_line_has_trailing_spaces(lines, width):
    buf = io.StringIO()
    stream = FittedStream(buf, width)
    stream.write("\n".join(lines) + "\n")
    stream.flush()
    for line in buf.getvalue().splitlines():
        assert cell_len(line) <= width and line == line.rstrip(" ")
    words = [w for x in lines for w in x.replace("\t", " ").split(" ") if w]
    assert "".join(buf.getvalue().split()) == "".join("".join(words).split())  # nothing lost


def test_streamed_output_shows_at_once_and_still_fits():
    buf = io.StringIO()
    stream = FittedStream(buf, 30)
    stream.write("ROMEO: the quick brown fox ")
    stream.flush()
    assert buf.getvalue() == "ROMEO: the quick brown fox"  # its trailing space waits
    stream.write("jumps over the lazy dog\n")
    out = buf.getvalue().splitlines()
    assert out == ["ROMEO: the quick brown fox", "  jumps over the lazy dog"]


def test_stdout_is_fitted_inside_the_block_and_restored_after(capsys, monkeypatch):
    import sys

    monkeypatch.delenv("COLUMNS", raising=False)
    before = sys.stdout
    with fitted_stdout():
        print("  " + "spam " * 40)
    assert sys.stdout is before
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(cell_len(x) <= 80 and x == x.rstrip() for x in out)


@pytest.mark.parametrize("width", [40, 80, 120])
def test_a_result_prints_at_the_width_it_is_printed_at(width, monkeypatch):
    """str(result), print(result) in Python, is laid out for the terminal's width."""
    import numpy as np

    from attnlab.render.display import Result, matrix_table

    class Square(Result):
        def __rich__(self):
            return matrix_table(np.eye(30), list("abcdefghijklmnopqrstuvwxyzABCD"),
                                list("abcdefghijklmnopqrstuvwxyzABCD"), "a title " * 12)  # fmt: skip

    monkeypatch.setenv("COLUMNS", str(width))
    lines = str(Square()).splitlines()
    assert all(cell_len(x) <= width and x == x.rstrip() for x in lines)
    assert max(cell_len(x) for x in lines) > width - 10  # it uses the width it has
