"""Same command, same run: two identical `attnlab train` commands, each in a new process (its
own hash seeds), write byte-identical tokenizer files and log identical losses, for every task
and every tokenizer kind it builds."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from task_helpers import COPY, ENCODER, labelled_lines

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = ["--batch-size", "4", "--eval-iters", "2", "--eval-interval", "2", "--max-iters", "2",
        "--log-interval", "1", "--threads", "1", "--quiet", "--seed", "3"]  # fmt: skip
# run name -> the flags after `attnlab train` (--data names a file written by write_data)
RUNS = {
    "lm-char": ["--task", "lm", "--data", "text.txt", "--tokenizer", "char", *ENCODER],
    "lm-word": ["--task", "lm", "--data", "text.txt", "--tokenizer", "word", *ENCODER],
    "lm-bpe": [
        "--task",
        "lm",
        "--data",
        "text.txt",
        "--tokenizer",
        "bpe",
        "--vocab-size",
        "300",
        *ENCODER,
    ],  # fmt: skip
    "mlm-wordpiece": [
        "--task",
        "mlm",
        "--data",
        "text.txt",
        "--tokenizer",
        "wordpiece",
        "--vocab-size",
        "120",
        *ENCODER,
    ],  # fmt: skip
    "mlm-bpe": [
        "--task",
        "mlm",
        "--data",
        "text.txt",
        "--tokenizer",
        "bpe",
        "--vocab-size",
        "300",
        *ENCODER,
    ],  # fmt: skip
    "classify-wordpiece": [
        "--task",
        "classify",
        "--data",
        "labels.tsv",
        "--tokenizer",
        "wordpiece",
        "--vocab-size",
        "60",
        *ENCODER,
    ],  # fmt: skip
    "classify-word": [
        "--task",
        "classify",
        "--data",
        "labels.tsv",
        "--tokenizer",
        "word",
        *ENCODER,
    ],  # fmt: skip
    "seq2seq-word-bpe": [
        "--task",
        "seq2seq",
        "--data",
        "pairs.tsv",
        "--src-tokenizer",
        "word",
        "--tgt-tokenizer",
        "bpe",
        "--vocab-size",
        "280",
        "--d-model",
        "16",
        "--n-layer",
        "1",
        "--n-head",
        "2",
    ],  # fmt: skip
    "seq2seq-generated": [
        "--task",
        "seq2seq",
        "--data",
        COPY,
        "--d-model",
        "16",
        "--n-layer",
        "1",
        "--n-head",
        "2",
    ],  # fmt: skip
    "induction": [
        "--task",
        "induction",
        "--data",
        "repeat:vocab=8,min_period=2,max_period=6",
        "--d-model",
        "16",
        "--n-head",
        "2",
        "--block-size",
        "16",
    ],  # fmt: skip
}
TRAIN_ALL = """
import json, sys
from attnlab.cli import main
for out, flags in json.loads(sys.argv[1]).items():
    assert main(["train", "--out", out, *flags]) == 0, out
"""


def write_data(d: Path) -> None:
    """Texts where many tokens are equally frequent: merges tie, as they do in small corpora."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5))) for _ in range(60)]
    lines = [" ".join(rng.choice(words) for _ in range(8)).capitalize() + "." for _ in range(200)]
    (d / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (d / "labels.tsv").write_text(labelled_lines(), encoding="utf-8")
    pairs = [f"{line}\t{' '.join(reversed(line.split()))}" for line in lines]
    (d / "pairs.tsv").write_text("\n".join(pairs) + "\n", encoding="utf-8")


def train_all_in_a_new_process(data: Path, root: Path, threads: str) -> dict[str, Path]:
    outs = {name: root / name for name in RUNS}
    runs = {str(outs[name]): [str(data / f) if (data / f).is_file() else f for f in flags] + TINY
            for name, flags in RUNS.items()}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC), "RAYON_NUM_THREADS": threads,
           "PYTHONHASHSEED": threads}  # fmt: skip
    r = subprocess.run([sys.executable, "-c", TRAIN_ALL, json.dumps(runs)], env=env,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return outs


def losses(run: Path) -> list[dict]:
    """Every logged row of metrics.jsonl, less what measures time."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    timing = ("_per_s", "ms_per_iter", "seconds", "time", "threads", "elapsed")
    return [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in rows]


@pytest.mark.slow
def test_two_identical_train_commands_write_the_same_tokenizers_and_losses(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_data(data)
    one = train_all_in_a_new_process(data, tmp_path / "one", "1")
    two = train_all_in_a_new_process(data, tmp_path / "two", "2")
    for name in RUNS:
        files = sorted(p.name for p in one[name].glob("*tokenizer.json"))
        assert files or name == "induction", name
        for f in files:
            assert (one[name] / f).read_bytes() == (two[name] / f).read_bytes(), f"{name}: {f}"
        a, b = losses(one[name]), losses(two[name])
        assert any("val_loss" in r for r in a), name
        assert a == b, f"{name}: the two runs logged different losses"
