"""One recording mechanism shared by every model.

Each interesting activation passes through a ``Hook``: an identity module that, while a
recording is active, stores what passes through it under its module path with the ``hook_``
prefix dropped (``blocks.0.attn.hook_weights`` is recorded as ``blocks.0.attn.weights``).
A hook can also edit the tensor (``edit=`` in ``record``), for ablation and patching.

    with record(model) as cache:
        logits = model(ids)
    cache["blocks.0.attn.weights"]      # (B, H, T, S)

Hooks are attached only inside the ``with`` block and always removed after it. The cache holds
names and tensors (detached), never the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

from torch import Tensor, nn


class Hook(nn.Module):
    """Identity point that records (and optionally edits) the tensor passing through it."""

    def __init__(self):
        super().__init__()
        self.name: str | None = None
        self.store: dict | None = None
        self.edit: Callable[[Tensor, str], Tensor] | None = None

    @property
    def active(self) -> bool:
        return self.store is not None or self.edit is not None

    def __call__(self, x: Tensor) -> Tensor:
        # Fast path: a model calls ~20 hooks per block on every forward, and nn.Module.__call__
        # costs about a microsecond each, which is noticeable when decoding one token at a time.
        # While nothing records or edits, and no torch hook is registered on this module, a
        # Hook is returned straight through. (Global torch module hooks do not see Hooks.)
        idle = self.store is None and self.edit is None
        if idle and not (self._forward_hooks or self._forward_pre_hooks):
            return x
        return super().__call__(x)

    def forward(self, x: Tensor) -> Tensor:
        if self.edit is not None:
            x = self.edit(x, self.name)
        if self.store is not None:
            self.store[self.name] = x.detach()
        return x


class ActivationCache(dict):
    """Recorded activations by name. A plain dict with a few helpers for browsing."""

    def layer(self, i: int, prefix: str = "blocks") -> dict:
        head = f"{prefix}.{i}."
        return {k[len(head) :]: v for k, v in self.items() if k.startswith(head)}

    def names(self, pattern: str = "") -> list[str]:
        return [k for k in self if pattern in k]

    def __repr__(self) -> str:
        rows = [f"  {k}: {tuple(v.shape)}" for k, v in self.items()]
        return "ActivationCache(\n" + "\n".join(rows) + "\n)"


def hook_points(model: nn.Module) -> dict[str, Hook]:
    """Every hook in ``model``, keyed by the name it records under."""
    out = {}
    for path, mod in model.named_modules():
        if isinstance(mod, Hook):
            head, _, leaf = path.rpartition(".")
            leaf = leaf.removeprefix("hook_")
            out[f"{head}.{leaf}" if head else leaf] = mod
    return out


@contextmanager
def record(
    model: nn.Module,
    names: Iterable[str] | None = None,
    edit: dict[str, Callable[[Tensor, str], Tensor]] | None = None,
):
    """Record activations of ``model`` (all, or only ``names``) inside the ``with`` block.

    Recording attention weights makes attention take the step-by-step reference path, so the
    outputs are the same as without recording (to float rounding).
    """
    cache = ActivationCache()
    points = hook_points(model)
    wanted = set(points) if names is None else set(names)
    unknown = wanted - set(points)
    if unknown:
        raise KeyError(f"no hook named {sorted(unknown)[0]!r}; known: {', '.join(sorted(points))}")
    edit = edit or {}
    try:
        for name, hook in points.items():
            hook.name = name
            if name in wanted:
                hook.store = cache
            if name in edit:
                hook.edit = edit[name]
        yield cache
    finally:
        for hook in points.values():
            hook.store = None
            hook.edit = None
