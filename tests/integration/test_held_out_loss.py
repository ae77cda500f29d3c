"""One held-out loss per run (issue 32, item 3): training's val loss is the mean over its
fixed held-out batches, and every figure says what it was computed on. ``heads --importance``
ranks the heads by that same loss (its intact value is training's last val loss); ``eval``
scores the whole split and says so. Before: training said "val loss 1.7498", heads "intact
1.7498" and eval "loss 1.7255" (505,664 tokens), none saying which was which."""

from __future__ import annotations

import json
import re

import pytest

from lm_helpers import TEXT, TINY_TRAIN

LOUD = [a for a in TINY_TRAIN if a != "--quiet"]  # the progress lines say it too


def test_train_heads_and_eval_say_what_their_held_out_loss_is_computed_on(cli, tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    r = cli("train", "--data", tmp_path / "corpus.txt", "--out", run, *LOUD,
            "--max-iters", "6", "--eval-interval", "6", "--eval-iters", "3", "--batch-size",
            "4", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    trained = json.loads(r.stdout)
    on = trained["val_loss_on"]
    assert on.startswith("3 sampled held-out batches (") and on.endswith(" tokens)"), on
    first = next(line for line in r.stderr.splitlines() if line.startswith("evaluating at"))
    assert f"(val loss: on {on})" in first
    text = cli("train", "--data", tmp_path / "corpus.txt", "--out", tmp_path / "again",
               *TINY_TRAIN, "--max-iters", "6", "--eval-interval", "6", "--eval-iters", "3",
               "--batch-size", "4")  # fmt: skip
    assert f"val loss {trained['val_loss']:.4f}" in text.stdout and f" on {on}" in " ".join(
        text.stdout.split()
    )

    heads = cli("heads", run, "--importance", "--quiet", "--json")
    assert heads.returncode == 0, heads.stderr
    h = json.loads(heads.stdout)
    assert h["baseline"] == pytest.approx(trained["val_loss"], rel=1e-5)  # the same batches
    assert h["source"].startswith(on) and "as training measured its val loss" in h["source"]
    plain = cli("heads", run, "--importance", "--quiet")
    assert on in " ".join(plain.stdout.split())

    ev = cli("eval", run, "--json")
    assert ev.returncode == 0, ev.stderr
    e = json.loads(ev.stdout)
    whole = re.search(r": [\d,]+ of [\d,]+ tokens$", e["data"])  # its windows of the split
    assert e["data"].startswith("the val split of ") and whole, e["data"]
