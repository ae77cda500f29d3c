"""One recording mechanism shared by every model.

Each interesting activation passes through a ``Hook``: an identity module that, while a
recording is active, stores what passes through it under its module path with the ``hook_``
prefix dropped (``blocks.0.attn.hook_weights`` is recorded as ``blocks.0.attn.weights``).
A hook can also edit the tensor (``edit=`` in ``record``), for ablation and patching.

    with record(model) as cache:
        logits = model(ids)
    cache["blocks.0.attn.weights"]      # (B, H, T, S)

Hooks are attached only inside the ``with`` block and always removed after it; ``record``
blocks nest (an inner one records and edits on top of the outer one's edits and restores them
when it ends). The cache holds names and tensors (detached), never the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

from torch import Tensor, nn

_PLAIN = frozenset({"name", "store", "edit", "read_only"})


class Hook(nn.Module):
    """Identity point that records (and optionally edits) the tensor passing through it.

    ``read_only`` marks a point whose returned value the model does not use (it records a
    tensor after what depends on it was computed): ``record`` refuses an edit there, because it
    could never take effect.
    """

    def __init__(self, read_only: bool = False):
        super().__init__()
        self.read_only = read_only
        self.name: str | None = None
        self.store: dict | None = None
        self.edit: Callable[[Tensor, str], Tensor] | None = None

    def __setattr__(self, key: str, value) -> None:
        # name, store, edit and read_only are plain attributes, set for every hook of the model
        # whenever a recording starts and ends: past nn.Module's checks (which look for
        # parameters and submodules), that costs a few microseconds each.
        if key in _PLAIN:
            object.__setattr__(self, key, value)
        else:
            super().__setattr__(key, value)

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

    ``edit`` maps hook names to functions ``f(tensor, name) -> tensor`` whose result replaces
    the activation. An unknown name, in ``names`` or ``edit``, is a KeyError, and so is an edit
    of a read-only point: an edit never silently does nothing.

    Recording attention weights makes attention take the step-by-step reference path, so the
    outputs are the same as without recording (to float rounding).
    """
    cache = ActivationCache()
    points = hook_points(model)
    wanted = set(points) if names is None else set(names)
    edit = edit or {}
    unknown = (wanted | set(edit)) - set(points)
    if unknown:
        raise KeyError(f"no hook named {sorted(unknown)[0]!r}; known: {', '.join(sorted(points))}")
    fixed = sorted(n for n in edit if points[n].read_only)
    if fixed:
        raise KeyError(f"{fixed[0]!r} is recorded only: the model does not read it back, so an "
                       "edit there could not take effect")  # fmt: skip
    before = {name: (hook.store, hook.edit) for name, hook in points.items()}
    try:
        for name, hook in points.items():
            hook.name = name
            if name in wanted:
                hook.store = cache
            if name in edit:  # inside an enclosing edit of the same point, apply both in turn
                hook.edit = _then(hook.edit, edit[name]) if hook.edit else edit[name]
        yield cache
    finally:  # what an enclosing ``record`` had set up is restored, not cleared
        for name, hook in points.items():
            hook.store, hook.edit = before[name]


def _then(first: Callable, second: Callable) -> Callable:
    return lambda x, name: second(first(x, name), name)
