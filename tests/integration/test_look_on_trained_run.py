"""The six look-inside verbs on a run written by `attnlab train` itself, through the real CLI."""

from __future__ import annotations

import csv
import json

import pytest

from cli_helpers import run_cli

pytestmark = pytest.mark.slow
TEXT = "to be or not"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("look")
    corpus = d / "corpus.txt"
    corpus.write_text("to be, or not to be: that is the question.\n" * 60, encoding="utf-8")
    out = d / "run"
    r = run_cli("train", "--data", corpus, "--out", out, "--n-layer", "2", "--n-head", "2",
                "--d-model", "32", "--block-size", "32", "--max-iters", "40",
                "--eval-interval", "20", "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


def _json(*args):
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_attention_rows_are_causal_and_sum_to_one(run):
    m = _json("attention", run, TEXT, "--layer", "1", "--head", "1")
    w = m["weights"]
    assert m["queries"] == m["keys"] == list(TEXT) and m["layer"] == 1 and m["head"] == 1
    for i, row in enumerate(w):
        assert abs(sum(row) - 1) < 1e-3
        assert all(x == 0 for x in row[i + 1 :]), "a token attended to its future"


def test_trace_walks_every_step_with_its_shape(run):
    t = _json("trace", run, TEXT)
    names = [s["name"] for s in t["steps"]]
    for step in ("embedding", "W_Q", "raw_scores", "scaled_scores", "masked_scores", "weights",
                 "concat", "ln2", "ffn_out", "logits", "predictions"):  # fmt: skip
        assert step in names, step
    assert t["tokens"] == list(TEXT)


def test_similarity_and_influence_cover_every_token_and_layer(run, tmp_path):
    s = _json("similarity", run, TEXT)
    assert all(len(layer["tokens"]) == len(TEXT) for layer in s["layers"])
    path = tmp_path / "influence.csv"
    r = run_cli("influence", run, TEXT, "--csv", path)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 2 * len(TEXT)  # every token at each of the 2 layers
    for row in rows:
        shares = float(row["attn_share"]) + float(row["ffn_share"])
        assert shares <= 1.0 + 1e-6


def test_explore_writes_one_offline_page_and_check_passes(run, tmp_path):
    page = tmp_path / "explorer.html"
    r = run_cli("explore", run, TEXT, "--html", page)
    assert r.returncode == 0, r.stderr
    html = page.read_text(encoding="utf-8")
    assert "<script" in html and "http://" not in html and "https://" not in html
    report = _json("check", run)
    assert report["ok"] is True
    assert {c["name"]: c["status"] for c in report["checks"]}["future leak"] == "PASS"
