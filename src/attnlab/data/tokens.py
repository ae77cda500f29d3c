"""Token datasets for language modelling: encode a corpus once into a memory-mapped file, then
draw random windows from it.

    corpus --tokenizer--> tokens.bin (uint16 when vocab < 65536, else uint32), read by np.memmap
    window w = tokens[i : i + T + 1];  x = w[:-1], y = w[1:]   (y is x shifted by one token)

The file is written chunk by chunk, so a corpus larger than memory still trains: only the
windows of a batch are ever read.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from attnlab.data.corpus import Corpus, DataError
from attnlab.tokenizers import Tokenizer

TOKEN_FILE = "tokens.bin"
TOKEN_META = "data.json"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


@dataclass
class TokenFileInfo:
    """What ``tokens.bin`` holds: how many tokens, from how many characters, in which dtype."""

    n_tokens: int
    n_chars: int
    dtype: str
    source: str = ""
    encoding: str = "utf-8"

    @property
    def chars_per_token(self) -> float:
        return self.n_chars / max(self.n_tokens, 1)


def encode_to_file(
    corpus: Corpus, tokenizer: Tokenizer, path: str | Path, source: str = ""
) -> TokenFileInfo:
    """Encode ``corpus`` chunk by chunk into the flat token file ``path`` (tmp + fsync + rename).

    Also writes ``data.json`` beside it. Returns the counts (used for bits per character).
    """
    path = Path(path)
    dtype = token_dtype(tokenizer.vocab_size)
    tmp = path.with_name(f".{path.name}.tmp")
    n_tokens = n_chars = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in corpus.chunks():
                ids = np.asarray(tokenizer.encode(chunk, add_special_tokens=False), dtype=dtype)
                ids.tofile(f)
                n_tokens += ids.size
                n_chars += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    info = TokenFileInfo(n_tokens, n_chars, dtype.name, source, corpus.encoding)
    from attnlab.files import atomic_write_json

    atomic_write_json(path.with_name(TOKEN_META), asdict(info))
    return info


def read_token_file(path: str | Path) -> tuple[np.memmap, TokenFileInfo]:
    """Open ``tokens.bin`` (read-only memmap) with the ``data.json`` beside it."""
    path = Path(path)
    meta = path.with_name(TOKEN_META)
    try:
        info = TokenFileInfo(**json.loads(meta.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as e:
        raise DataError(f"{meta}: cannot read token file description ({e})") from None
    expected = info.n_tokens * np.dtype(info.dtype).itemsize
    if not path.is_file() or path.stat().st_size != expected:
        raise DataError(f"{path}: missing or of the wrong size (expected {expected} bytes)")
    if info.n_tokens == 0:
        return np.zeros(0, dtype=info.dtype), info  # np.memmap cannot map an empty file
    return np.memmap(path, dtype=info.dtype, mode="r"), info


def split_tokens(
    tokens: np.ndarray, val_fraction: float, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """First (1 - val_fraction) of the tokens for training, the rest for validation.

    Both parts must hold at least one window (block_size + 1 tokens).
    """
    n = len(tokens)
    need = block_size + 1
    if n < need:
        raise DataError(
            f"the text is only {n} tokens, shorter than block_size + 1 = {need}; "
            "give more text or a smaller --block-size"
        )
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    n_val = int(n * val_fraction)
    train, val = tokens[: n - n_val], tokens[n - n_val :]
    if val_fraction > 0 and len(val) < need:
        raise DataError(
            f"the validation part ({val_fraction:.0%} of {n} tokens = {len(val)}) is "
            f"shorter than block_size + 1 = {need}; give more text, a smaller "
            "--block-size or a larger --val-fraction"
        )
    if len(train) < need:
        raise DataError(
            f"the training part ({len(train)} tokens) is shorter than block_size + 1 = "
            f"{need}; give more text or a smaller --val-fraction"
        )
    return train, (val if val_fraction > 0 else train)


def windows(
    tokens: np.ndarray, starts: np.ndarray, block_size: int, bos: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y (B, T) int64 from windows starting at ``starts``; y is x shifted by one token.

    ``bos``: each window is ``bos`` and the first T - 1 tokens from its start, so ``bos`` is
    read first and is never a target (a model trained with ``--bos``)."""
    n = block_size if bos is not None else block_size + 1
    idx = starts[:, None] + np.arange(n)[None, :]  # (B, n)
    w = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))  # (B, n)
    if bos is not None:
        w = torch.cat([torch.full((len(w), 1), bos, dtype=torch.int64), w], dim=1)  # (B, T + 1)
    return w[:, :-1], w[:, 1:]


class RandomWindows:
    """An endless source of batches of random windows, reproducible from its state.

    Each call draws ``batch_size * world_size`` window starts from one generator and keeps this
    rank's slice, so every rank sees a different part of the same global batch and the global
    batch does not depend on how many processes share it. ``state_dict()`` is the data position.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        bos: int | None = None,
    ):
        if len(tokens) < block_size + 1:
            raise DataError(
                f"need at least block_size + 1 = {block_size + 1} tokens, got {len(tokens)}"
            )
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.rank, self.world_size, self.bos = rank, world_size, bos
        self.generator = torch.Generator().manual_seed(seed)
        self.drawn = 0

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        n_starts = len(self.tokens) - self.block_size  # windows that fit
        B = self.batch_size
        starts = torch.randint(n_starts, (B * self.world_size,), generator=self.generator)
        self.drawn += 1
        mine = starts[self.rank * B : (self.rank + 1) * B].numpy()
        return windows(self.tokens, mine, self.block_size, self.bos)

    def state_dict(self) -> dict:
        state = self.generator.get_state().numpy().tobytes()
        return {"generator": base64.b64encode(state).decode("ascii"), "drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        raw = np.frombuffer(base64.b64decode(state["generator"]), dtype=np.uint8).copy()
        self.generator.set_state(torch.from_numpy(raw))
        self.drawn = int(state["drawn"])


def fixed_batches(
    tokens: np.ndarray,
    block_size: int,
    batch_size: int,
    n_batches: int,
    seed: int = 0,
    bos: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same ``n_batches`` random batches every time (for comparable evaluations)."""
    source = RandomWindows(tokens, block_size, batch_size, seed=seed, bos=bos)
    return [next(source) for _ in range(n_batches)]


def sequential_batches(
    tokens: np.ndarray,
    block_size: int,
    batch_size: int,
    max_tokens: int | None = None,
    bos: int | None = None,
):
    """Non-overlapping windows spread evenly over ``tokens``, in batches (for ``eval``); with
    ``bos``, each window's targets are the block_size tokens after its start, read after
    ``bos`` (``windows``), so every token is still scored once."""
    n_windows = (len(tokens) - 1) // block_size
    if n_windows == 0:
        raise DataError(
            f"the text is only {len(tokens)} tokens, shorter than block_size + 1 = {block_size + 1}"
        )
    keep = n_windows if max_tokens is None else max(1, min(n_windows, max_tokens // block_size))
    starts = (np.linspace(0, n_windows - 1, keep).round().astype(np.int64)) * block_size
    for i in range(0, keep, batch_size):
        yield windows(tokens, starts[i : i + batch_size] + (bos is not None), block_size, bos)
