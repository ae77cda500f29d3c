"""Every command of the README's "Every verb, one example each" runs as written, in order, from
a fresh directory (issue 32, item 5): the files it names exist (the built-in corpus, the
examples/ folder) or an earlier command writes them. Kept cheap only by the sizes the README
itself documents: training runs take --max-iters (evaluated once, at the end, and --quiet), the experiment --quick and one
seed ("--quick: under a minute each"), eval --limit (the whole held-out split of the corpus was
a quarter of the test's time)."""

from __future__ import annotations

import os
import re
import shlex
import types
from pathlib import Path

import pytest

from attnlab.cli import main

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SHORT = {"train": ["--max-iters", "12", "--eval-iters", "2", "--eval-interval", "12", "--quiet"],
         "experiment": ["--quick", "--seeds", "1"], "serve": ["--port", "0"],
         "eval": ["--limit", "64"]}  # fmt: skip


def readme_commands() -> list[list[str]]:
    """The attnlab commands of the README's "Every verb" block, continuation lines joined and
    comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Every verb, one example each", 1)[1].split("```bash", 1)[1]
    block = block.split("```", 1)[0].replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in block.splitlines()
            if line.startswith("attnlab ")]  # fmt: skip


def test_the_readme_names_files_the_repository_has():
    for args in readme_commands():
        if "--data" in args:
            data = args[args.index("--data") + 1]
            assert data in ("shakespeare", "dates", "digits") or (ROOT / data).is_file(), data
    assert not re.search(r"--data (input|my)\.txt", (ROOT / "README.md").read_text().split(
        "## From Python")[0])  # fmt: skip


@pytest.mark.timeout(3600)
def test_every_readme_command_runs_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("sklearn")  # the ViT's digits
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # as in a checkout
    (tmp_path / "out").mkdir()
    commands = readme_commands()
    assert len(commands) >= 30
    served = []  # serve builds its app on the runs named, binds and prints its address; the
    # server loop itself (which runs until Ctrl-C) is replaced by one that records the app
    monkeypatch.setattr("attnlab.serve._uvicorn", lambda app, **kw: types.SimpleNamespace(
        run=lambda sockets: served.append((app, sockets))))  # fmt: skip
    for args in commands:
        verb = args[1]
        argv = [*args[1:], *SHORT.get(verb, [])]
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        if verb == "serve":
            assert served and "token=" in out, (argv, out, err)
        assert code in ((0, 1) if verb == "check" else (0,)), (argv, err[-2000:])
