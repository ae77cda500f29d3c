"""A run's evaluation with heads ablated: the same figures, intact and ablated, side by side.

    change(figure) = figure(heads ablated) - figure(intact)

Any evaluation that returns figures can be compared (``ablated_eval`` takes it as a function
to call twice, returning a dict of figures or an ``Evaluation``: ``attnlab eval --ablate``
passes ``run.evaluate``, so its intact column is ``attnlab eval``'s own figures, in its words). ``task_figures`` is the one a run's task gives: the mean ``task.loss`` over
its fixed held-out batches (``val_loss``) and the task's own figures (``task.evaluate``), as
the Trainer logs them at each evaluation. So every task whose evaluation runs the model (the
GPT language model, the masked LM, classifiers, encoder-decoders, the ViT, and any task added
later) is scored with heads ablated the same way.

    h = held_out(attnlab.load_run(run_dir))   # the run's model, its task, held-out batches
    result = ablated_eval(h.model, h.figures, heads="1.2,0.3")
    result.change["val_loss"]            # how much the loss rose without those heads

    task = open_task(run_dir, with_data=True)           # the same, by hand
    ablated_eval(model, lambda: task_figures(task, model, 32, 20), heads="1.2,0.3")
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from attnlab.interventions.edits import MODES, EditLog, ablate
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.modes import evaluating
from attnlab.render.display import Result


@dataclass
class AblatedEval(Result):
    heads: list[str]  # labels of the ablated heads
    mode: str
    source: str  # what the figures were measured on
    intact: dict[str, float]
    ablated: dict[str, float]
    log: EditLog
    notes: list[str] = field(default_factory=list)
    # key -> (words, unit) of each figure, as ``attnlab eval`` prints it (``Figure``); a key
    # without one is printed as it is
    words: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def change(self) -> dict[str, float]:
        return {k: self.ablated[k] - v for k, v in self.intact.items() if k in self.ablated}

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        what = "head" + ("s " if len(self.heads) > 1 else " ") + ", ".join(self.heads)
        head = Text(f"{what} ablated ({self.mode}), on {self.source}", style="bold")
        t = FitTable()
        for c in ("", "intact", "ablated", "change"):
            t.add_column(c, justify="right")
        change = self.change
        for k, v in self.intact.items():
            label, unit = self.words.get(k, (k, ""))
            a = self.ablated.get(k, math.nan)
            t.add_row(label, _fmt(v, unit), _fmt(a, unit), _fmt(change.get(k, math.nan), unit, "+"))
        parts = [head, t, Text(f"edit: {self.log.describe()}", style="dim")]
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        return {
            "heads": self.heads, "mode": self.mode, "source": self.source,
            "intact": self.intact, "ablated": self.ablated, "change": self.change,
            "values_changed": self.log.changed, "edits": self.log.to_dict(), "notes": self.notes,
        }  # fmt: skip


def _fmt(v: float, unit: str = "", sign: str = "") -> str:
    """A figure as ``attnlab eval`` prints it (``Figure.text``); a change (``sign="+"``) of a
    percentage is in percentage points."""
    from attnlab.evaluation import Figure

    if not math.isfinite(v):
        return str(v)
    if isinstance(v, int) or unit == "count":  # a count (examples right)
        return f"{int(v):{sign},}"
    if sign and unit == "%":
        return f"{100 * v:+.2f} pp"
    if sign:
        return f"{v:+.2f}" if unit == "/100" else f"{v:+.4f}"
    return Figure("", "", v, unit).text()


def ablated_eval(
    model: nn.Module,
    score: Callable[[], dict[str, float]],
    heads,
    mode: str = "zero",
    source: str = "",
    quiet: bool = True,
) -> AblatedEval:
    """``score()`` (the figures of ``model`` as it runs now) with ``heads`` ablated, then
    intact. ``heads`` as ``ablate`` takes them ("1.2,0.3", "decoder.0.1", "context"); a head
    or layer that does not exist, or a model without heads, is an InterventionError raised
    before anything is scored. Ablation acts inside each batch the evaluation runs: mean
    replaces a head's output by its mean over that batch's rows and positions, resample by
    another row's output (so every batch needs two rows or more)."""
    if mode not in MODES:
        raise InterventionError(f"unknown ablation mode {mode!r}; choose from {', '.join(MODES)}")
    labels = [r.label for r in Subject(model).parse_heads(heads)]  # refuses what cannot be

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    say(f"scoring with {', '.join(labels)} ablated ({mode}) ...")
    with ablate(model, heads=heads, mode=mode) as log:
        ablated, words = _figures(score())
    say("scoring intact ...")
    intact, _ = _figures(score())
    notes = []
    if mode == "mean":
        notes.append("mean: each head's output averaged over the rows and positions of the "
                     "batch being scored")  # fmt: skip
    elif mode == "resample":
        notes.append("resample: each row takes the head's output on the next row of its batch")
    return AblatedEval(labels, mode, source, intact, ablated, log, notes, words)


