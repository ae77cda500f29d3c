"""Attention over training time: the loss curve beside every head's scores, read from a run's
snapshots (``attnlab.training.snapshots``) and metrics.jsonl.

    tl = timeline("runs/induction")
    tl.fastest["induction"]          # {"head": "1.0", "step": 275, "from": 0.46, "to": 0.78, ...}
    tl.fastest["in-context loss"]    # {"step": 275, "from": 2.8, "to": 1.3, ...}: the fall
    tl.save_png("timeline.png"); tl.to_dict()

The step where a series changed fastest is the midpoint of its change:
``fastest_change(steps, values)``, the first snapshot by which it has covered half of the way
from its first value to its highest (for a score) or lowest (for the in-context loss, the loss
on the repeated half of the probe r r). Olsson et al. (2022) saw both at the same step, the
phase change in which induction heads form.

Their in-context learning score is here too, where the snapshots hold it (a causal language
model; ``attnlab.metrics.icl_score``): the loss of the last token of a held-out window as long
as the block minus the loss of the token a tenth of the way in (the positions are in
``icl_positions``; Olsson et al. took the 500th and the 50th), averaged over 32 windows. It
falls (more negative: later tokens predicted better) as induction heads form; its fastest fall
is ``fastest["icl score"]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from attnlab import rundir
from attnlab.files import atomic_write
from attnlab.inspect.heads import SCORES, head_label
from attnlab.inspect.recording import InspectError
from attnlab.render.display import Result
from attnlab.rundir import RunDir, read_metrics

# the score a head's curve shows in the figure, and the head named in the summary
FIGURE_SCORES = ("induction", "previous-token", "duplicate-token", "first-token")
MIN_RISE = 0.1  # a score that never rose by more than this has no "fastest rise" (nor a loss
#                 that never fell by more than this many nats)


def fastest_change(steps: list[int], values: list[float | None], rise: bool = True,
                   min_change: float = 0.0) -> dict | None:  # fmt: skip
    """Where ``values`` rose (``rise``) or fell fastest: the midpoint of its change, the first
    snapshot at which it has covered half of the way from its first value to its highest
    (lowest, for a fall). For the S-shaped change of a phase change that is the steepest point,
    and it does not move with the noise of one interval the way the largest single step does
    (a transition that spans several snapshots has several near-equal steps).

    Returns {"step": that snapshot, "from": the value before it, "to": its value, "change":
    highest (lowest) minus first}; None when the series never moved that way by more than
    ``min_change`` (noise has a midpoint too). Missing values (None, NaN) are skipped."""
    pts = [(s, v) for s, v in zip(steps, values)
           if v is not None and not math.isnan(v)]  # fmt: skip
    if len(pts) < 2:
        return None
    first = pts[0][1]
    extreme = max(v for _, v in pts) if rise else min(v for _, v in pts)
    total = extreme - first
    if abs(total) <= min_change or ((total <= 0) if rise else (total >= 0)):
        return None
    for i in range(1, len(pts)):
        if (pts[i][1] - first) / total >= 0.5:
            return {"step": pts[i][0], "from": pts[i - 1][1], "to": pts[i][1], "change": total}
    return None  # unreachable: the extreme itself covers the whole way


@dataclass
class Timeline(Result):
    """Scores of every head at every snapshot, the loss curve, and where each changed fastest."""

    run: str
    steps: list[int]  # the snapshot steps
    every: int | None
    heads: list[dict]  # {"name", "layer", "head", "map", "scores": {score: [value per step]},
    #                     "fastest_rise": {score: fastest_change or None}}
    in_context: dict  # {"loss_first_half": [...], "loss_repeated_half": [...]} per step
    loss: list[dict]  # metrics.jsonl rows with a train_loss: {"step", "train_loss"}
    evals: list[dict]  # metrics.jsonl evaluation rows
    fastest: dict = field(default_factory=dict)
    probe: str = "repeat"
    icl_positions: list[int] | None = None  # [early, late] tokens of the ICL score

    def to_dict(self) -> dict:
        return {
            "run": self.run, "probe": self.probe, "every": self.every, "steps": self.steps,
            "heads": self.heads, "in_context": self.in_context, "fastest": self.fastest,
            "loss": self.loss, "evals": self.evals, "icl_positions": self.icl_positions,
        }  # fmt: skip

    def head(self, name: str) -> dict:
        for h in self.heads:
            if h["name"] == name:
                return h
        raise InspectError(f"no head {name!r}; heads: {', '.join(h['name'] for h in self.heads)}")

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        first, last = (self.steps[0], self.steps[-1]) if self.steps else (0, 0)
        head = Text(f"{self.run}: {len(self.steps)} snapshots, steps {first}..{last}"
                    + (f" (every {self.every})" if self.every else ""), style="bold")  # fmt: skip
        t = FitTable(title=f"each head's scores at the last snapshot, and the step each rose "
                  f"fastest (on {self.probe})")  # fmt: skip
        t.add_column("head")
        for name in FIGURE_SCORES:
            t.add_column(name.replace("-token", ""), justify="right")
            t.add_column("rose at", justify="right")
        for h in self.heads:
            cells = []
            for name in FIGURE_SCORES:
                series = h["scores"].get(name) or []
                v = series[-1] if series else None
                f = h["fastest_rise"].get(name)
                cells += ["-" if v is None else f"{v:.2f}", "-" if f is None else str(f["step"])]
            t.add_row(h["name"], *cells)
        parts = [head, t]
        icl = (f"ICL score (loss of token {self.icl_positions[1]} minus token "
               f"{self.icl_positions[0]})") if self.icl_positions else "ICL score"  # fmt: skip
        for key, what in (("induction", "induction score"), ("previous-token", "previous-token score"),
                          ("in-context loss", "in-context loss (repeated half)"),
                          ("icl score", icl)):  # fmt: skip
            f = self.fastest.get(key)
            if f:
                who = f" (head {f['head']})" if "head" in f else ""
                verb = "fell" if key in ("in-context loss", "icl score") else "rose"
                parts.append(Text(f"{what}{who} {verb} fastest at step {f['step']}: "
                                  f"{f['from']:.3f} -> {f['to']:.3f}"))  # fmt: skip
        scores = [v for v in self.in_context.get("icl_score") or [] if v is not None]
        if scores and not self.fastest.get("icl score"):
            parts.append(Text(f"{icl}: {scores[0]:.3f} at the first snapshot, {scores[-1]:.3f} "
                              "at the last"))  # fmt: skip
        return Group(*parts)

    # -- the figure ----------------------------------------------------------------------------

    def figure(self):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        shown = [s for s in FIGURE_SCORES if any(h["scores"].get(s) for h in self.heads)][:3]
        icl = [math.nan if v is None else v for v in self.in_context.get("icl_score") or []]
        rows = 1 + bool(icl) + len(shown)
        fig, axes = plt.subplots(rows, 1, figsize=(7.5, 2.1 * rows + 0.4), sharex=True)
        axes = list(axes) if rows > 1 else [axes]
        ax = axes[0]
        if self.loss:
            ax.plot([r["step"] for r in self.loss], [r["train_loss"] for r in self.loss],
                    color="0.6", lw=1, label="train loss")  # fmt: skip
        for key, color, label in (("loss_first_half", "#1f77b4", "first half of r r"),
                                  ("loss_repeated_half", "#d62728", "repeated half of r r")):  # fmt: skip
            ys = self.in_context.get(key) or []
            if any(y is not None for y in ys):
                ax.plot(self.steps, ys, color=color, lw=1.6, label=label)
        ax.set_ylabel("loss (nats)")
        ax.legend(fontsize=7, loc="upper right", frameon=False)
        marks = {"in-context loss": "#d62728", "induction": "#2ca02c"}
        for key, color in marks.items():
            f = self.fastest.get(key)
            if f:
                for a in axes:
                    a.axvline(f["step"], color=color, ls="--", lw=0.8)
        ax.set_title(f"{Path(self.run).name}: loss and head scores over training", fontsize=10)
        if icl:  # Olsson et al.'s in-context learning score
            a = axes[1]
            early, late = self.icl_positions or ("early", "late")
            a.plot(self.steps, icl, color="#9467bd", lw=1.6,
                   label=f"loss of token {late} minus token {early}")  # fmt: skip
            a.axhline(0, color="0.5", lw=0.6)
            a.set_ylabel("ICL score\n(nats)", fontsize=8)
            a.legend(fontsize=7, loc="upper right", frameon=False)
        cmap = plt.get_cmap("tab10")
        for a, score in zip(axes[1 + bool(icl) :], shown):
            for i, h in enumerate(self.heads):
                ys = h["scores"].get(score)
                if ys:
                    a.plot(self.steps, [math.nan if y is None else y for y in ys],
                           color=cmap(i % 10), lw=1.2, label=h["name"])  # fmt: skip
            a.set_ylabel(f"{score}\nscore", fontsize=8)
            a.set_ylim(-0.02, 1.02)
            a.legend(fontsize=6, ncol=min(8, len(self.heads)), loc="upper left", frameon=False)
        axes[-1].set_xlabel("step")
        fig.tight_layout()
        return fig

    def save_png(self, path) -> Path:
        import matplotlib.pyplot as plt

        fig = self.figure()
        path = Path(path)
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
        return path


def no_snapshots_advice(run_dir: Path) -> str:
    """What to do about a run without snapshots, that works when followed: read from the
    model's declarations (snapshots score self-attention heads) and its config.json (a run
    trained here can be trained again with them; imported weights have no training)."""
    checked = rundir.check_run(run_dir)  # the model on the meta device: its declarations
    model, cfg = checked.model, checked.config
    if not (model.residual and model.head_groups()):
        return (
            f"a timeline follows self-attention heads over training, and this {model.kind} "
            "model has none to follow (its training curve is metrics.jsonl and loss.png)"
        )
    task, data = cfg.get("task"), cfg.get("data")
    if isinstance(task, dict):
        task = task.get("name")
    if not isinstance(task, str) or not isinstance(data, str):  # imported, or saved by hand
        return ("it was not trained here, so there is no training to replay; a run of your "
                "own shows one: `attnlab train --task induction --out runs/induction`, then "
                "`attnlab timeline runs/induction`")  # fmt: skip
    return f"train it again taking them: `{retrain_command(run_dir, cfg)}`"


def retrain_command(run_dir: Path, cfg: dict) -> str:
    """``attnlab train`` with the options this run was trained with (its config.json's
    task_options and max_iters), taking snapshots about 40 times, into a new directory."""
    import shlex

    from attnlab.train_config import default_snapshot_interval

    task = cfg["task"]
    options = cfg.get("task_options") or {}
    words = ["attnlab", "train", "--task", task]
    for k, v in options.items():
        if v is None or isinstance(v, (bool, dict, list)):
            continue
        words += [f"--{k.replace('_', '-')}", str(v)]
    if "data" not in options:
        words += ["--data", str(cfg["data"])]
    iters = int((cfg.get("train_config") or {}).get("max_iters") or 0)
    if iters:
        words += ["--max-iters", str(iters)]
    words += ["--snapshot-every", str(default_snapshot_interval(iters) if iters else 50)]
    words += ["--out", f"{run_dir}-snapshots"]
    return shlex.join(words)


def timeline(run_dir: str | Path, probe: str = "repeat") -> Timeline:
    """Read every snapshot of a run (its scores only; the patterns stay on disk) and its
    metrics, and find where each series changed fastest; the scores are those on ``probe``
    (``repeat``: random tokens r r; ``sample``: held-out inputs of the run's data). An
    InspectError if it has no snapshots."""
    if probe not in ("repeat", "sample"):
        raise InspectError(f"probe must be repeat or sample, got {probe!r}")
    run_dir = Path(run_dir)
    rundir.read_run_config(run_dir)  # a run directory at all (a RunError says why not)
    snapshots = RunDir(run_dir, writer=False)
    steps = snapshots.snapshot_steps()
    if not steps:
        raise InspectError(f"{run_dir} has no snapshots: {no_snapshots_advice(run_dir)}")
    rows, every, maps = [], None, None
    for s in steps:
        meta, tensors = snapshots.read_snapshot(s, keys=(f"scores.{probe}.",))
        if not tensors and probe == "repeat":  # a model that reads no token ids: the sample
            return timeline(run_dir, "sample")
        if not tensors:
            raise InspectError(f"{run_dir}: its snapshots hold no {probe} probe (a task "
                               "without held-out inputs to give); use --probe repeat")  # fmt: skip
        rows.append((meta, tensors))
        every = meta.get("every", every)
        maps = maps or (meta.get("maps") or {}).get(probe)
    maps = maps or sorted({k[len(f"scores.{probe}.") :] for _, t in rows for k in t})
    heads = []
    for name in maps:
        key = f"scores.{probe}.{name}"
        n_heads = next((t[key].size(0) for _, t in rows if key in t), 0)
        stack, layer, label = head_label(name)
        for h in range(n_heads):
            series = {}
            for k, score in enumerate(SCORES):
                vals = []
                for _, t in rows:
                    v = float(t[key][h, k]) if key in t else math.nan
                    vals.append(None if math.isnan(v) else round(v, 4))
                series[score] = vals if any(v is not None for v in vals) else None
            rises = {score: fastest_change(steps, vals, min_change=MIN_RISE) if vals else None
                     for score, vals in series.items()}  # fmt: skip
            heads.append({"name": f"{label}.{h}", "layer": layer, "head": h, "map": name,
                          "scores": series, "fastest_rise": rises})  # fmt: skip
    in_context = {k: [m.get(k) for m, _ in rows]
                  for k in ("loss_first_half", "loss_repeated_half", "icl_score")}  # fmt: skip
    positions = next((m["icl_positions"] for m, _ in rows if m.get("icl_positions")), None)
    metrics = read_metrics(run_dir)
    loss = [{"step": r["step"], "train_loss": r["train_loss"]} for r in metrics
            if "train_loss" in r and "val_loss" not in r]  # fmt: skip
    evals = [r for r in metrics if "val_loss" in r]
    tl = Timeline(str(run_dir), steps, every, heads, in_context, loss, evals, probe=probe,
                  icl_positions=positions)  # fmt: skip
    tl.fastest = _fastest(tl)
    return tl


def _fastest(tl: Timeline) -> dict:
    """For each score: the head whose score ends highest, and its fastest rise; and the
    in-context loss's fastest fall."""
    out = {}
    for score in ("induction", "previous-token", "duplicate-token", "first-token"):
        best = None
        for h in tl.heads:
            ys = h["scores"].get(score)
            if ys and ys[-1] is not None and (best is None or ys[-1] > best[0]):
                best = (ys[-1], h)
        if best is not None and best[1]["fastest_rise"].get(score):
            out[score] = {"head": best[1]["name"], **best[1]["fastest_rise"][score]}
    fall = fastest_change(tl.steps, tl.in_context.get("loss_repeated_half") or [], rise=False,
                          min_change=MIN_RISE)  # fmt: skip
    if fall:
        out["in-context loss"] = fall
    icl = fastest_change(tl.steps, tl.in_context.get("icl_score") or [], rise=False,
                         min_change=MIN_RISE)  # fmt: skip
    if icl:
        out["icl score"] = icl
    return out
