"""End to end: `attnlab train --task seq2seq`, `translate` and `eval` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.run import load_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "phrases_en_es.tsv"
TINY = ["--max-iters", "16", "--batch-size", "16", "--d-model", "32", "--eval-interval", "8",
        "--quiet"]  # fmt: skip
COPY = "copy:n_train=200,n_val=20,n_test=20,min_len=3,max_len=6,symbols=5"


def one_error_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error:"), r.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "lstm-attention", "lstm"])
def test_train_translate_eval(cli, tmp_path, arch):
    run = tmp_path / arch
    r = cli("train", "--task", "seq2seq", "--data", COPY, "--arch", arch, "--score", "additive",
            "--out", run, *TINY)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "val exact match" in r.stdout
    names = {p.name for p in run.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "target_tokenizer.json"} <= names
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_exact" in r]  # at steps 0, 8 and 16, in its own words
    assert [r["step"] for r in evals] == [0, 8, 16] and "val_ppl" not in evals[-1]
    assert all("pairs_per_s" in r and "tokens_per_s" not in r for r in rows if "val_loss" not in r)
    model, tok = load_run(run)
    assert model.model_type == ("seq2seq" if arch == "transformer" else "rnn")
    if arch == "lstm-attention":
        assert model.config.attention == "additive"

    r = cli("translate", run, "abc", "edcba", "--beam", "3")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2 and set(r.stdout) <= set("abcde\n")

    r = cli("eval", run, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["pairs"] == 20 and 0 <= res["exact_match"] <= res["token_accuracy"] + 1e-9 <= 1
    assert res["about"]["kind"] == ("seq2seq-transformer" if arch == "transformer" else arch)
    assert 0 <= res["bleu"] <= 100 and 0 <= res["chrf"] <= 100

    if arch == "transformer":  # bad input to a good run: one line, exit 2
        assert "not in the vocabulary" in one_error_line(cli("translate", run, "xyz"))
        one_error_line(cli("translate", run, "abc", "--beam", "0"))


@pytest.mark.slow
def test_parallel_corpus_with_word_tokenizers(cli, tmp_path):
    run = tmp_path / "phrases"
    r = cli("train", "--task", "seq2seq", "--data", EXAMPLE, "--tokenizer", "word", "--out", run,
            *TINY)  # fmt: skip
    assert r.returncode == 0, r.stderr
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["data"]["task"] == "tsv" and len(cfg["data"]["sha256"]) == 64
    r = cli("translate", run, "let's go")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr
    r = cli("eval", run, "--split", "val")
    assert r.returncode == 0, r.stderr
    assert "(scored on the val split of phrases_en_es: 29 pairs, greedy)" in r.stdout, r.stdout


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path):
    assert "unknown seq2seq data" in one_error_line(
        cli("train", "--task", "seq2seq", "--data", "nope:x=1", "--out", tmp_path / "a")
    )
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\tuno\ntwo dos\nthree\ttres\n", encoding="utf-8")
    assert "bad.tsv:2" in one_error_line(
        cli("train", "--task", "seq2seq", "--data", bad, "--out", tmp_path / "b")
    )
    assert not (tmp_path / "b").exists()
    one_error_line(cli("translate", tmp_path, "hello"))
    one_error_line(cli("eval", tmp_path / "missing"))
