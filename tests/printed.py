"""Terminal text as tests read it: where a line wraps is the terminal's business.

attnlab lays its output out for the terminal's width (``COLUMNS``, 80 columns into a pipe), so
a sentence it prints may break at any space: a run directory's path or a number a few
characters longer moves every break after it. ``Printed`` is a str whose ``in`` ignores those
breaks: ``"completeness error" in out`` holds whether the line broke between the two words or
not. A phrase that holds a newline (a layout being tested) is looked for as written. ``flat``
is the text with every run of whitespace one space, for a regular expression over a sentence.

The suite's captures hand it out: ``capsys`` (tests/conftest.py), the forked CLI and
``run_cli`` (their CompletedProcess's stdout and stderr).
"""

from __future__ import annotations


def flat(text: str) -> str:
    """``text`` with every run of whitespace (line breaks included) one space."""
    return " ".join(text.split())


class Printed(str):
    """Text an attnlab command printed; ``phrase in printed`` holds wherever lines wrapped."""

    def __contains__(self, phrase: object) -> bool:
        if not isinstance(phrase, str) or "\n" in phrase or not phrase.strip():
            return str.__contains__(self, phrase)
        return flat(phrase) in self.flat

    @property
    def flat(self) -> str:
        return flat(self)

    # what a test does to the text before it looks in it keeps it Printed
    def strip(self, chars=None):
        return Printed(str.strip(self, chars))

    def rstrip(self, chars=None):
        return Printed(str.rstrip(self, chars))

    def lstrip(self, chars=None):
        return Printed(str.lstrip(self, chars))

    def lower(self):
        return Printed(str.lower(self))


def printed(result):
    """A CompletedProcess whose stdout and stderr are ``Printed`` (text mode), returned."""
    if isinstance(result.stdout, str):
        result.stdout = Printed(result.stdout)
    if isinstance(result.stderr, str):
        result.stderr = Printed(result.stderr)
    return result
