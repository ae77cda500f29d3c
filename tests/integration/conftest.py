"""Integration-tier fixtures."""

from __future__ import annotations

from pathlib import Path

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


@pytest.fixture(scope="module")
def tiny_trained_run(tmp_path_factory) -> Path:
    """One tiny GPT run (2 steps) with a full checkpoint, trained by the real CLI."""
    from cli_helpers import run_cli
    from lm_helpers import TEXT, TINY_TRAIN

    d = tmp_path_factory.mktemp("trained")
    (d / "corpus.txt").write_text(TEXT, encoding="utf-8")
    run = d / "run"
    r = run_cli("train", "--data", d / "corpus.txt", "--out", run, *TINY_TRAIN,
                "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return run
