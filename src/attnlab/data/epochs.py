"""Windows of a token stream read in epochs: every window once per epoch, in a shuffled order,
with a position that can be saved and restored exactly, mid-epoch.

Epoch e cuts the stream into windows of T + 1 tokens starting every T tokens from a phase
o_e in [0, T) (a new phase each epoch, so that no token is always first in its window):

    window k of epoch e = tokens[o_e + k*T : o_e + k*T + T + 1],   k = 0 .. K_e - 1
    x = window[:-1], y = window[1:]

and reads them in the order k = P_e(0), P_e(1), ..., a pseudo-random permutation of
[0, K_e) computed on demand (a keyed Feistel network with cycle walking), so no table of
K_e entries is ever held, whatever the corpus size. The position is (epoch, index in epoch):
``state_dict()`` saves it, ``load_state_dict()`` restores it, and the batches that follow are
the same as those the saved source would have given.

Like ``RandomWindows``, each call takes ``batch_size * world_size`` windows and keeps this rank's
slice, so the global batch does not depend on how many processes share it.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.data.corpus import DataError
from attnlab.data.tokens import windows

ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a fixed bijection of uint64 that scrambles every bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class Permutation:
    """A pseudo-random permutation of ``[0, n)`` chosen by ``keys``, evaluated pointwise.

    A balanced Feistel network on 2h bits (4^h >= n) is a bijection of [0, 4^h) whatever its
    round function; applying it again to any value >= n until the value falls below n
    ("cycle walking") makes it a bijection of [0, n). Since 4^h < 4n, that takes fewer than 4
    rounds on average.
    """

    def __init__(self, n: int, keys: np.ndarray):
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n = n
        self.half = max(1, (int(n - 1).bit_length() + 1) // 2)
        self.keys = np.asarray(keys, dtype=np.uint64)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self.half)
        mask = np.uint64((1 << self.half) - 1)
        left, right = x >> h, x & mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << h) | right

    def __call__(self, i: np.ndarray) -> np.ndarray:
        x = np.asarray(i, dtype=np.uint64)
        out = self._feistel(x)
        outside = out >= self.n
        while outside.any():
            out[outside] = self._feistel(out[outside])
            outside = out >= self.n
        return out.astype(np.int64)


class EpochWindows:
    """An endless source of batches (x, y), (B, T) int64, read in epochs (see the module)."""

    def __init__(
        self,
        tokens,
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
        self.seed, self.rank, self.world_size = int(seed), rank, world_size
        self.bos = bos  # each window read after it (``windows``)
        self.epoch, self.index, self.drawn = 0, 0, 0
        self._plan = None

    def __iter__(self):
        return self

    def epoch_plan(self, epoch: int) -> tuple[int, int, Permutation]:
        """(phase o_e, number of windows K_e, order P_e) of ``epoch``."""
        if self._plan is not None and self._plan[0] == epoch:
            return self._plan[1]
        T, n = self.block_size, len(self.tokens)
        draws = np.random.default_rng([self.seed, epoch]).integers(0, 2**63, ROUNDS + 1)
        phase = int(draws[0] % min(T, n - T))  # n - T > 0 phases leave room for one window
        count = (n - 1 - phase - T) // T + 1  # windows whose last token is inside the stream
        plan = (phase, count, Permutation(count, draws[1:]))
        self._plan = (epoch, plan)
        return plan

    def positions(self, n_windows: int) -> np.ndarray:
        """The starts of the next ``n_windows`` windows, moving the position past them."""
        out = []
        while len(out) < n_windows:
            phase, count, order = self.epoch_plan(self.epoch)
            take = min(n_windows - len(out), count - self.index)
            k = order(np.arange(self.index, self.index + take))
            out.extend((phase + k * self.block_size).tolist())
            self.index += take
            if self.index == count:
                self.epoch, self.index = self.epoch + 1, 0
        return np.asarray(out, dtype=np.int64)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        B = self.batch_size
        starts = self.positions(B * self.world_size)
        self.drawn += 1
        mine = starts[self.rank * B : (self.rank + 1) * B]
        return windows(self.tokens, mine, self.block_size, self.bos)

    def state_dict(self) -> dict:
        return {
            "sampler": "epochs",
            "seed": self.seed,
            "epoch": self.epoch,
            "index": self.index,
            "drawn": self.drawn,
            "n_tokens": len(self.tokens),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("sampler") != "epochs":
            raise DataError("the saved data position is not an epoch reader's")
        if state["n_tokens"] != len(self.tokens):
            raise DataError(
                f"the saved data position is for {state['n_tokens']} tokens, these are "
                f"{len(self.tokens)}: the data is not the one the run was trained on"
            )
        self.seed, self.epoch = int(state["seed"]), int(state["epoch"])
        self.index, self.drawn = int(state["index"]), int(state["drawn"])
        self._plan = None
