"""Unit-tier fixtures: in-process only (no subprocess, no notebook; those live in integration
and acceptance)."""

from __future__ import annotations

import pytest

from look_helpers import make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A briefly trained tiny char GPT saved as a run directory: (path, model, tokenizer)."""
    return make_run(tmp_path_factory.mktemp("look") / "run")
