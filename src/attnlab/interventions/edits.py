"""Checked edits: hook edits that report what they changed and fail loudly when they cannot act.

``attnlab.hooks.record(model, edit=...)`` replaces an activation by what an edit function
returns. ``edited`` wraps it with the checks an intervention needs to be trusted:

- an unknown hook name, or a read-only one, is refused before anything runs;
- an edit must return the shape it was given (else an InterventionError names both shapes);
- an edit that never fired during the ``with`` block (the forward pass did not go through that
  point: a decoder hook while only encoding, a head layer of another stack) is an error;
- ``EditLog`` counts, per hook, the calls and the values the edit actually changed.

``ablate`` builds on it: the context manager any evaluation can run inside.

    with ablate(model, heads=[(1, 2)], mode="zero") as log:
        loss = evaluate(model, ...)
    log.changed            # values the ablation changed, over every forward pass
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab import hooks
from attnlab.interventions.subjects import HeadRef, InterventionError, Subject

MODES = ("zero", "mean", "resample")


@dataclass
class EditLog:
    """Per hook name: forward calls through the edit, values changed, values seen."""

    calls: dict[str, int] = field(default_factory=dict)
    changed_by: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> int:
        return sum(self.changed_by.values())

    def describe(self) -> str:
        parts = [f"{n}: {self.changed_by[n]:,} of {self.seen[n]:,} values changed "
                 f"({self.calls[n]} call{'s' if self.calls[n] != 1 else ''})"
                 for n in self.calls]  # fmt: skip
        return "; ".join(parts) or "no edit"

    def to_dict(self) -> dict:
        return {n: {"calls": self.calls[n], "changed": self.changed_by[n], "values": self.seen[n]}
                for n in self.calls}  # fmt: skip


def _checked(name: str, fn: Callable, log: EditLog) -> Callable:
    def run(x: Tensor, hook_name: str) -> Tensor:
        y = fn(x, hook_name)
        if not isinstance(y, Tensor) or y.shape != x.shape:
            got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
            raise InterventionError(f"the edit of {name!r} returned {got} for an activation of "
                                    f"shape {tuple(x.shape)}")  # fmt: skip
        log.calls[name] = log.calls.get(name, 0) + 1
        log.changed_by[name] = log.changed_by.get(name, 0) + int((y != x).sum())
        log.seen[name] = log.seen.get(name, 0) + x.numel()
        return y

    return run


@contextmanager
def edited(model: nn.Module, edits: dict[str, Callable], names=()):
    """Run ``model`` with ``edits`` (hook name -> f(x, name) -> x') inside the block; also
    record ``names``. Yields (cache, EditLog). Raises InterventionError for an unknown or
    read-only name, a wrong shape, or an edit that never fired."""
    points = hooks.hook_points(model)
    for name in [*edits, *names]:
        if name not in points:
            near = [p for p in points if p.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]][:3]
            hint = f" (this model has e.g. {', '.join(near)})" if near else ""
            raise InterventionError(f"no hook named {name!r} in this model{hint}")
        if name in edits and points[name].read_only:
            raise InterventionError(f"{name!r} is recorded only: the model has already used it "
                                    "when it is recorded, so an edit there cannot take effect")  # fmt: skip
    log = EditLog()
    wrapped = {n: _checked(n, fn, log) for n, fn in edits.items()}
    failed = False
    try:
        with hooks.record(model, names=list(names), edit=wrapped) as cache:
            yield cache, log
    except BaseException:
        failed = True
        raise
    finally:
        if not failed:
            silent = [n for n in edits if n not in log.calls]
            if silent:
                raise InterventionError(
                    f"the edit of {silent[0]!r} never fired: no forward pass inside the block "
                    "went through that point, so it changed nothing"
                )


# ---------------------------------------------------------------------------------------------
# Ablation: replace part of an activation by zero, its mean, or its value on another input
# ---------------------------------------------------------------------------------------------


def part_mask(x: Tensor, heads=None, positions=None, neurons=None) -> Tensor:
    """Boolean mask (shape of x) of the ablated part: heads on dim 1 of per-head activations
    (B, H, T, D), positions on the token dim (-2), neurons on the last dim; None = all."""
    parts: list = [None] * x.dim()
    if heads is not None:
        if x.dim() != 4:
            raise InterventionError(f"heads can be picked only in per-head activations "
                                    f"(B, H, T, D); this one is {tuple(x.shape)}")  # fmt: skip
        parts[1] = _checked_list(heads, x.size(1), "head")
    if positions is not None:
        if x.dim() < 3:
            raise InterventionError(f"positions can be picked only in (B, T, C) or (B, H, T, D) "
                                    f"activations; this one is {tuple(x.shape)}")  # fmt: skip
        parts[-2] = _checked_list(positions, x.size(-2), "position")
    if neurons is not None:
        parts[-1] = _checked_list(neurons, x.size(-1), "neuron")
    mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    idx = []
    for d, v in enumerate(parts):  # an outer product of the picked indices, one per dim
        t = torch.arange(x.size(d)) if v is None else torch.tensor(v, dtype=torch.long)
        shape = [1] * x.dim()
        shape[d] = -1
        idx.append(t.view(shape).to(x.device))
    mask[tuple(idx)] = True
    return mask


def _checked_list(values, size: int, what: str) -> list[int]:
    out = []
    for v in values:
        v = int(v)
        if not -size <= v < size:
            raise InterventionError(f"no {what} {v}: this activation has {what}s 0..{size - 1}")
        out.append(v % size)
    return out


def ablation_edit(
    heads=None,
    positions=None,
    neurons=None,
    mode: str = "zero",
    reference: Tensor | None = None,
) -> Callable:
    """An edit f(x, name) that ablates part of x (see ``part_mask``).

    zero      the part becomes 0.
    mean      the part becomes its mean over the reference's batch and positions (the
              reference activation (B', ..., T', D)), or over x's own when none is given.
    resample  the part becomes the reference's value at the same positions (the reference
              batch cycled over x's batch); without one, x's batch rolled by one row, so every
              row gets another input's value (needs a batch of at least 2).
    """
    if mode not in MODES:
        raise InterventionError(f"unknown ablation mode {mode!r}; choose from {', '.join(MODES)}")

    def edit(x: Tensor, name: str) -> Tensor:
        mask = part_mask(x, heads, positions, neurons)
        if mode == "zero":
            return x.masked_fill(mask, 0.0)
        ref = x if reference is None else reference.to(x.device, x.dtype)
        if mode == "mean":
            dims = (0, -2)  # over the batch and the positions, per head and channel
            value = ref.mean(dim=dims, keepdim=True).expand_as(x)
        else:
            if reference is None:
                if x.size(0) < 2:
                    raise InterventionError("resample ablation of one input needs a reference "
                                            "input to take the values from")  # fmt: skip
                value = x.roll(1, dims=0)
            else:
                if ref.shape[1:-2] != x.shape[1:-2] or ref.size(-1) != x.size(-1):
                    raise InterventionError(f"the reference activation of {name!r} is "
                                            f"{tuple(ref.shape)}, the input's {tuple(x.shape)}")  # fmt: skip
                if ref.size(-2) < x.size(-2):
                    raise InterventionError(f"the reference is {ref.size(-2)} positions long, "
                                            f"the input {x.size(-2)}: resampling needs a "
                                            "reference at least as long")  # fmt: skip
                rows = torch.arange(x.size(0), device=x.device) % ref.size(0)
                value = ref[rows][..., : x.size(-2), :]
        return torch.where(mask, value, x)

    return edit


def head_edits(
    subject: Subject,
    heads: list[HeadRef],
    mode: str = "zero",
    positions=None,
    reference: dict[str, Tensor] | None = None,
) -> dict[str, Callable]:
    """One ablation edit per attention layer, on its per-head outputs ``z`` (B, H, T, d_v)."""
    by_path: dict[str, list[int]] = {}
    for ref in heads:
        by_path.setdefault(ref.group.path + ".z", []).append(ref.head)
    return {name: ablation_edit(hs, positions, None, mode, (reference or {}).get(name))
            for name, hs in by_path.items()}  # fmt: skip


def clean_means(model: nn.Module, evaluate: Callable, names: list[str]) -> tuple:
    """``evaluate()`` intact, keeping the mean of each of ``names`` (per-head outputs
    (B, H, T, D)) over the batch and positions of every forward pass, in order: the means that
    mean ablation replays (``replayed_means``). -> (what evaluate returned, {name: [(1, H, 1,
    D) per pass]})."""
    means: dict[str, list[Tensor]] = {n: [] for n in names}

    def keep(x: Tensor, name: str) -> Tensor:
        means[name].append(x.mean(dim=(0, -2), keepdim=True))
        return x

    with edited(model, {n: keep for n in names}):
        return evaluate(), means


def replayed_means(heads: list[HeadRef], means: dict[str, list[Tensor]]) -> dict[str, Callable]:
    """Mean-ablation edits of ``heads`` whose n-th forward pass takes the means of the intact
    run's n-th (``clean_means``), whatever else is ablated upstream."""
    by_path: dict[str, list[int]] = {}
    for ref in heads:
        by_path.setdefault(ref.group.path + ".z", []).append(ref.head)

    def edit_of(name: str, hs: list[int]):
        passes = iter(means[name])

        def edit(x: Tensor, n: str) -> Tensor:
            clean = next(passes, None)
            if clean is None:
                raise InterventionError(f"{n}: the evaluation ran more forward passes than its "
                                        "intact run, so there is no clean mean to replay")  # fmt: skip
            return ablation_edit(hs, None, None, "mean", clean)(x, n)

        return edit

    return {name: edit_of(name, hs) for name, hs in by_path.items()}


