"""``attnlab train --task classify --arch lstm-attention``: Jain & Wallace's BiLSTM with
additive attention, trained through the one training path, opened by every verb (or refused
in one line that names what works), resumed, and trained with uniform attention."""

from __future__ import annotations

import json

import pytest

from attnlab.run import load_run
from look_helpers import run_main
from task_helpers import labelled_lines

FLAGS = ["--tokenizer", "word", "--d-model", "16", "--batch-size", "8", "--eval-iters", "2",
         "--log-interval", "1", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "labels.tsv"
    path.write_text(labelled_lines(), encoding="utf-8")
    return path


def train(capsys, data, out, *more):
    return run_main(capsys, "train", "--task", "classify", "--data", data, "--out", out,
                    "--arch", "lstm-attention", *FLAGS, *more)  # fmt: skip


def test_trains_learns_the_cue_and_every_verb_opens_it(data, tmp_path, capsys):
    out = tmp_path / "run"
    rc, stdout, err = train(capsys, data, out, "--max-iters", "60", "--lr", "0.01")
    assert rc == 0, err
    run = load_run(out)
    assert run.model.kind == "lstm-classifier" and run.config["config"]["attention"] == "additive"
    assert run.config["metrics"]["val_accuracy"] >= 0.9  # one word decides the label
    rc, stdout, _ = run_main(capsys, "predict", out, "the day was lovely indeed", "--json")
    assert rc == 0 and json.loads(stdout)["predictions"][0]["classes"][0]["label"] == "pos"
    rc, stdout, _ = run_main(capsys, "attention", out, "the day was awful indeed", "--json")
    assert rc == 0
    got = json.loads(stdout)
    assert got["queries"] == ["query"] and len(got["keys"]) == 7  # [CLS] .. [SEP]
    assert sum(got["weights"][0]) == pytest.approx(1.0, abs=1e-4)
    assert got["kind"] == "pooling"  # one query pooling the states: neither self nor cross
    rc, stdout, _ = run_main(capsys, "trace", out, "the day was awful indeed", "--json")
    names = [s["name"] for s in json.loads(stdout)["steps"]]
    assert rc == 0 and {"states", "scores", "attention", "context", "classes"} <= set(names)
    rc, stdout, _ = run_main(capsys, "eval", out, "--json")
    assert rc == 0
    rc, stdout, _ = run_main(capsys, "ablate", out, "the day was awful indeed", "--context",
                             "--json")  # fmt: skip
    assert rc == 0
    rc, _, err = run_main(capsys, "lens", out, "the day was awful indeed")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "residual stream" in err
    rc, _, err = run_main(capsys, "train", "--resume", "--out", out, "--max-iters", "70",
                          "--quiet")  # fmt: skip
    assert rc == 0, err


def test_uniform_attention_trains_with_every_token_weighed_the_same(data, tmp_path, capsys):
    out = tmp_path / "uniform"
    rc, _, err = train(capsys, data, out, "--max-iters", "4", "--score", "uniform")
    assert rc == 0, err
    rc, stdout, _ = run_main(capsys, "attention", out, "the day was awful", "--json")
    weights = json.loads(stdout)["weights"][0]
    assert weights == pytest.approx([1 / len(weights)] * len(weights), abs=1e-4)


def test_snapshots_are_refused_in_one_line(data, tmp_path, capsys):
    rc, _, err = train(capsys, data, tmp_path / "snap", "--max-iters", "2",
                       "--snapshot-every", "1")  # fmt: skip
    assert rc == 2 and "self-attention" in err and len(err.strip().splitlines()) == 1
