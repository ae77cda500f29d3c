"""Ablation: knock out heads (or any named activation) and measure what the model loses.

    loss change = loss(ablated) - loss(clean), per position and on average
    top predictions at the metric position, before and after

A head is ablated at its output ``z`` (B, H, T, d_v), before the output projection mixes the
heads: zero (its output becomes 0: only W_O's bias is left), mean (its output averaged over the
positions of the clean run of the reference, or of the input itself without one), or resample
(its output on another input, position by position). Every mean comes from that one clean
(unablated) run, recorded before anything is ablated: a head in a later layer never takes its
mean from a run in which earlier heads are already ablated, so ``--reference`` equal to the
input gives the numbers of no ``--reference``. The result says how many values the ablation
changed, so an edit that did nothing is visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnlab.interventions.edits import EditLog, ablation_edit, edited, head_edits
from attnlab.interventions.figures import figure_html, new_figure, save_png, token_ticks
from attnlab.interventions.subjects import InterventionError, Prepared, Subject
from attnlab.render.display import Result, show_token


@dataclass
class AblationResult(Result):
    text: str
    what: str  # "heads 1.2, 0.3" or "site blocks.0.mlp.hidden"
    mode: str
    tokens: list[str]
    clean_loss: float
    ablated_loss: float
    position_delta: list[float]  # per output position (0 where there is no target)
    position: int
    top_clean: list[tuple[str, float]]
    top_ablated: list[tuple[str, float]]
    log: EditLog
    notes: list[str] = field(default_factory=list)
    mean_from: str | None = None  # mode mean: "the clean run of the input" (or "of the reference")

    @property
    def delta(self) -> float:
        return self.ablated_loss - self.clean_loss

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        head = Text(f"ablating {self.what} ({self.mode}) on {self.text!r}\n", style="bold")
        t = FitTable()
        for c in ("", "clean", "ablated", "change"):
            t.add_column(c, justify="right")
        t.add_row("loss (nats)", f"{self.clean_loss:.4f}", f"{self.ablated_loss:.4f}",
                  f"{self.delta:+.4f}")  # fmt: skip
        top = FitTable(title=f"top predictions at position {self.position} "
                    f"({show_token(self.tokens[self.position])})")  # fmt: skip
        for c in ("clean", "p", "ablated", "p "):
            top.add_column(c, justify="right")
        for (a, pa), (b, pb) in zip(self.top_clean, self.top_ablated):
            top.add_row(show_token(a), f"{pa:.3f}", show_token(b), f"{pb:.3f}")
        parts = [head, t, Text(""), top, Text(f"\nedit: {self.log.describe()}", style="dim")]
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        return {
            "text": self.text, "ablated": self.what, "mode": self.mode,
            "clean_loss": self.clean_loss, "ablated_loss": self.ablated_loss,
            "loss_change": self.delta, "tokens": self.tokens,
            "position_loss_change": self.position_delta, "position": self.position,
            "top_clean": [{"token": t, "prob": p} for t, p in self.top_clean],
            "top_ablated": [{"token": t, "prob": p} for t, p in self.top_ablated],
            "values_changed": self.log.changed, "edits": self.log.to_dict(), "notes": self.notes,
            **({"mean_from": self.mean_from} if self.mean_from else {}),
        }  # fmt: skip

    def figure(self):
        fig, ax = new_figure(figsize=(min(12.0, max(5.0, 0.22 * len(self.tokens) + 2)), 3.0))
        xs = range(len(self.position_delta))
        ax.bar(xs, self.position_delta,
               color=["#d62728" if d > 0 else "#1f77b4" for d in self.position_delta])  # fmt: skip
        token_ticks(ax, self.tokens, "position (its token)")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_ylabel("loss change (nats)")
        ax.set_title(f"ablating {self.what} ({self.mode}): loss {self.clean_loss:.3f} -> "
                     f"{self.ablated_loss:.3f}", fontsize=9)  # fmt: skip
        return fig

    def save_png(self, path):
        return save_png(self.figure(), path)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>" + figure_html(self.figure())


def top_tokens(subject: Subject, logits: torch.Tensor, k: int) -> list[tuple[str, float]]:
    probs = torch.softmax(logits.double(), -1)
    top = torch.topk(probs, min(k, probs.numel()))
    return [(subject.decode(int(i)), float(p)) for p, i in zip(top.values, top.indices)]


def reference_activations(subject: Subject, names: list[str], reference: Prepared) -> dict:
    """The activations ``names`` recorded on the reference input."""
    with torch.no_grad(), edited(subject.model, {}, names) as (cache, _):
        subject.logits(reference)
    return {n: cache[n] for n in names}


@torch.no_grad()
def ablation(
    subject: Subject,
    text: str,
    heads=None,
    site: str | None = None,
    positions=None,
    neurons=None,
    mode: str = "zero",
    reference_text: str | None = None,
    top: int = 5,
    position: int | None = None,
) -> AblationResult:
    """Ablate ``heads`` (specs, see ``Subject.parse_heads``) or the activation ``site`` (only at
    ``positions``/``neurons`` if given) on ``text``: loss change and top predictions.

    mode mean uses the positions of the reference input's clean run (default: the text's own
    clean run), every mean recorded before anything is ablated; resample uses the reference
    input (default: the text's tokens in a shuffled order, seed 0)."""
    if (heads is None) == (site is None):
        raise InterventionError("ablate heads or a site, one of the two")
    p = subject.prepare(text)
    pos = subject.metric_position(p, position, None)
    notes = list(subject.notes)
    reference = None
    if mode in ("mean", "resample"):
        if reference_text is not None:
            reference = subject.prepare(reference_text, decoder_like=p)
        elif mode == "resample":
            reference = _shuffled(subject, p)
            notes.append("resampled from the text's tokens shuffled (seed 0); --reference "
                         "TEXT picks another input")  # fmt: skip
        else:  # the mean of every ablated point comes from the text's own clean run
            reference = p
            notes.append("mean over the text's own positions, in its clean run; --reference "
                         "TEXT picks another input")  # fmt: skip
    if heads is not None:
        refs = subject.parse_heads(heads)
        names = sorted({r.group.path + ".z" for r in refs})
        ref_acts = reference_activations(subject, names, reference) if reference else None
        edits = head_edits(subject, refs, mode, positions, ref_acts)
        what = "head" + ("s " if len(refs) > 1 else " ") + ", ".join(r.label for r in refs)
    else:
        ref_acts = reference_activations(subject, [site], reference) if reference else {}
        edits = {site: ablation_edit(None, positions, neurons, mode, ref_acts.get(site))}
        what = f"site {site}"
    clean = subject.logits(p)  # (1, T, V)
    with edited(subject.model, edits) as (_, log):
        ablated = subject.logits(p)
    lc, la = subject.loss(clean, p)[0], subject.loss(ablated, p)[0]  # (T,)
    n = (p.targets != -100).sum().clamp(min=1)
    return AblationResult(
        text, what, mode, p.tokens, float(lc.sum() / n), float(la.sum() / n),
        (la - lc).tolist(), pos, top_tokens(subject, clean[0, pos], top),
        top_tokens(subject, ablated[0, pos], top), log, notes,
        _mean_from(mode, reference_text),
    )  # fmt: skip


def _mean_from(mode: str, reference_text: str | None) -> str | None:
    """What mode mean's means are taken from (the ``mean_from`` of ``--json``)."""
    if mode != "mean":
        return None
    return f"the clean run of the {'input' if reference_text is None else 'reference'}"


def _shuffled(subject: Subject, p: Prepared) -> Prepared:
    """The same input with its tokens in a shuffled order (seed 0): another input, same length."""
    g = torch.Generator().manual_seed(0)
    x = p.args[0]
    if x.dtype != torch.long:  # an image: shuffle its pixels
        flat = x.reshape(-1)
        shuffled = flat[torch.randperm(flat.numel(), generator=g)].view_as(x)
    else:
        shuffled = x[:, torch.randperm(x.size(1), generator=g)]
    return Prepared(p.text, (shuffled, *p.args[1:]), p.tokens, p.ids, p.input_tokens,
                    p.targets, p.position, p.extra)  # fmt: skip
