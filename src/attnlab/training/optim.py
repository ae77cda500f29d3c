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
    wsd        warmup, stable, decay: lr (t+1)/(w+1) for t < w, then lr until the cool-down's
               k = cooldown_iters last steps, then linear from lr to min_lr at max_iters (the
               GPU speedrun's schedule: a long constant stage, then a straight line down)

``optimizer="muon"`` splits the parameters by their role (``param_roles``): the 2-D weights of
the linear layers inside the transformer blocks (attention's W_Q, W_K, W_V, W_O; the
feed-forward's matrices) are updated by Muon (``torch.optim.Muon``: momentum, then the update
orthogonalised by Newton-Schulz iterations), everything else by AdamW with a learning rate of
its own: the embeddings (``embed_lr``), the output head (``head_lr``) and the vectors and
scalars (norm gains, biases, mixing weights; ``lr``). Each group's rate follows the schedule in
proportion to its peak (``set_lr``). Both optimizers are torch's; ``SplitOptimizer`` steps them
as one and saves their state as one state dict (``optimizer.safetensors``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.blocks import Block
from attnlab.config import ConfigError
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
    if c.schedule == "wsd":  # constant, then a straight line to min_lr over the cool-down
        start = max(w, decay - c.cooldown_iters)
        if step < start:
            return c.lr
        if step >= decay:
            return c.min_lr
        return c.lr + (c.min_lr - c.lr) * (step - start) / (decay - start)
    if step > decay or decay <= w:
        return c.min_lr
    r = (step - w) / (decay - w)
    return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def set_lr(optimizer: torch.optim.Optimizer, step: int, c: TrainConfig) -> None:
    """Every group's learning rate at ``step``: the schedule's, times the group's ``lr_scale``
    (its own peak over ``c.lr``: Muon's, the embeddings', the head's)."""
    lr = lr_at(step, c)
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)


def _adamw(groups: list[dict], **kw) -> torch.optim.AdamW:
    try:
        return torch.optim.AdamW(groups, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, foreach=True, **kw)


def make_optimizer(model: nn.Module, c: TrainConfig) -> torch.optim.Optimizer | SplitOptimizer:
    """``c.optimizer``: AdamW over the trainable parameters (tied weights once), decay on
    matrices only; or Muon for the blocks' matrices beside AdamW for the rest
    (``muon_optimizer``)."""
    if c.optimizer == "muon":
        return muon_optimizer(model, c)
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": c.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return _adamw(groups, lr=c.lr, betas=(c.beta1, c.beta2))


# ---------------------------------------------------------------------------------------------
# Muon for the hidden matrices, AdamW for the rest
# ---------------------------------------------------------------------------------------------

ROLES = ("hidden", "embed", "head", "scalar")


def param_roles(model: nn.Module) -> dict[str, str]:
    """Each trainable parameter's name -> its role in the optimizer split:
    hidden  the weight of a linear layer inside a transformer block (``attnlab.blocks.Block``):
            attention's projections, the feed-forward's matrices
    head    the weight of any other layer that multiplies its input (linear, convolution): the
            output head, a classifier, a patch projection
    embed   a table that is looked up (token, position, value embeddings; a head tied to one)
    scalar  vectors and scalars: biases, norm gains, mixing weights
    A tied weight is named once, by the first module that holds it."""
    roles: dict[str, str] = {}
    seen: set[int] = set()
    inside: set[str] = set()  # linear layers within a Block
    for name, m in model.named_modules():
        if isinstance(m, Block):
            inside.update(f"{name}.{n}" if n else name for n, sub in m.named_modules()
                          if isinstance(sub, nn.Linear))  # fmt: skip
    for mod_name, m in model.named_modules():
        for p_name, p in m.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if p.dim() < 2:
                roles[full] = "scalar"
            elif mod_name in inside and p_name == "weight":
                roles[full] = "hidden"
            elif isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
                roles[full] = "head"
            else:
                roles[full] = "embed"
    return roles


def newton_schulz(G: Tensor, steps: int, coefficients: tuple[float, float, float],
                  eps: float = 1e-7) -> Tensor:  # fmt: skip
    """The matrix nearest ``G`` (m, n) with all singular values ~1 (U S' V^T, S' in about
    [0.5, 1.5] where G = U S V^T): X = G / |G|_F, then ``steps`` times
    X <- a X + (b A + c A^2) X with A = X X^T (on the wider side, so A is the smaller square).

    The iteration ``torch.optim.Muon`` runs, with its coefficients, in G's own dtype: torch
    casts to bfloat16, which a CPU without bfloat16 arithmetic computes ~10x slower than
    float32 (a Muon step of the baby GPT took 1.07 s, against 0.06 s for a whole training step)."""
    a, b, c = coefficients
    X = G.mT if G.size(0) > G.size(1) else G  # (m, n) with m <= n
    X = X / X.norm().clamp(min=eps)
    for _ in range(steps):
        A = X @ X.mT  # (m, m)
        X = torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)  # (m, n)
    return X.mT if G.size(0) > G.size(1) else X


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` (its parameter groups, state and checks) with the Newton-Schulz
    iteration in float32 (``newton_schulz``), for devices without fast bfloat16: the CPU.

    Per weight W with gradient g: B <- mu B + (1 - mu) g (torch's lerp form of momentum);
    U = NS(g + mu (B - g)) with Nesterov (else NS(B)); W <- W (1 - lr wd) - lr' U, with
    lr' = lr sqrt(max(1, rows / cols)) (torch's default adjustment, Keller Jordan's). The state
    is torch's (``momentum_buffer``), so a checkpoint reads into either class."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
            for p, g, buf in zip(params, grads, bufs):
                buf.lerp_(g, 1 - mu)
                update = g.lerp(buf, mu) if group["nesterov"] else buf
                update = newton_schulz(update.float(), group["ns_steps"],
                                       tuple(group["ns_coefficients"]), group["eps"])  # fmt: skip
                p.mul_(1 - lr * wd)
                p.add_(update.to(p.dtype), alpha=-lr * math.sqrt(max(1.0, p.size(0) / p.size(1))))
        return loss


def muon_class(device: torch.device) -> type[torch.optim.Muon]:
    """torch's own Muon on a GPU (bfloat16 Newton-Schulz), attnlab's float32 one elsewhere."""
    return torch.optim.Muon if device.type == "cuda" else Muon


def muon_optimizer(model: nn.Module, c: TrainConfig) -> SplitOptimizer:
    """Muon for the ``hidden`` matrices (peak ``c.muon_lr``, decay ``c.weight_decay``), AdamW
    (betas ``c.beta1``, ``c.beta2``, no decay) for the embeddings (``c.embed_lr``), the head
    (``c.head_lr``) and the scalars (``c.lr``). Refuses a model with no hidden matrices."""
    roles = param_roles(model)
    named = dict(model.named_parameters())
    by_role = {r: [named[n] for n, role in roles.items() if role == r] for r in ROLES}
    if not by_role["hidden"]:
        raise ConfigError(
            "optimizer muon updates the matrices of transformer blocks, and this "
            f"{type(model).__name__} has none: train it with optimizer adamw"
        )
    device = by_role["hidden"][0].device
    scale = lambda lr: (lr if lr is not None else c.lr) / c.lr  # noqa: E731
    muon = muon_class(device)(
        [{"params": by_role["hidden"], "lr_scale": c.muon_lr / c.lr, "role": "hidden"}],
        lr=c.muon_lr, momentum=c.muon_momentum, weight_decay=c.weight_decay,
    )  # fmt: skip
    adam_groups = [
        {"params": by_role[r], "lr_scale": scale(lr), "role": r, "weight_decay": 0.0}
        for r, lr in (("embed", c.embed_lr), ("head", c.head_lr), ("scalar", None))
        if by_role[r]
    ]
    parts = [muon]
    if adam_groups:
        parts.append(_adamw(adam_groups, lr=c.lr, betas=(c.beta1, c.beta2)))
    return SplitOptimizer(parts)


class SplitOptimizer:
    """Several torch optimizers over disjoint parameters, stepped as one: ``param_groups`` is
    theirs in order, and ``state_dict`` numbers the parameters across them as one optimizer
    would (so a checkpoint holds one state dict, and ``load_state_dict`` gives each its part)."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts
        self.defaults: dict = {}  # no fused kernel that skips a non-finite step on its own

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.parts for g in opt.param_groups]

    @property
    def state(self) -> dict:
        return {p: st for opt in self.parts for p, st in opt.state.items()}

    def step(self, closure=None):
        for opt in self.parts:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        state, groups, offset = {}, [], 0
        for opt in self.parts:
            sd = opt.state_dict()
            state.update({i + offset: st for i, st in sd["state"].items()})
            for g in sd["param_groups"]:
                groups.append({**g, "params": [i + offset for i in g["params"]]})
            offset += sum(len(g["params"]) for g in opt.param_groups)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        groups, offset = list(sd["param_groups"]), 0
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{len(groups)} parameter groups saved, {len(self.param_groups)} here")
        for opt in self.parts:
            mine, groups = groups[: len(opt.param_groups)], groups[len(opt.param_groups) :]
            n = sum(len(g["params"]) for g in opt.param_groups)
            ids = range(offset, offset + n)
            opt.load_state_dict({
                "state": {i - offset: sd["state"][i] for i in ids if i in sd["state"]},
                "param_groups": [{**g, "params": [i - offset for i in g["params"]]} for g in mine],
            })  # fmt: skip
            offset += n


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
    for g in groups:  # JSON gave lists where torch keeps tuples
        for key in ("betas", "ns_coefficients"):
            if key in g:
                g[key] = tuple(g[key])
    return {"state": state, "param_groups": groups}
