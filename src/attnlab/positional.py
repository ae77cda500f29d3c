"""Positional encodings: learned, sinusoidal (the paper's), rotary and relative biases.

Attention itself is blind to order (permuting the keys permutes nothing in the weights but
their order), so position is added to the token embeddings (learned, sinusoidal), rotated
into the queries and keys (rotary: ``Rotary`` pairs adjacent channels, the GPT-J layout;
``RotaryHalf`` pairs channel i with i + d/2, the Llama / Qwen / Gemma / NeoX layout), or added
to the attention scores as a learned bias per relative distance (T5's
``RelativePositionBias``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
        ``attnlab.rundir`` calls this once a model built on the meta device has its weights."""
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


@dataclass(frozen=True)
class RopeScaling:
    """How a rotary table stretches past the length it was trained on.

    ``linear`` (position interpolation): every frequency divided by ``factor``.
    ``llama3``: by band of wavelength 2 pi / w against ``original_max_positions`` (L):
    wavelengths under L / high_freq_factor keep their frequency, those over
    L / low_freq_factor are divided by ``factor``, and those between blend the two,
    w' = (1 - s) w / factor + s w with s = (L / wavelength - low) / (high - low).
    """

    kind: str  # "linear" or "llama3"
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def __post_init__(self):
        if self.kind not in ("linear", "llama3"):
            raise ValueError(f"unknown rope scaling {self.kind!r}; choose from linear, llama3")
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be positive, got {self.factor}")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 rope scaling needs high_freq_factor > low_freq_factor")

    def apply(self, inv_freq: Tensor) -> Tensor:
        """(D/2,) frequencies -> the scaled ones."""
        if self.kind == "linear":
            return inv_freq / self.factor
        L, lo, hi = self.original_max_positions, self.low_freq_factor, self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq  # (D/2,) positions per turn
        s = (L / wavelen - lo) / (hi - lo)  # 0 at the long-wavelength edge, 1 at the short
        blended = (1 - s) * inv_freq / self.factor + s * inv_freq
        out = torch.where(wavelen > L / lo, inv_freq / self.factor, blended)
        return torch.where(wavelen < L / hi, inv_freq, out)


def rotary_frequencies(rot_dim: int, base: float = 10000.0, scaling: RopeScaling | None = None):
    """w_i = base^(-2i / rot_dim) for i < rot_dim / 2, then ``scaling`` if any. (rot_dim/2,)"""
    inv = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    return inv if scaling is None else scaling.apply(inv)


class RotaryHalf(nn.Module):
    """Rotary positions in the rotate-half layout (Llama, Qwen, Mistral, Gemma, GPT-NeoX).

    Channel i is paired with channel i + r/2 (r = ``rot_dim``) and the pair is rotated by
    the angle t w_i at position t: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). The same
    rotation as ``Rotary`` on a permutation of the channels; a checkpoint trained in one layout
    reads correctly only in its own. Only the first ``rot_dim`` channels of each head rotate
    (partial rotary: Pythia's ``rotary_pct``); the rest pass through. ``scaling`` stretches the
    frequencies (``RopeScaling``). A model whose layers use different bases (Gemma 3's local
    and global layers) builds one RotaryHalf per base and gives each layer its own.
    Applied inside attention to (B, H, T, D) tensors, in their own dtype (the tables are
    float32, cast to it, as the families' reference implementations do).
    """

    def __init__(
        self,
        head_dim: int,
        n_positions: int,
        base: float = 10000.0,
        rot_dim: int | None = None,
        scaling: RopeScaling | None = None,
    ):
        super().__init__()
        rot_dim = head_dim if rot_dim is None else rot_dim
        if rot_dim % 2 or not 0 < rot_dim <= head_dim:
            raise ValueError(f"rot_dim must be even and in 1..{head_dim}, got {rot_dim}")
        self.head_dim, self.n_positions, self.base = head_dim, n_positions, base
        self.rot_dim, self.scaling = rot_dim, scaling
        self.register_buffer("cos", torch.empty(n_positions, rot_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(n_positions, rot_dim // 2), persistent=False)
        if not self.cos.is_meta:  # see SinusoidalPositions
            self.reset_buffers()

    def reset_buffers(self) -> None:
        """Compute the cos and sin tables (P, r/2) (see ``SinusoidalPositions.reset_buffers``)."""
        inv = rotary_frequencies(self.rot_dim, self.base, self.scaling)  # (r/2,)
        angles = torch.outer(torch.arange(self.n_positions, dtype=torch.float32), inv)  # (P, r/2)
        self.cos, self.sin = angles.cos(), angles.sin()

    def _turn(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotate the pairs (x[i], x[i + r/2]) of the first r channels by the given angles."""
        h = self.rot_dim // 2
        x1, x2, rest = x[..., :h], x[..., h : self.rot_dim], x[..., self.rot_dim :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (..., T, D) at positions offset .. offset + T - 1 -> rotated, same shape."""
        T = x.size(-2)
        cos = self.cos[offset : offset + T].to(x.dtype)  # (T, r/2)
        sin = self.sin[offset : offset + T].to(x.dtype)
        return self._turn(x, cos, sin)  # (..., T, D)

    def shift(self, x: Tensor, n: int) -> Tensor:
        """x (..., D) rotated at positions p -> rotated at p - n (see ``Rotary.shift``)."""
        return self._turn(x, self.cos[n].to(x.dtype), -self.sin[n].to(x.dtype))


def relative_position_bucket(
    relative: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each relative position (key position - query position), a LongTensor.

    Bidirectional: half the buckets for keys before the query, half for keys after.
    Causal: keys after the query all fall in bucket 0 with distance 0. Within a half, the
    first half of its buckets hold the distances 0, 1, ... exactly, and the rest cover the
    distances up to ``max_distance`` in logarithmically wider bins; farther ones share the
    last bucket.
    """
    n, bucket = num_buckets, torch.zeros_like(relative)
    if bidirectional:
        n //= 2
        bucket = (relative > 0).long() * n  # keys after the query use the upper half
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # keys after the query count as distance 0
    exact = n // 2
    log_ratio = torch.log(distance.float() / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (n - exact)).long()).clamp(max=n - 1)  # log-spaced bins
    return bucket + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """T5's attention bias: a learned scalar per head and relative-position bucket.

    bias[h, t, s] = E[bucket(s - t), h], added to the scores Q K^T of every layer (T5 learns
    it in the first layer and shares it with the rest). ``bidirectional`` in the encoder,
    causal in the decoder. ``forward(T, S, offset)`` -> (1, H, T, S), the queries at
    positions offset .. offset + T - 1 (cached decoding) and the keys at 0 .. S - 1.
    """

    def __init__(
        self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional=True
    ):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, T: int, S: int, offset: int = 0) -> Tensor:
        device = self.embedding.weight.device
        q_pos = torch.arange(T, device=device)[:, None] + offset  # (T, 1)
        k_pos = torch.arange(S, device=device)[None, :]  # (1, S)
        buckets = relative_position_bucket(
            k_pos - q_pos, self.bidirectional, self.num_buckets, self.max_distance
        )  # (T, S)
        return self.embedding(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, H, T, S)


POSITIONAL = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions}
