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


@pytest.fixture(scope="session")
def chromium():
    """One headless Chromium for every workbench browser test of the session (each module
    opens its own page in it, ``open_workbench``): one browser start, not one per module."""
    from serve_helpers import skip_without_chromium

    skip_without_chromium()
    from cdp import Browser

    b = Browser(timeout=120)
    yield b
    b.close()


@pytest.fixture(scope="module")
def open_workbench(chromium):
    """``open_workbench(paths)``: a workbench serving ``paths`` (``attnlab.serve.start``, in a
    thread), its page open in the shared Chromium and drawn once; returns the browser. The
    page is closed and the workbench stopped when the module ends (or at the next call)."""
    from attnlab.serve import start
    from serve_helpers import wait

    servers = []

    def stop() -> None:
        chromium.close_page()
        while servers:
            servers.pop().stop()

    def open_(paths):
        stop()
        servers.append(start(paths))
        chromium.open(servers[-1].url)
        wait(chromium, lambda: chromium.eval("document.body.dataset.updates") is not None)
        return chromium

    yield open_
    stop()
