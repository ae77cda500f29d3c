"""Positional encodings: learned, sinusoidal (the paper's) and rotary.

Attention itself is blind to order (permuting the keys permutes nothing in the weights but
their order), so position is added to the token embeddings (learned, sinusoidal) or rotated
into the queries and keys (rotary).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))."""
    pos = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(n_positions, d_model)  # (P, C)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table


class LearnedPositions(nn.Module):
    """One trained vector per position (GPT-2, BERT)."""

    def __init__(self, n_positions: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_positions, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        return self.weight[offset : offset + T]  # (T, C)


class SinusoidalPositions(nn.Module):
    """The fixed sin/cos table of "Attention is all you need"; nothing to train."""

    def __init__(self, n_positions: int, d_model: int):
        super().__init__()
        self.n_positions, self.d_model = n_positions, d_model
        self.register_buffer("table", torch.empty(n_positions, d_model), persistent=False)
        if not self.table.is_meta:  # on the meta device (a checkpoint being checked): a shape
            self.reset_buffers()

    def reset_buffers(self) -> None:
        """Compute the table (P, C) on the default device. The table is not in a checkpoint:
        ``attnlab.checkpoint`` calls this once a model built on the meta device has its weights."""
        self.table = sinusoidal_table(self.n_positions, self.d_model)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        return self.table[offset : offset + T]  # (T, C)


class Rotary(nn.Module):
    """Rotary position embedding (RoFormer): rotate pairs of q/k channels by position * freq.

    The dot product of a rotated query and key then depends only on their relative distance.
    Applied inside attention to (B, H, T, D) tensors; D must be even.
    """

    def __init__(self, head_dim: int, n_positions: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head width, got {head_dim}")
        self.head_dim, self.n_positions, self.base = head_dim, n_positions, base
        self.register_buffer("cos", torch.empty(n_positions, head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(n_positions, head_dim // 2), persistent=False)
        if not self.cos.is_meta:  # see SinusoidalPositions
            self.reset_buffers()

    def reset_buffers(self) -> None:
        """Compute the cos and sin tables (P, D/2) on the default device (see
        ``SinusoidalPositions.reset_buffers``: they are not in the checkpoint either)."""
        d = self.head_dim
        inv = 1.0 / self.base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = torch.outer(torch.arange(self.n_positions, dtype=torch.float32), inv)  # (P, D/2)
        self.cos, self.sin = angles.cos(), angles.sin()

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Channels (x1, x2) = (x[2i], x[2i+1]) at position t become
        (x1 cos(t w_i) - x2 sin(t w_i), x1 sin(t w_i) + x2 cos(t w_i)): the complex number
        x1 + i x2 times e^(i t w_i). Computed as that one complex product (in float32), which
        is ~5x faster on a CPU than the four real products and their interleaving."""
        T = x.size(-2)
        turn = torch.complex(self.cos[offset : offset + T].float(),
                             self.sin[offset : offset + T].float())  # (T, D/2) e^(i t w)  # fmt: skip
        pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # (..., T, D/2) x1 + i x2
        return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)  # (..., T, D)

    def shift(self, x: Tensor, n: int) -> Tensor:
        """x (..., D) rotated at positions p -> rotated at p - n, for 0 <= n < n_positions.

        The rotation by -n * freq, (x1 cos + x2 sin, -x1 sin + x2 cos): since a score depends
        only on the distance between query and key, moving every key and the next query down
        by n changes no score (a ring-buffer KV cache uses it to stay inside the table).
        """
        cos, sin = self.cos[n].to(x.dtype), self.sin[n].to(x.dtype)  # (D/2,)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1).flatten(-2)


POSITIONAL = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions}
