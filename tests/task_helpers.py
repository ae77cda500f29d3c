"""Every task family, tiny: the data files, the options and the CLI flags the task tests share."""

from __future__ import annotations

import random
from pathlib import Path

from lm_helpers import TEXT

COPY = "copy:n_train=120,n_val=12,n_test=12,min_len=3,max_len=6,symbols=5"
ENCODER = ["--n-layer", "1", "--n-head", "2", "--d-model", "16", "--block-size", "16"]
# task id -> (--task, --data file name or spec, the other flags)
TASKS = {
    "lm": ("lm", "corpus.txt", [*ENCODER, "--dropout", "0.1"]),
    "mlm": ("mlm", "lines.txt", [*ENCODER, "--dropout", "0.1"]),
    "classify": ("classify", "labels.tsv", [*ENCODER, "--tokenizer", "word", "--dropout", "0.1"]),
    "transformer": (
        "seq2seq",
        COPY,
        ["--d-model", "16", "--n-layer", "1", "--n-head", "2", "--dropout", "0.1"],
    ),  # fmt: skip
    "lstm-attention": (
        "seq2seq",
        COPY,
        ["--arch", "lstm-attention", "--d-model", "16", "--dropout", "0.1"],
    ),  # fmt: skip
    "induction": (
        "induction",
        "repeat:vocab=8,min_period=2,max_period=6",
        ["--d-model", "16", "--n-head", "2", "--block-size", "16", "--dropout", "0.1"],
    ),  # fmt: skip
    "vit": (
        "classify",
        "digits",
        ["--arch", "vit", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--dropout", "0.1"],
    ),  # fmt: skip
}


def labelled_lines(n: int = 120, seed: int = 0) -> str:
    rng = random.Random(seed)
    good, bad = ["good", "great", "lovely"], ["bad", "awful", "poor"]
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        rows.append(f"{label}\tthe day was {rng.choice(good if label == 'pos' else bad)} indeed")
    return "\n".join(rows) + "\n"


def write_task_data(d: Path) -> Path:
    """corpus.txt (a play), lines.txt (its lines), labels.tsv (label<TAB>text) in ``d``."""
    (d / "corpus.txt").write_text(TEXT, encoding="utf-8")
    (d / "lines.txt").write_text(TEXT, encoding="utf-8")
    (d / "labels.tsv").write_text(labelled_lines(), encoding="utf-8")
    return d


def train_args(task_id: str, d: Path, out: Path, *more) -> list[str]:
    task, data, flags = TASKS[task_id]
    path = data if ":" in data or data == "digits" else str(d / data)
    return ["train", "--task", task, "--data", path, "--out", str(out), *flags,
            "--batch-size", "4", "--eval-iters", "2", "--log-interval", "1", "--quiet", *more]  # fmt: skip


def given(task_id: str, d: Path, out: Path, *more) -> dict:
    """The same run as ``train_args``, parsed by the real CLI: the options of ``plan``."""
    from attnlab.cli import build_parser

    ns = build_parser().parse_args(train_args(task_id, d, out, *more))
    return {k: v for k, v in vars(ns).items() if k not in ("func", "verb")}