def _figures(scored) -> tuple[dict[str, float], dict[str, tuple[str, str]]]:
    """A score's figures by key, and each one's words and unit: ``scored`` is a dict of
    figures, or an ``attnlab.evaluation.Evaluation`` (what ``attnlab eval`` prints)."""
    if isinstance(scored, dict):
        return scored, {}
    figures = scored.figures
    return ({f.key: f.value for f in figures}, {f.key: (f.label, f.unit) for f in figures})


@torch.no_grad()
def task_figures(task, model: nn.Module, batch_size: int, eval_iters: int) -> dict[str, float]:
    """What the Trainer logs at an evaluation: ``val_loss``, the mean of ``task.loss`` over the
    task's fixed held-out batches, then the task's own figures (``task.evaluate``)."""
    batches = task.val_batches(batch_size, eval_iters)
    val_loss = _mean_loss(task, model, batches)
    with evaluating(model), torch.no_grad():
        return {"val_loss": val_loss, **task.evaluate(model, val_loss)}


def task_loss(task, model: nn.Module, batch_size: int, eval_iters: int) -> Callable[[], float]:
    """The task's held-out loss (``val_loss`` of ``task_figures``) as a function to call
    repeatedly, on the same batches every call: what ``head_importance`` ranks heads by."""
    batches = task.val_batches(batch_size, eval_iters)
    return lambda: _mean_loss(task, model, batches)


@dataclass
class HeldOut:
    """A trained run's model and its task with its held-out data, batched as training did."""

    task: object
    model: nn.Module
    batch_size: int
    eval_iters: int
    source: str

    def figures(self) -> dict[str, float]:
        return task_figures(self.task, self.model, self.batch_size, self.eval_iters)

    def loss(self) -> Callable[[], float]:
        return task_loss(self.task, self.model, self.batch_size, self.eval_iters)


def held_out(run) -> HeldOut:
    """An opened run's (``attnlab.load_run``) task rebuilt with its data
    (``attnlab.tasks.open_task``) and its model; batch size and evaluation batches as in its
    training config. Weights saved without a task (imported ones) have nothing held out: an
    InterventionError says so."""
    from attnlab.tasks import open_task
    from attnlab.train_config import TrainConfig

    cfg, run_dir = run.config, run.path
    if "task" not in cfg and "train_config" not in cfg:
        hint = ("; score it on a text with --data FILE" if run.model.predicts == "next-token"
                else "; score it on TEXT or on --inputs FILE (one input per line)")  # fmt: skip
        raise InterventionError(f"{run_dir}: weights saved without a training task (imported, "
                                f"or by save_model): no held-out data to score{hint}")  # fmt: skip
    task = open_task(run_dir, True, run.config, run.tokenizer)
    model = run.model
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    given = {**defaults, **task.defaults_for({}), **(cfg.get("train_config") or {})}
    batch_size, eval_iters = int(given["batch_size"]), int(given["eval_iters"])
    data = getattr(task.options, "data", None)
    on = task.val_source(task.val_batches(batch_size, eval_iters))  # training's val loss's
    source = f"{on} of {data} ({task.name} task), as training measured its val loss" if data \
        else f"{on}, as training measured its val loss"  # fmt: skip
    return HeldOut(task, model, batch_size, eval_iters, source)


def _mean_loss(task, model: nn.Module, batches: list) -> float:
    if not batches:
        raise InterventionError("this run's task has no held-out data to score")
    device = next(model.parameters()).device
    with evaluating(model), torch.no_grad():
        total = sum(float(task.loss(model, _to(b, device))) for b in batches)
    return total / len(batches)


def _to(batch, device):
    """A batch (a tensor, or a tuple or list of them) on ``device``."""
    if torch.is_tensor(batch):
        return batch.to(device)
    return type(batch)(_to(b, device) for b in batch)
