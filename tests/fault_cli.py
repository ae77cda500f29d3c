"""The ``attnlab`` command with a fault injected into its training (``attnlab.training.faults``).

    python tests/fault_cli.py SPEC ARGS...    # attnlab ARGS..., trained with Faults(SPEC)
    run_faulty(SPEC, ARGS...)                 # the same as a subprocess, as conftest's run_cli
    inject(monkeypatch, SPEC)                 # in this process: attnlab.cli.main(...) trains
                                              # with Faults(SPEC) until the test ends

The fault is a Trainer callback added to ``attnlab.training.run.train``'s: nothing in the
library reads it from the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _with_faults(train, spec: str):
    from attnlab.training.faults import Faults

    faults = Faults(spec)
    return lambda p, log=None, callbacks=(): train(p, log, [*callbacks, faults])


def inject(monkeypatch, spec: str) -> None:
    from attnlab.training import run

    monkeypatch.setattr(run, "train", _with_faults(run.train, spec))


def command(spec: str, *args) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), spec, *map(str, args)]


def run_faulty(spec: str, *args, cwd=None, timeout: float = 600, env: dict | None = None):
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run(command(spec, *args), cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def main(argv: list[str]) -> int:
    from attnlab.cli import main as cli_main
    from attnlab.training import run

    run.train = _with_faults(run.train, argv[0])
    return cli_main(argv[1:])


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as `python -m attnlab` has it
    sys.exit(main(sys.argv[1:]))
