"""Shared fixtures: run the real CLI in a subprocess against this checkout's sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SRC = Path(__file__).resolve().parents[1] / "src"


def run_cli(*args: str, cwd: str | Path | None = None, timeout: float = 600, env: dict | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``python -m attnlab ARGS`` with this checkout's ``src`` first on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "attnlab", *map(str, args)],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, input=input,
    )  # fmt: skip


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
