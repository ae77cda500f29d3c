"""Normalisation layers: LayerNorm (GPT-2, BERT) and RMSNorm (Llama, Qwen, Mistral, Gemma, T5).

LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * w + b
RMSNorm(x)   = x / sqrt(mean(x^2) + eps) * w                (no centring, no bias)
none(x)      = x                                             (no normalisation at all)

Gemma 1-3 store the RMSNorm weight centred at zero and multiply by (1 + w): the kind
``rms-gemma``. ``make_norm`` builds any of them by name, so a Block can take a norm kind; ``none``
(an ``nn.Identity``) leaves the stream as it is, as in the one-layer model of Nanda et al.
(2023)'s grokking study.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

NORMS = ("layer", "rms", "rms-gemma", "none")  # the kinds ``make_norm`` builds


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """RMSNorm's arithmetic (see ``RMSNorm``), as a function: what the module runs, and what
    decoding's restatement of the forward pass (``attnlab.decoding.FastForward``) calls."""
    h = x.float()  # (..., C) the statistic in float32
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)  # unit root mean square
    if offset:
        return (h * (offset + weight.float())).to(x.dtype)  # Gemma: (1 + w)
    return weight * h.to(x.dtype)  # (..., C)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * (offset + w), the mean over the last dim (C).

    The statistic is computed in float32 whatever the input's dtype, then the result is cast
    back. ``offset`` 0 (Llama, Qwen, Mistral, T5: w starts at 1) casts back before the product
    with w; ``offset`` 1 (Gemma 1-3: w starts at 0) multiplies by (1 + w) in float32 and casts
    after, as each family's reference implementation does (identical in float32, and each
    matches its family bit for bit in half precision).
    """

    def __init__(self, dim: int, eps: float = 1e-6, offset: float = 0.0):
        super().__init__()
        if offset not in (0, 1):
            raise ValueError(f"RMSNorm offset is 0 (w) or 1 (Gemma's 1 + w), got {offset}")
        self.eps, self.offset = eps, float(offset)
        self.weight = nn.Parameter(torch.ones(dim) if offset == 0 else torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, self.offset)

    def extra_repr(self) -> str:
        return f"{self.weight.size(0)}, eps={self.eps}, offset={self.offset:g}"


def make_norm(kind: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A norm over the last dim of width ``dim``: ``layer`` (nn.LayerNorm, with a bias when
    ``bias``), ``rms`` (RMSNorm, w), ``rms-gemma`` (RMSNorm, 1 + w) or ``none`` (an
    ``nn.Identity``: no norm). RMS norms have no bias whatever ``bias`` says (a model's one bias
    switch covers its linear layers too)."""
    if kind == "layer":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rms":
        return RMSNorm(dim, eps)
    if kind == "rms-gemma":
        return RMSNorm(dim, eps, offset=1)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}; choose from {', '.join(NORMS)}")
