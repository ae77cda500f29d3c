"""Integration-tier fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cli(forked_cli):
    """The real CLI, each call a process forked from one warm interpreter (tests/forked_cli.py).
    A test that needs a fresh interpreter (a changed PYTHONPATH, a timeout, stdin) calls
    `cli_helpers.run_cli` instead."""
    return forked_cli


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A briefly trained tiny char GPT saved as a run directory: (path, model, tokenizer)."""
    from look_helpers import make_run

    return make_run(tmp_path_factory.mktemp("look") / "run")
