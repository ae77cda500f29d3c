"""What a test reads of the terminal does not depend on where a line wrapped (tests/printed.py):
a test that passes at one width and fails at another is a defect of the test."""

from __future__ import annotations

from cli_helpers import run_cli
from printed import Printed, flat


def test_a_phrase_is_found_wherever_its_line_broke():
    out = Printed("attribution: the completeness\nerror is 0.01;  misses by\n   nothing\n")
    assert "completeness error" in out and "misses by nothing" in out
    assert "completeness  error" in out  # the phrase's own spacing does not matter either
    assert "error is 0.02" not in out and "completeness\nerror" in out  # a newline: as written
    assert "\n" in out and "" in out and flat(out) == out.flat
    assert str.__contains__(out, "completeness error") is False  # what plain str would say
    assert "COMPLETENESS error".lower() in out.strip().lower()


def test_the_suites_captures_hand_out_printed_text(capsys):
    print("a b")
    assert isinstance(capsys.readouterr().out, Printed)
    r = run_cli("--version")
    assert isinstance(r.stdout, Printed) and isinstance(r.stderr, Printed)
