"""The optimizer and the learning-rate schedules, and the optimizer's state as tensors + JSON.

AdamW with two groups: weight decay on matrices (linear and embedding weights), none on vectors
(biases, LayerNorm gains); the fused kernel where torch has one, else foreach.

Schedules (``TrainConfig.schedule``), t the step from 0, w = warmup_iters, d = lr_decay_iters:
    cosine     lr (t+1)/(w+1) for t < w; then min_lr + (lr - min_lr) (1 + cos(pi r)) / 2,
               r = (t - w) / (d - w); min_lr after d
    noam       lr min((t+1)/w, sqrt(w/(t+1))): linear warmup to lr at step w, then 1/sqrt(t)
               decay (Vaswani et al., 2017; the paper's own constants are
               lr = d_model^-0.5 w^-0.5, e.g. 7e-4 for d_model 512 and w = 4000)
    constant   lr (t+1)/(w+1) for t < w, then lr
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.rundir import RunError
from attnlab.train_config import TrainConfig


def lr_at(step: int, c: TrainConfig) -> float:
    """The learning rate of step ``step`` (from 0) under ``c.schedule``."""
    w = c.warmup_iters
    if c.schedule == "noam":
        t = step + 1
        return c.lr * min(t / w, math.sqrt(w / t))
    if step < w:
        return c.lr * (step + 1) / (w + 1)
    if c.schedule == "constant":
        return c.lr
    decay = c.lr_decay_iters
    if step > decay or decay <= w:
        return c.min_lr
    r = (step - w) / (decay - w)
    return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def make_optimizer(model: nn.Module, c: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (tied weights once), decay on matrices only."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": c.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kw = dict(lr=c.lr, betas=(c.beta1, c.beta2))
    try:
        return torch.optim.AdamW(groups, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, foreach=True, **kw)


def optimizer_tensors(
    opt: torch.optim.Optimizer, sd: dict | None = None
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Optimizer state_dict (``sd``, or ``opt``'s own) split into tensors
    (``state.<param>.<key>``) and JSON (the rest)."""
    sd = opt.state_dict() if sd is None else sd
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val):
                tensors[f"state.{idx}.{key}"] = val
            else:
                scalars[f"{idx}.{key}"] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def check_optimizer_tensors(
    opt: torch.optim.Optimizer, tensors: dict[str, Tensor], source: str
) -> None:
    """Every ``state.<param>.<key>`` names a parameter of ``opt``; moment buffers have its shape.

    ``torch.optim.Optimizer.load_state_dict`` checks neither, and casts silently."""
    params = [p for g in opt.param_groups for p in g["params"]]
    for name, t in tensors.items():
        parts = name.split(".", 2)
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise RunError(f"{source}: unexpected tensor {name!r}")
        idx, key = int(parts[1]), parts[2]
        if idx >= len(params):
            raise RunError(f"{source}: state for parameter {idx}, but the model has {len(params)}")
        if key != "step" and tuple(t.shape) != tuple(params[idx].shape):
            raise RunError(
                f"{source}: {name} has shape {tuple(t.shape)}, the parameter it belongs to "
                f"{tuple(params[idx].shape)}"
            )
        if not t.is_floating_point():
            raise RunError(f"{source}: {name} has dtype {t.dtype}, expected a float")


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict) -> None:
    """The inverse of ``optimizer_tensors``."""
    opt.load_state_dict(optimizer_state_dict(tensors, meta))


def optimizer_state_dict(tensors: dict[str, Tensor], meta: dict) -> dict:
    """``torch.optim``'s state_dict from what ``optimizer_tensors`` made of it."""
    state: dict[int, dict[str, Any]] = {}
    for name, t in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = t
    for name, val in meta.get("scalars", {}).items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = val
    groups = meta["param_groups"]
    for g in groups:
        g["betas"] = tuple(g["betas"])
    return {"state": state, "param_groups": groups}
