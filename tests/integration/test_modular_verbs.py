"""A run of ``--task modular`` opens in every verb as any GPT does (the conformance suite's verbs,
on the task's own inputs "a b ="), and the workbench lists it and serves its views."""

from __future__ import annotations

import json

import pytest

from attnlab.serve import start
from conformance_helpers import conformance
from look_helpers import run_main
from serve_helpers import base, call


@pytest.fixture(scope="module")
def modular(tmp_path_factory):
    """A modular-addition run (p = 7, half the pairs), a small model trained a few steps."""
    root = tmp_path_factory.mktemp("modular") / "runs"
    path = root / "add7"
    rc = _main("train", "--task", "modular", "--data", "add:p=7,frac=0.5", "--out", path,
               "--max-iters", "5", "--d-model", "32", "--n-head", "2", "--quiet")  # fmt: skip
    assert rc == 0
    return root, path


def _main(*args) -> int:
    from attnlab.cli import main

    return main([str(a) for a in args])


def test_every_verb_opens_a_modular_run_and_its_identities_hold(modular, capsys):
    _, path = modular
    out = conformance(capsys, path, inputs=("3 4 =", "3 5 ="))
    assert {"trace", "attention", "lens", "dla", "patch", "check", "predict"} <= set(out)
    rc, stdout, err = run_main(capsys, "eval", path, "--json")  # its held-out pairs
    assert rc == 0, err
    d = json.loads(stdout)
    accuracy = [v for k, v in d.items() if "accuracy" in k]
    assert d["task"] == "modular" and accuracy and all(0.0 <= v <= 1.0 for v in accuracy), d


def test_the_workbench_lists_a_modular_run_and_serves_its_views(modular, capsys):
    root, _ = modular
    srv = start(root)
    try:
        u, token = base(srv), srv.settings.token
        _, listing = call(u, "/api/runs", token=token)
        row = next(r for r in listing["runs"] if r["name"].endswith("add7"))
        assert "error" not in row and row["task"] == "modular", row
        status, d = call(u, "/api/views", {"run": row["name"], "input": "3 4 =",
                                           "views": ["predict", "trace"]}, token=token)  # fmt: skip
        assert status == 200, d
        assert "serve_error" not in d["views"]["predict"], d["views"]["predict"]
        rc, stdout, err = run_main(capsys, "predict", root / "add7", "3 4 =", "--json")
        assert rc == 0, err
        assert d["views"]["predict"] == json.loads(stdout)
    finally:
        srv.stop()