@contextmanager
def ablate(
    model: nn.Module,
    heads=None,
    *,
    site: str | None = None,
    positions=None,
    neurons=None,
    mode: str = "zero",
    reference: dict[str, Tensor] | Tensor | None = None,
):
    """Inside the block, every forward pass of ``model`` runs with ``heads`` ablated (a list
    of (layer, head) pairs, or specs such as "1.2" or "decoder.0.3"; see
    ``Subject.parse_heads``), or with the activation ``site`` (a hook name) ablated, optionally
    only at ``positions`` / ``neurons``. ``mode``: zero, mean or resample (``ablation_edit``);
    ``reference`` holds recorded reference activations by hook name (or one tensor for
    ``site``). Yields the EditLog; an ablation that never fired raises InterventionError."""
    if (heads is None) == (site is None):
        raise InterventionError("ablate needs heads or a site (a hook name), not both")
    if mode not in MODES:
        raise InterventionError(f"unknown ablation mode {mode!r}; choose from {', '.join(MODES)}")
    if heads is not None:
        refs = Subject(model).parse_heads(heads)
        ref_map = reference if isinstance(reference, dict) else None
        edits = head_edits(Subject(model), refs, mode, positions, ref_map)
    else:
        ref = reference.get(site) if isinstance(reference, dict) else reference
        edits = {site: ablation_edit(None, positions, neurons, mode, ref)}
    with edited(model, edits) as (_, log):
        yield log
