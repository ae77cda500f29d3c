"""The Fourier reading of a model trained on modular addition (Nanda et al. 2023, "Progress
measures for grokking via mechanistic interpretability"): which frequencies the embedding uses,
and how much of the logits those frequencies carry.

On Z_p the real Fourier basis is orthonormal: the constant 1/sqrt(p), and for each frequency
k = 1 .. p // 2 the vectors sqrt(2/p) cos(w_k x) and sqrt(2/p) sin(w_k x), w_k = 2 pi k / p (for
an even p, frequency p/2 has the one vector (-1)^x / sqrt(p)). For a model of the
``--task modular`` shape (the numbers 0 .. p-1 at token ids 1 .. p, answers read at the last
position over the p number tokens):

    embedding power of frequency k   sum over k's basis vectors f of ||f^T W_E||^2, W_E the
                                     (p, d) embedding rows of the numbers; the constant
                                     component is left out of the "non-constant" power
    key frequencies                  the fewest frequencies, most powerful first, that hold at
                                     least ``KEY_SHARE`` (90%) of the non-constant power
    restricted loss                  the logits L (p^2 pairs, p answers) projected onto the
                                     directions cos(w_k (a + b)) and sin(w_k (a + b)) over the
                                     pairs, for the key frequencies k only, plus each answer's
                                     mean logit over the pairs (the paper's bias correction);
                                     cross-entropy over all p^2 pairs
    excluded loss                    L with those key-frequency components removed (nothing
                                     added back), cross-entropy over the training pairs

Restricted loss falls as the generalising circuit forms; excluded loss rises as the training
pairs come to depend on it rather than on memorised lookups; both move before the test loss
does (the paper's Figure 7). The progress measures of a training run use the key frequencies of
its final model at every checkpoint, as the paper does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

KEY_SHARE = 0.9  # key frequencies: the fewest that hold this share of the non-constant power


def fourier_basis(p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The real orthonormal Fourier basis of Z_p as rows: (p, p) float64, and each row's
    frequency (p,) (0 for the constant). Rows: constant, then cos and sin of each frequency
    1 .. (p - 1) // 2, then (even p) the alternating vector of frequency p / 2."""
    x = torch.arange(p, dtype=torch.float64)
    rows, freqs = [torch.full((p,), 1 / math.sqrt(p), dtype=torch.float64)], [0]
    for k in range(1, (p - 1) // 2 + 1):
        w = 2 * math.pi * k / p
        rows += [math.sqrt(2 / p) * torch.cos(w * x), math.sqrt(2 / p) * torch.sin(w * x)]
        freqs += [k, k]
    if p % 2 == 0:
        rows.append(torch.cos(math.pi * x) / math.sqrt(p))
        freqs.append(p // 2)
    return torch.stack(rows), torch.tensor(freqs)


def number_embedding(model, p: int) -> torch.Tensor:
    """The (p, d) embedding rows of the numbers 0 .. p-1 (token ids 1 .. p), float64."""
    return model.tok_embed.weight.detach()[1 : p + 1].double().cpu()


def frequency_power(W: torch.Tensor) -> torch.Tensor:
    """Power of each frequency 0 .. p // 2 in the rows of W (p, d): (p // 2 + 1,), entry 0 the
    constant component. They sum to ||W||^2 (the basis is orthonormal)."""
    p = W.size(0)
    basis, freqs = fourier_basis(p)
    comp = (basis @ W.double()).pow(2).sum(-1)  # (p,) power along each basis vector
    return torch.zeros(p // 2 + 1, dtype=torch.float64).index_add_(0, freqs, comp)


@dataclass
class Spectrum:
    """The embedding's power per frequency and what the key frequencies hold of it."""

    power: list[float]  # per frequency 0 .. p // 2 (0: the constant component)
    key: list[int]  # key frequencies, most powerful first
    key_share: float  # their share of the non-constant power

    def to_dict(self) -> dict:
        return {"power": self.power, "key_frequencies": self.key, "key_share": self.key_share}


def spectrum(model, p: int, share: float = KEY_SHARE) -> Spectrum:
    """The embedding's Fourier power per frequency, and its key frequencies: the fewest, most
    powerful first, that hold at least ``share`` of the non-constant power."""
    power = frequency_power(number_embedding(model, p))
    rest = power[1:]  # (p // 2,) frequencies 1 .. p // 2
    order = torch.argsort(rest, descending=True)
    cum = torch.cumsum(rest[order], 0) / rest.sum().clamp_min(1e-300)
    n = int((cum < share).sum()) + 1  # the first count whose share reaches ``share``
    n = min(n, rest.numel())
    key = [int(i) + 1 for i in order[:n]]
    return Spectrum(power.tolist(), key, float(cum[n - 1]))


def sum_directions(p: int, freqs) -> torch.Tensor:
    """Orthonormal directions over the p^2 pairs (a, b), in the order a * p + b, that span
    cos(w_k (a + b)) and sin(w_k (a + b)) for each frequency k of ``freqs``: (n, p^2)."""
    a = torch.arange(p, dtype=torch.float64).repeat_interleave(p)  # (p^2,)
    b = torch.arange(p, dtype=torch.float64).repeat(p)
    out = []
    for k in freqs:
        w = 2 * math.pi * k / p
        for v in (torch.cos(w * (a + b)), torch.sin(w * (a + b))):
            norm = v.norm()
            if norm > 1e-9:  # sin of frequency p / 2 vanishes
                out.append(v / norm)
    return torch.stack(out) if out else torch.zeros(0, p * p, dtype=torch.float64)


@torch.no_grad()
def pair_logits(model, p: int) -> torch.Tensor:
    """The logits of the p answers at the last position, for every pair in the order
    a * p + b: (p^2, p) float64."""
    from attnlab.modes import evaluating

    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    x = torch.stack([a + 1, b + 1, torch.full_like(a, p + 1)], 1)  # (p^2, 3) "a b ="
    device = next(model.parameters()).device
    with evaluating(model):
        logits = model(x.to(device), logits_to_keep=1)[:, -1, 1 : p + 1]
    return logits.double().cpu()


def progress_measures(logits: torch.Tensor, p: int, key, train_index: torch.Tensor) -> dict:
    """Restricted and excluded loss (see the module docstring) of the pair logits (p^2, p), for
    the key frequencies ``key`` and the training pairs ``train_index`` (numbers a * p + b); and
    the plain losses, on every pair, the training pairs and the test pairs."""
    y = (torch.arange(p).repeat_interleave(p) + torch.arange(p).repeat(p)) % p  # (p^2,)
    U = sum_directions(p, key)  # (n, p^2)
    along = U.T @ (U @ logits)  # (p^2, p) the key-frequency components of every answer's logits
    restricted = along + logits.mean(0, keepdim=True)  # plus each answer's mean over the pairs
    excluded = logits - along
    test = torch.ones(p * p, dtype=torch.bool)
    test[train_index] = False
    ce = lambda lg, rows: float(F.cross_entropy(lg[rows], y[rows]))  # noqa: E731
    return {"restricted_loss": ce(restricted, slice(None)),
            "excluded_loss": ce(excluded, train_index),
            "loss": ce(logits, slice(None)), "train_loss": ce(logits, train_index),
            "test_loss": ce(logits, test)}  # fmt: skip


@torch.no_grad()
def attention_over_pairs(model, p: int, layer: int = 0, query: int = 2, key: int = 0):
    """Each head's attention from position ``query`` ("=") to position ``key`` (the token a)
    for every pair: (H, p, p) float64, entry [h, a, b]."""
    from attnlab import hooks
    from attnlab.modes import evaluating

    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    x = torch.stack([a + 1, b + 1, torch.full_like(a, p + 1)], 1)
    name = f"blocks.{layer}.attn.weights"
    device = next(model.parameters()).device
    with evaluating(model), hooks.record(model, names=[name]) as cache:
        model(x.to(device))
    w = cache[name][:, :, query, key]  # (p^2, H)
    return w.double().cpu().T.reshape(-1, p, p)
