"""How big a training run is, before it starts: memory and work per step, and a warning line
when a size will be huge for the machine or slow on a CPU.

Memory, in float32 bytes (an estimate, not a measurement):
    weights, gradients and AdamW's two moments   16 P            (P parameters)
    activations kept for the backward pass       B T (68 C L + 12 V)
        per layer about 68 bytes per token and channel with fused attention (no T x T score
        matrix is kept), and the logits, their softmax and gradient: 12 bytes per vocabulary
        entry per token.
Work: about 6 P B T floating-point operations per optimizer step (forward 2, backward 4).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

GIB = 1024**3
SLOW_ON_CPU_FLOP = 1e12  # per step: tens of seconds on a CPU core or two
HUGE_FRACTION = 0.8  # of the device's memory


@dataclass(frozen=True)
class RunSize:
    parameters: int
    batch: int  # examples per optimizer step (batch size x gradient accumulation)
    tokens: int  # positions per example
    state_bytes: int  # weights, gradients, AdamW moments
    activation_bytes: int  # one micro-batch's activations
    flop_per_step: float

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def positions(config) -> int:
    """Tokens one example holds: a GPT's or encoder's block, a seq2seq's longest sequence, a
    ViT's patches (+1 for [CLS])."""
    for name in ("block_size", "max_len"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    image, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if isinstance(image, int) and isinstance(patch, int) and patch > 0:
        return (image // patch) ** 2 + 1
    return 1


def run_size(model: nn.Module, batch_size: int, grad_accum: int = 1) -> RunSize:
    """The estimates above for ``model`` trained on micro-batches of ``batch_size``."""
    cfg = getattr(model, "config", None)
    p = sum(t.numel() for t in model.parameters())
    t = positions(cfg)
    width = int(getattr(cfg, "d_model", 0) or 0)
    layers = int(getattr(cfg, "n_layer", 1) or 1)
    vocab = int(getattr(cfg, "vocab_size", 0) or 0)
    acts = batch_size * t * (68 * width * layers + 12 * vocab)
    return RunSize(
        p, batch_size * grad_accum, t, 16 * p, acts, 6.0 * p * batch_size * grad_accum * t
    )


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory the device has (a GPU's own; the CPU's: the machine's RAM)."""
    try:
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).total_memory
        if device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, RuntimeError, AttributeError):
        return None
    return None


def size_warnings(model: nn.Module, config, task, device: torch.device) -> list[str]:
    """One line when the run will be huge for ``device`` or slow on a CPU, with its memory
    estimate; none otherwise. ``config`` is the TrainConfig."""
    s = run_size(model, config.batch_size, config.grad_accum)
    have = device_memory(device)
    huge = have is not None and s.total_bytes > HUGE_FRACTION * have
    slow = device.type == "cpu" and s.flop_per_step > SLOW_ON_CPU_FLOP
    if not (huge or slow):
        return []
    machine = "this machine" if device.type == "cpu" else str(device)
    where = f" of the {have / GIB:.0f} GiB {machine} has" if have else ""
    what = []
    if huge:
        what.append(f"more memory than {machine} has")
    if slow:
        what.append(f"about {s.flop_per_step / 1e12:.1f} TFLOP per step, slow on a CPU")
    return [
        f"this run needs {' and '.join(what)}: {s.parameters / 1e6:.1f}M parameters, batches "
        f"of {s.batch} x {s.tokens} tokens; about {s.total_bytes / GIB:.1f} GiB{where} "
        f"({s.state_bytes / GIB:.1f} GiB weights, gradients and AdamW state, "
        f"{s.activation_bytes / GIB:.1f} GiB activations). A smaller --preset, --block-size "
        "or --batch-size is faster"
    ]
