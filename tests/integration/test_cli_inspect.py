"""The look-inside verbs through the real entry point (`python -m attnlab` in a process of its
own); their in-process tests are in the unit tier (tests/unit/test_inspect_*.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np

from cli_helpers import SRC, run_cli
from look_helpers import SENTENCE, make_run


def test_attention_cli(run, cli):
    path, _, _ = run
    r = cli("attention", path, SENTENCE, "--layer", "1", "--head", "1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["layer"], d["head"], d["queries"]) == (1, 1, list(SENTENCE))
    np.testing.assert_allclose(np.array(d["weights"]).sum(-1), 1.0, atol=1e-4)


def test_trace_cli(run, cli):
    path, _, _ = run
    r = cli("trace", path, SENTENCE, "--layer", "1", "--head", "1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["layer"], d["head"], d["tokens"]) == (1, 1, list(SENTENCE))
    assert {"Q", "K", "V", "weights", "predictions"} <= {s["name"] for s in d["steps"]}


def test_check_cli_exits_1_on_a_model_broken_before_it_starts(tmp_path):
    path, _, _ = make_run(tmp_path / "run", steps=5)
    # The run, with attention's forward replaced in the CLI's own process before it starts (a
    # fresh interpreter: the patch is a sitecustomize on its PYTHONPATH).
    patch = tmp_path / "patch"
    patch.mkdir()
    tests_dir = str(Path(__file__).parents[1])  # where look_helpers lives
    (patch / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {tests_dir!r})
        import look_helpers
        from attnlab.attention import MultiHeadAttention
        MultiHeadAttention.forward = look_helpers.broken_forward
    """)
    )
    r = run_cli("check", path, env={"PYTHONPATH": f"{patch}:{SRC}"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout and "future leak" in r.stdout
