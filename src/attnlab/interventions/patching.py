"""Activation patching: which activations carry the difference between two inputs?

Run the model on a clean input and on a corrupted one that differs in a detail, and measure a
metric at one output position: the logit of the target token, or the logit difference
target - foil. Then rerun the corrupted input with ONE activation copied from the clean run,

    recovered = (m(patched) - m(corrupt)) / (m(clean) - m(corrupt))

so 1 means that activation alone restores the clean answer and 0 that it carries none of it.
``by="position"`` patches the residual stream entering each layer (and leaving the last) at
each position; ``by="head"`` patches each head's output ``z`` at every position.

Attribution patching (Nanda, 2023) approximates every patch at once from one backward pass on
the corrupted run: m(patched) - m(corrupt) ~ (a_clean - a_corrupt) . dm/da. It is reported
beside the exact value with its error, so you can see where the linear guess holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.interventions.edits import edited
from attnlab.interventions.figures import heat, new_figure, save_png
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.render.display import Result, heatmap_html, matrix_table, show_token


@dataclass
class Site:
    """One activation to patch: hook ``name``; ``per_head`` if it is (B, H, T, D)."""

    name: str
    stack: str
    layer: int
    label: str  # row label in tables: L0, L1, final
    per_head: bool = False
    group: str = ""  # grid it is drawn in: a stack, or a kind of heads (decoder, cross)


@dataclass
class PatchRow:
    site: Site
    index: int  # the position (by position) or the head (by head)
    recovered: float
    approx: float  # attribution patching's estimate of the same number

    def to_dict(self, by: str) -> dict:
        d = {"layer": self.site.layer, "position" if by == "position" else "head": self.index,
             "recovered": self.recovered, "approx": self.approx, "site": self.site.name}  # fmt: skip
        if self.site.stack:
            d["stack"] = self.site.stack
        return d


@dataclass
class PatchResult(Result):
    by: str
    metric: str
    clean_text: str
    corrupt_text: str
    position: int
    clean: float
    corrupt: float
    rows: list[PatchRow]
    tokens: dict[str, list[str]]  # per stack: the tokens (clean) at its positions
    notes: list[str] = field(default_factory=list)
    values_changed: int = 0  # over every patched run
    reverse: bool = False  # True: corrupt activations patched into the clean run
    scale: float = 0.0  # the metric's scale: the spread (std) of the clean logits over the vocab
    warning: str | None = None  # clean - corrupt too small against that scale: the table is noise

    @property
    def approx_error(self) -> dict:
        e = np.array([abs(r.approx - r.recovered) for r in self.rows]) if self.rows else np.zeros(1)
        return {"max": float(e.max()), "mean": float(e.mean())}

    def grids(self) -> list[tuple[str, list[str], list[str], np.ndarray, np.ndarray]]:
        """Per stack (and for heads per kind): (title, row labels, column labels, exact, approx)."""
        out = []
        for group in dict.fromkeys(r.site.group for r in self.rows):
            rows = [r for r in self.rows if r.site.group == group]
            stack = rows[0].site.stack
            sites = list(dict.fromkeys(r.site.name for r in rows))
            labels = [next(r.site.label for r in rows if r.site.name == s) for s in sites]
            width = max(r.index for r in rows) + 1
            exact = np.full((len(sites), width), np.nan)
            approx = np.full((len(sites), width), np.nan)
            for r in rows:
                exact[sites.index(r.site.name), r.index] = r.recovered
                approx[sites.index(r.site.name), r.index] = r.approx
            if self.by == "position":
                cols = [show_token(t) for t in self.tokens.get(stack, [])][:width]
            else:
                cols = [f"head {h}" for h in range(width)]
            title = group or ("heads" if self.by == "head" else "residual stream")
            out.append((title, labels, cols, exact, approx))
        return out

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        src, dst = (("corrupt", self.corrupt_text), ("clean", self.clean_text))[
            :: 1 if self.reverse else -1
        ]
        warn = [Text(f"warning: {self.warning}", style="bold red")] if self.warning else []
        parts = [*warn, Text(f"patching {src[0]} {src[1]!r} into {dst[0]} {dst[1]!r}", style="bold"),
                 Text(f"metric {self.metric} at position {self.position}: clean {self.clean:.4f}, "
                      f"corrupt {self.corrupt:.4f}; " + ("recovered = (patched - clean) / "
                      "(corrupt - clean), the share of the corruption the patch carries"
                      if self.reverse else "recovered = (patched - corrupt) / (clean - corrupt)")
                      + f"; {self.values_changed:,} values patched in all\n")]  # fmt: skip
        for title, rows, cols, exact, approx in self.grids():
            parts.append(matrix_table(exact, rows, cols, f"{title}: recovered (exact)",
                                      col_tokens=False))  # fmt: skip
            parts.append(matrix_table(approx, rows, cols, f"{title}: attribution patching "
                                      "(gradient approximation)", col_tokens=False))  # fmt: skip
        e = self.approx_error
        parts.append(Text(f"attribution patching vs exact: max error {e['max']:.4f}, mean "
                          f"{e['mean']:.4f}", style="dim"))  # fmt: skip
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        return {
            "clean": self.clean_text, "corrupt": self.corrupt_text, "by": self.by,
            "metric": self.metric, "position": self.position, "clean_metric": self.clean,
            "corrupt_metric": self.corrupt, "results": [r.to_dict(self.by) for r in self.rows],
            "attribution_error": self.approx_error, "tokens": self.tokens, "notes": self.notes,
            "direction": "corrupt->clean" if self.reverse else "clean->corrupt",
            "values_changed": self.values_changed, "metric_scale": self.scale,
            "warning": self.warning,
        }  # fmt: skip

    def figure(self):
        """Per stack (or kind of head): the exact patching over the attribution patching, one
        above the other, so a long input keeps the picture no wider than it needs."""
        grids = self.grids()
        C = max(g[3].shape[1] for g in grids)
        R = max(g[3].shape[0] for g in grids)
        fig, axes = new_figure(2 * len(grids), 1, squeeze=False,
                               figsize=(min(12.0, max(4.5, 0.32 * C + 2.5)),
                                        max(2.2, 0.3 * R + 1.4) * 2 * len(grids)))  # fmt: skip
        across = "head" if self.by == "head" else "position (its token)"
        for n, (title, rows, cols, exact, approx) in enumerate(grids):
            for ax, m, how in ((axes[2 * n][0], exact, "recovered (exact)"),
                               (axes[2 * n + 1][0], approx, "attribution patching")):  # fmt: skip
                heat(ax, m, rows, cols, f"{title}: {how}", vmax=1.0, xlabel=across,
                     ylabel="layer" if self.by == "head" else "residual stream point",
                     colorbar_label="share of the effect recovered",
                     col_tokens=self.by != "head")  # fmt: skip
        fig.suptitle(f"{self.metric} at position {self.position}", fontsize=9)
        fig.tight_layout()
        return fig

    def save_png(self, path):
        return save_png(self.figure(), path)

    def _repr_html_(self) -> str:
        return "".join(heatmap_html(e, r, c, f"{t}: recovered", diverging=True)
                       for t, r, c, e, _ in self.grids())  # fmt: skip


def sites(subject: Subject, by: str) -> list[Site]:
    """What ``by`` patches: residual stream points (one stack after another, input first) or
    every head group's ``z``. An LSTM's only patchable attention is its context vector."""
    if by not in ("position", "head"):
        raise InterventionError(f"--by must be position or head, got {by!r}")
    if not subject.model.residual:  # no residual stream: only its attention's output
        if not subject.head_groups():
            raise InterventionError("this LSTM has no attention, so no context vector to patch")
        return [Site(g.path + ".z", subject.output_stack, g.layer, g.label(0), True, g.note)
                for g in subject.head_groups()]  # fmt: skip
    if by == "head":
        return [Site(g.path + ".z", g.path.split(".blocks")[0] if g.kind != "attn" else "",
                     g.layer, f"L{g.layer}", True, "" if g.kind == "attn" else f"{g.kind} heads")
                for g in subject.head_groups()]  # fmt: skip
    out = []
    for stack in subject.stacks:
        for pt in subject.points(stack):
            label = "final" if pt.label == "final" else f"L{pt.layer}"
            out.append(Site(pt.name, stack, pt.layer, label, False, stack))
    return out


def _read_where_written(subject: Subject, site: Site) -> bool:
    """True when nothing after ``site`` mixes positions, so a patch elsewhere than the metric
    position changes the metric by exactly 0: the final residual of the stack the logits are
    read from, and an LSTM's context vector (it feeds only its own step's prediction)."""
    return site.label in ("final", "context") and site.stack == subject.output_stack


def metric_fn(target: int, foil: int | None, position: int):
    def m(logits: torch.Tensor) -> torch.Tensor:  # (B, T, V), or (B, V) at the position -> (B,)
        x = (logits[:, position] if logits.dim() == 3 else logits).double()
        return x[:, target] - (x[:, foil] if foil is not None else 0.0)

    return m


def _patch_rows(clean: torch.Tensor, index: list[int], by: str, per_head: bool):
    """Edit for a batch of corrupted rows: row k takes the clean value at ``index[k]`` (a
    position, or with ``by="head"`` a head)."""

    def edit(x: torch.Tensor, name: str) -> torch.Tensor:
        if x.shape[1:] != clean.shape[1:]:
            raise InterventionError(f"clean {name} is {tuple(clean.shape)}, corrupt "
                                    f"{tuple(x.shape)}: the inputs do not line up")  # fmt: skip
        y = x.clone()
        src = clean[0].to(x.dtype)
        for k, i in enumerate(index):
            if per_head and by == "position":
                y[k, :, i] = src[:, i]  # every head's output at position i
            else:
                y[k, i] = src[i]  # position i of (B, T, C), or head i of (B, H, T, D)
        return y

    return edit


CHUNK = 64  # patched copies per forward pass


def patch(
    subject: Subject,
    clean_text: str,
    corrupt_text: str,
    target: str,
    foil: str | None = None,
    by: str = "position",
    position: int | None = None,
    reverse: bool = False,
    positions: list[int] | None = None,
) -> PatchResult:
    """Exact activation patching, with attribution patching beside it (see module doc).
    ``reverse`` patches the corrupt run's activations into the clean run instead (noising):
    recovered is then the share of the corruption one activation carries. ``positions``
    restricts patching by position to those positions (exact patching costs one forward pass
    per layer x position where the two runs differ)."""
    t = subject.token_id(target)
    f = subject.token_id(foil) if foil is not None else None
    clean = subject.prepare(clean_text)
    corrupt = subject.prepare(corrupt_text, decoder_like=clean)
    if reverse:  # the run patched is the clean one; the source of the patches the corrupt one
        clean, corrupt = corrupt, clean
    if [a.shape for a in clean.args] != [a.shape for a in corrupt.args]:
        raise InterventionError(
            f"clean has {len(clean.input_tokens)} tokens and corrupt {len(corrupt.input_tokens)}: "
            "patching needs inputs of the same length that line up position by position"
        )
    pos = subject.metric_position(clean, position, t)
    m = metric_fn(t, f, pos)
    site_list = sites(subject, by)
    names = [s.name for s in site_list]
    with torch.no_grad(), edited(subject.model, {}, names) as (cc, _):
        clean_logits = subject.logits_at(clean, pos)  # (1, V)
        m_clean = float(m(clean_logits)[0])
        scale = float(clean_logits.float().std())
    grabbed: dict[str, torch.Tensor] = {}

    def grab(x, name):
        grabbed[name] = x
        return x

    with torch.enable_grad(), edited(subject.model, {n: grab for n in names}) as (_, _log):
        m_corrupt_t = m(subject.logits_at(corrupt, pos))[0]
        grads = torch.autograd.grad(m_corrupt_t, [grabbed[n] for n in names], allow_unused=True)
    m_corrupt = float(m_corrupt_t.detach())
    span = m_clean - m_corrupt
    if abs(span) < 1e-9:
        raise InterventionError(f"clean and corrupt give the same {metric_name(subject, t, f)} "
                                f"({m_clean:.4f}) at position {pos}: nothing to recover")  # fmt: skip
    rows, changed = [], 0
    for s, g in zip(site_list, grads):
        a_clean, a_corrupt = cc[s.name], grabbed[s.name].detach()
        diff = (a_clean - a_corrupt).double()  # (1, T, C) or (1, H, T, D)
        g = torch.zeros_like(diff) if g is None else g.double()
        if by == "head":
            approx, moved = (diff * g)[0].sum(dim=(1, 2)), diff[0].abs().sum(dim=(1, 2))  # (H,)
        elif s.per_head:
            approx, moved = (diff * g)[0].sum(dim=(0, 2)), diff[0].abs().sum(dim=(0, 2))  # (T,)
        else:
            approx, moved = (diff * g)[0].sum(dim=-1), diff[0].abs().sum(dim=-1)  # (T,)
        rec = torch.zeros(len(moved), dtype=torch.float64)
        # where clean and corrupt agree the patch changes nothing: exactly 0, no forward pass
        keep = range(len(moved))
        if positions is not None and by == "position":
            keep = [i % len(moved) for i in positions if -len(moved) <= i < len(moved)]
            if not keep:
                raise InterventionError(f"--positions {positions}: {s.name} has positions "
                                        f"0..{len(moved) - 1}")  # fmt: skip
        todo = [i for i in keep if moved[i] > 0]
        if by == "position" and _read_where_written(subject, s):
            todo = [i for i in todo if i == pos]  # the readout is position-wise from here on
        for c in range(0, len(todo), CHUNK):
            index = todo[c : c + CHUNK]
            with (
                torch.no_grad(),
                edited(subject.model, {s.name: _patch_rows(a_clean, index, by, s.per_head)}) as (
                    _,
                    log,
                ),
            ):
                patched = m(subject.logits_at(corrupt, pos, batch=len(index)))  # (n,)
            changed += log.changed
            rec[index] = ((patched - m_corrupt) / span).cpu()
        rows += [PatchRow(s, i, float(rec[i]), float(approx[i] / span)) for i in keep]
    if reverse:  # report in the user's terms: the clean input and its metric are the clean ones
        clean, m_clean, m_corrupt = corrupt, m_corrupt, m_clean
    # the tokens along each stack's positions (a ViT's residual stream runs over its patches)
    tokens = {st: clean.stack_tokens[st] for st in dict.fromkeys(s.stack for s in site_list)}
    notes = list(subject.notes)
    if clean.extra.get("translation") is not None:
        notes.append(f"the decoder reads <bos> + the clean translation "
                     f"{clean.extra['translation']!r} in both runs")  # fmt: skip
    return PatchResult(by, metric_name(subject, t, f), clean_text, corrupt_text, pos, m_clean,
                       m_corrupt, rows, tokens, notes, changed, reverse, scale,
                       small_span(span, scale))  # fmt: skip


# |clean - corrupt| below this fraction of the metric's scale (the std of the clean logits over
# the vocabulary) makes every recovered fraction a ratio of noise
SMALL_SPAN = 0.1


def small_span(span: float, scale: float) -> str | None:
    """The warning for a denominator too small to divide by, or None."""
    if abs(span) >= SMALL_SPAN * scale:
        return None
    return (f"clean - corrupt = {span:+.4f} is under {SMALL_SPAN:g} x the logits' spread "
            f"({scale:.4f}): the corruption barely moves the metric, so every 'recovered' "
            "fraction divides by noise; pick a corrupt input that changes the answer, or a "
            "--target/--foil the two inputs disagree on")  # fmt: skip


def metric_name(subject: Subject, t: int, f: int | None) -> str:
    """How results name the metric: logit(t), or logit(t) - logit(f) with a foil."""
    name = f"logit({subject.decode(t)!r})"
    return name if f is None else f"{name} - logit({subject.decode(f)!r})"
