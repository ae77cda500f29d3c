"""The demo's closing hints run as typed (issue 24 item 19): no bare `attnlab` when the shell
would not find it, no placeholder path; each hint, pasted into a shell as the demo prints it
(folded to 80 columns with `` \\``), exits 0; and each is in the one spelling every verb takes
(issue 32 item 5: the text after the run directory, never --prompt)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from attnlab.cli import main
from attnlab.demo import attnlab_command, command_lines, hints
from task_helpers import train_args, write_task_data

SRC = Path(__file__).resolve().parents[2] / "src"


def test_every_closing_hint_runs_as_typed(tmp_path, monkeypatch):
    d = write_task_data(tmp_path)
    # the demo's corpus has every character its hints type
    (d / "corpus.txt").write_text("JULIET:\nI like to eat apples.\nROMEO:\nAnd I pears.\n" * 40)
    monkeypatch.chdir(tmp_path)
    run = Path("runs") / "demo"
    assert main(train_args("lm", d, run, "--max-iters", "2", "--block-size", "32")) == 0
    found = hints(run)
    assert found and not any("/path/to" in c or "--prompt" in c for _, c in found)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    for _, command in found:
        shown = command_lines(command, 60)  # narrow: the long ones fold
        assert all(len(line) <= 60 for line in shown if " " in line.strip())
        done = subprocess.run("\n".join(shown), shell=True, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, (shown, done.stderr)


def test_attnlab_is_named_by_a_path_when_the_shell_would_not_find_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    first = attnlab_command().split()[0]
    assert first != "attnlab" and (Path(first).is_file() or first.endswith("python"))
