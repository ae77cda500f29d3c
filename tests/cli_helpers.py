"""The real CLI in a fresh interpreter, against this checkout's sources (the tiers' `cli`
fixture forks from a warm one instead: tests/forked_cli.py). A helper module, not conftest:
each tier has its own conftest.py, so `from conftest import ...` would be ambiguous."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from printed import printed

SRC = Path(__file__).resolve().parents[1] / "src"


def run_cli(*args: str, cwd: str | Path | None = None, timeout: float = 600, env: dict | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``python -m attnlab ARGS`` with this checkout's ``src`` first on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return printed(subprocess.run(
        [sys.executable, "-m", "attnlab", *map(str, args)],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, input=input,
    ))  # fmt: skip
