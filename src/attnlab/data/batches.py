"""Batches of examples: padding, and endless random sources that a resumed run continues exactly.

Every source draws the *global* batch (``batch_size * world_size`` rows, one generator shared by
every process) and keeps this process's rows, so that the batches do not depend on how many
processes share the work, and ``state_dict()`` (the generator's state, or an epoch and a cursor)
is all a checkpoint needs to continue with the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

Batch = tuple[Tensor, ...]


def pad_batch(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad id lists into (ids (B, T), attention_mask (B, T)), mask 1 = real token."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def generator_state(g: torch.Generator) -> str:
    return base64.b64encode(g.get_state().numpy().tobytes()).decode("ascii")


def set_generator_state(g: torch.Generator, state: str) -> None:
    raw = np.frombuffer(base64.b64decode(state), dtype=np.uint8).copy()
    g.set_state(torch.from_numpy(raw))


def _rows(batch: Batch, rank: int, size: int) -> Batch:
    return tuple(t[rank * size : (rank + 1) * size] for t in batch)


class RandomBatches:
    """Endless batches ``make(n, generator) -> (tensors with n rows)``, all drawn from one seeded
    generator; this process keeps rows [rank * batch_size, (rank + 1) * batch_size)."""

    def __init__(
        self,
        make: Callable[[int, torch.Generator], Batch],
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.make, self.batch_size = make, batch_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.drawn = 0

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        batch = self.make(self.batch_size * self.world_size, self.generator)
        self.drawn += 1
        return _rows(batch, self.rank, self.batch_size)

    def state_dict(self) -> dict:
        return {"generator": generator_state(self.generator), "drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        set_generator_state(self.generator, state["generator"])
        self.drawn = int(state["drawn"])


class EpochBatches:
    """Endless batches that visit every example once per epoch, in an order shuffled anew each
    epoch (a function of ``seed`` and the epoch number alone); the last incomplete global batch
    of an epoch is skipped. ``make(indices) -> batch`` builds the global batch."""

    def __init__(
        self,
        n_examples: int,
        make: Callable[[list[int]], Batch],
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.n, self.make, self.batch_size = n_examples, make, batch_size
        self.global_size = min(batch_size * world_size, n_examples)
        self.rank, self.world_size = rank, world_size
        self.seed, self.epoch, self.cursor = seed, 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        if self.cursor + self.global_size > self.n:
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._shuffle()
        idx = self._order[self.cursor : self.cursor + self.global_size]
        self.cursor += self.global_size
        return _rows(self.make(idx), self.rank, self.batch_size)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._shuffle()
