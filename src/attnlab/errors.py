"""The one root of attnlab's user errors.

Every error that means "bad input" (a config out of range, a run directory that cannot be
used, text a tokenizer cannot encode, an unknown layer or head, ...) is an ``AttnlabError``.
The CLI catches this one class and reports it as one line on stderr with exit code 2; anything
else is a bug. It is a ``ValueError`` so that code written against the standard library's
idea of bad input (``except ValueError``) keeps working.
"""

from __future__ import annotations


class AttnlabError(ValueError):
    """Bad input from the user: one clear line that says what to change (the CLI exits 2)."""
