"""Small shared builders for the language-model tests (tiny models, tiny corpora)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnlab.models.gpt import GPT, GPTConfig

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n"
    "All:\nResolved. resolved.\n"
) * 30

TINY_TRAIN = [
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--d-model",
    "16",
    "--block-size",
    "16",
    "--batch-size",
    "4",
    "--eval-iters",
    "2",
    "--log-interval",
    "1",
    "--quiet",
]


def tiny_gpt(vocab=20, **kw) -> GPT:
    """The tests' one small GPT (2 layers, 2 heads, width 16). ``vocab``: a vocabulary size
    (16 positions), or a tokenizer whose vocabulary it reads (48 positions: room for the
    look-inside tests' sentences). Any config field can be overridden."""
    if isinstance(vocab, int):
        cfg = dict(vocab_size=vocab, block_size=16)
    else:
        cfg = dict(vocab_size=vocab.vocab_size, block_size=48)
    cfg.update(n_layer=2, n_head=2, d_model=16)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def random_tokens(n: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.uint16)


def write_text(tmp_path: Path, text: str = TEXT, name: str = "corpus.txt") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def metrics(run: Path) -> list[dict]:
    lines = (Path(run) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def train_losses(run: Path) -> dict[int, float]:
    """step -> training loss of every per-step log line (log_interval 1)."""
    return {r["step"]: r["train_loss"] for r in metrics(run) if "val_loss" not in r}
