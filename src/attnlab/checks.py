"""Conformance probes usable on any callable sequence model.

A causal model's output at position t may depend on inputs 0..t only. Two probes:
- perturbation: change the input at position j; outputs before j must not move;
- gradient: d output[t] / d input[j] must be exactly zero for every j > t.
``DecoderProbes`` gives an encoder-decoder what ``attnlab check`` asks of a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.tokenizers import BOS, EOS  # an encoder-decoder's <bos> and <eos>


@dataclass
class LeakReport:
    leaks: bool
    max_diff: float  # the largest change (or gradient) seen where there should be none
    position: tuple[int, int] | None  # (earlier output t, later input j) of the worst leak

    def __str__(self) -> str:
        if not self.leaks:
            return f"no future leak (max diff {self.max_diff:.3g})"
        t, j = self.position
        return f"future leak: output at {t} depends on input at {j} (diff {self.max_diff:.3g})"


@torch.no_grad()
def find_future_leak(
    fn: Callable[[Tensor], Tensor],
    x: Tensor,
    perturb: Callable[[Tensor, int], Tensor] | None = None,
    positions: list[int] | None = None,
    atol: float = 1e-6,
) -> LeakReport:
    """Perturb the input (B, T, ...) at each position j; outputs (B, T, ...) at t < j must not move.

    ``perturb(x, j)`` returns a changed copy of x (default: new random values at j for float
    inputs, a shifted token id at j for integer ids).
    """
    T = x.size(1)
    if perturb is None:
        perturb = _perturb_ids if not x.is_floating_point() else _perturb_float
    base = fn(x)
    worst, where = 0.0, None
    for j in positions if positions is not None else range(1, T):
        moved = (fn(perturb(x, j)) - base)[:, :j].abs()  # (B, j, ...) outputs before j
        if moved.numel() == 0:
            continue
        per_t = moved.flatten(2).amax(dim=(0, 2)) if moved.dim() > 2 else moved.amax(dim=0)  # (j,)
        d, t = per_t.max(dim=0)
        if float(d) > worst:
            worst, where = float(d), (int(t), j)
    return LeakReport(worst > atol, worst, where if worst > atol else None)


def find_future_leak_grad(
    fn: Callable[[Tensor], Tensor], x: Tensor, atol: float = 0.0
) -> LeakReport:
    """Gradient probe on a float input (B, T, C): d out[:, t] / d x[:, j] must be 0 for j > t."""
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)  # (B, T, ...)
    T = x.size(1)
    worst, where = 0.0, None
    for t in range(T - 1):
        (g,) = torch.autograd.grad(out[:, t].sum(), x, retain_graph=True)
        future = g[:, t + 1 :].abs()  # (B, T - t - 1, C) gradient reaching later inputs
        per_j = future.flatten(2).amax(dim=(0, 2))
        d, j = per_j.max(dim=0)
        if float(d) > worst:
            worst, where = float(d), (t, t + 1 + int(j))
    return LeakReport(worst > atol, worst, where if worst > atol else None)


def _perturb_float(x: Tensor, j: int) -> Tensor:
    y = x.clone()
    y[:, j] = torch.randn_like(y[:, j]) * (x.std() + 1)
    return y


def _perturb_ids(x: Tensor, j: int) -> Tensor:
    y = x.clone()
    y[:, j] = y[:, j] + 1 if int(y[:, j].max()) == 0 else torch.zeros_like(y[:, j])
    return y


PROBE_TARGET = 12  # the decoder input an encoder-decoder's probes feed, in tokens


class DecoderProbes:
    """What ``attnlab check`` needs from an encoder-decoder (mixed into both models).

    Each probe runs the decoder on target ids ``ids`` (B, T) over one fixed random source, so
    perturbing a target token changes nothing but the decoder's input:
    - ``probe_forward``: decoder logits (B, T, V), causal in the target;
    - ``cache_difference``: incremental decoding (its decoder's ``start``/``step``) vs the
      full pass;
    - ``padding_difference``: padding the source changes no decoder output.
    """

    causal = True  # the decoder's self-attention
    uses_padding = True
    pad_id = 0  # <pad>

    def _probe_source(self, batch: int, length: int = 7) -> Tensor:
        g = torch.Generator().manual_seed(1234)
        src = torch.randint(EOS + 1, self.config.src_vocab_size, (batch, length), generator=g)
        src[:, -1] = EOS
        return src.to(next(self.parameters()).device)

    def probe_inputs(self, batch: int = 2, seed: int = 0, length: int = 16) -> Tensor:
        """Random target ids (B, 12) without <pad>, <bos>-first like a decoder input (12
        whatever ``length`` is asked: the probes' source is 7 tokens)."""
        length = PROBE_TARGET
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(EOS + 1, self.config.tgt_vocab_size, (batch, length), generator=g)
        ids[:, 0] = BOS
        return ids.to(next(self.parameters()).device)

    def probe_forward(self, ids: Tensor) -> Tensor:
        return self(self._probe_source(ids.size(0)), ids)

    @torch.no_grad()
    def cache_difference(self, ids: Tensor) -> float:
        src = self._probe_source(ids.size(0))
        full = torch.log_softmax(self(src, ids).float(), dim=-1)  # (B, T, V)
        dec = self.decoded_by(self)  # its declared decoder (attnlab.decoding.Decoder)
        state = dec.start(src, ids.size(1))
        steps = [dec.step(state, ids[:, t]) for t in range(ids.size(1))]  # T x (B, V)
        return float((torch.stack(steps, dim=1) - full).abs().max())

    @torch.no_grad()
    def padding_difference(self, ids: Tensor, n_pad: int = 3) -> float:
        src = self._probe_source(ids.size(0))
        padded = torch.cat([src, src.new_full((src.size(0), n_pad), self.pad_id)], dim=1)
        return float((self(padded, ids) - self(src, ids)).abs().max())
