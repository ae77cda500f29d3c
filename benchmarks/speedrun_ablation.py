"""What each piece of the speedrun buys: the recipe with one piece taken out, and nanoGPT's GPT
(the baby preset and recipe) with that piece put in, each over several seeds, at one fixed
budget of compute; the table of docs/speedrun.md.

    PYTHONPATH=src python benchmarks/speedrun_ablation.py --data input.txt \\
        [--seeds 1337,1,2] [--workers 2] [--only muon,relu2] [--log runs.jsonl] [--markdown]
        [--steps N]
    PYTHONPATH=src python benchmarks/speedrun_ablation.py --table runs.jsonl [--markdown]

The budget is the speedrun's own run (``attnlab train --preset speedrun``: its steps, in CPU
seconds at one thread). Every variant gets the same budget: its step's cost is measured
against the speedrun's step first (one process, the two alternating, one thread, CPU time), and
it trains for as many steps as that cost allows, with its recipe's schedule over those steps.
Each run is attnlab's own training (``attnlab.training.run.plan`` and ``train``, the options as
``attnlab train`` takes them) in a worker process at one thread; ``--workers`` run at once
(2 on a 2-core machine).

Per run, two figures:
- val loss at the budget: the run's last evaluation (nanoGPT's 20 batches of 12 windows of 64);
- time to the target (``--target``, nanoGPT's 1.886): the training CPU seconds up to the first
  of ten evaluations spread over the run (10%, 20%, ... of its steps) whose val loss is at or
  below it, plus one evaluation's CPU seconds (the one that tells you so); "-" where no
  evaluation reaches it. The other evaluations are not counted (the run does not need them).
Times are CPU seconds of one thread: on an idle machine, wall seconds at ``--threads 1``.
The table gives the median and range over seeds of each, and the variant's steps and step cost.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.886  # nanoGPT's val loss at its step 2000 (README CPU command)
SPEEDRUN = {"preset": "speedrun"}
BASELINE = {"preset": "baby"}  # nanoGPT's CPU configuration and recipe (attnlab's defaults)

# (name, what it is, the options that take it out of the speedrun, those that put it into the
# baseline). A piece the recipe dropped is put into the speedrun instead ("+" in the table).
PIECES: list[tuple[str, str, dict, dict]] = [
    (
        "muon",
        "Muon for the blocks' matrices (AdamW for the rest)",
        {"optimizer": "adamw", "lr": 3e-3},
        {"optimizer": "muon"},
    ),
    (
        "wsd",
        "warmup, constant, linear cool-down (not cosine)",
        {"schedule": "cosine", "min_lr": 1e-3},
        {"schedule": "wsd", "min_lr": 0.0},
    ),
    ("relu2", "ReLU^2 feed-forward (not GELU)", {"activation": "gelu"}, {"activation": "relu2"}),
    ("qk_norm", "QK-norm", {"qk_norm": False}, {"qk_norm": True}),
    ("rotary", "rotary positions (not learned)", {"pos": "learned"}, {"pos": "rotary"}),
    (
        "zero_init",
        "zero-initialised output projections and head",
        {"zero_init": False},
        {"zero_init": True},
    ),
    (
        "untied",
        "a head of its own (not tied to the embedding)",
        {"tie_weights": True},
        {"tie_weights": False},
    ),
    ("softcap", "logit softcap 15", {"softcap": 15.0}, {"softcap": 15.0}),
]
DROPPED = {"softcap"}  # pieces the recipe does not keep: the speedrun row adds them


def variants(only: set[str] | None = None) -> list[tuple[str, dict]]:
    """(label, options) of every run of the table, the two references first."""
    out = [("speedrun", SPEEDRUN), ("baseline", BASELINE)]
    for name, _, remove, add in PIECES:
        if only and name not in only:
            continue
        sign = "+" if name in DROPPED else "-"
        out.append((f"speedrun {sign} {name}", {**SPEEDRUN, **remove}))
        out.append((f"baseline + {name}", {**BASELINE, **add}))
    return out


def _given(data: Path, options: dict, out: Path, **extra) -> dict:
    return {"data": str(data), "out": str(out), "quiet": True, "threads": 1,
            "checkpoint_seconds": 0.0, **options, **extra}  # fmt: skip


class Clock:
    """A Trainer callback: the training CPU seconds to each step (evaluations and checkpoints
    left out), and the val loss at the steps in ``points`` (evaluated here, timed apart)."""

    def __init__(self, points: set[int]):
        self.points, self.curve, self.evals = points, [], []
        self.train = 0.0
        self.began = None

    def on_step(self, trainer) -> None:
        self.began = time.process_time()

    def on_metrics(self, trainer, row) -> None:  # the Trainer's own evaluation ended: restart
        if "val_loss" in row:
            self.began = time.process_time()

    def on_step_end(self, trainer) -> None:
        self.train += time.process_time() - self.began
        if trainer.step in self.points:
            t = time.process_time()
            val = trainer.mean_loss(trainer.val_batches)
            self.evals.append(time.process_time() - t)
            self.curve.append((trainer.step, self.train, val))


def step_cost(data: Path, options: dict, steps: int = 3, rounds: int = 4) -> float:
    """CPU seconds of one training step of ``options`` over one of the speedrun's, the two
    alternating in this process (one thread), the median of ``rounds``."""
    import torch

    from attnlab.training import run as training
    from attnlab.training.loop import Trainer

    torch.set_num_threads(1)
    trainers = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, opts in enumerate((SPEEDRUN, options)):
            p = training.plan(_given(data, opts, Path(tmp) / str(i)))
            task = p.task(p.options, seed=p.config.seed)
            task.prepare(None)
            torch.manual_seed(0)
            trainers.append(Trainer(task.build_model(), task, p.config, quiet=True))

        def timed(t) -> float:
            c = time.process_time()
            for _ in range(steps):
                t.train_step()
                t.step += 1
            return time.process_time() - c

        ratios = []
        for r in range(rounds + 1):
            a, b = timed(trainers[0]), timed(trainers[1])
            if r:  # the first round warms both up
                ratios.append(b / a)
    return statistics.median(ratios)


def one_run(job: dict) -> dict:
    """Train one variant at one seed for ``job['steps']`` steps -> its figures."""
    import torch

    from attnlab.training import run as training

    torch.set_num_threads(1)
    steps = job["steps"]
    points = {max(1, round(steps * k / 10)) for k in range(1, 11)}
    with tempfile.TemporaryDirectory() as tmp:
        p = training.plan(_given(Path(job["data"]), job["options"], Path(tmp) / "run",
                                 seed=job["seed"], max_iters=steps, eval_interval=steps))  # fmt: skip
        clock = Clock(points)
        wall = time.perf_counter()
        outcome = training.train(p, log=lambda msg: None, callbacks=[clock])
        wall = time.perf_counter() - wall
    reached = next(((s, t) for s, t, v in clock.curve if v <= job["target"]), None)
    evaluation = statistics.median(clock.evals)
    return {**{k: job[k] for k in ("label", "seed", "steps", "cost")},
            "val": outcome.result.val_loss, "train_cpu_s": clock.train, "eval_cpu_s": evaluation,
            "to_target_s": None if reached is None else reached[1] + evaluation,
            "reached_at": None if reached is None else reached[0], "curve": clock.curve,
            "wall_s": wall, "load": os.getloadavg()[0]}  # fmt: skip


def _span(xs: list[float], fmt: str = "{:.3f}") -> str:
    if not xs:
        return "-"
    mid = fmt.format(statistics.median(xs))
    return mid if len(xs) == 1 else f"{mid} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def table(rows: list[dict], markdown: bool = False) -> list[str]:
    """One line per variant: steps, step cost, val at the budget and time to the target, each
    the median (range) over its seeds."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    head = ["variant", "steps", "step cost", "val loss at the budget", "CPU s to val <= target"]
    lines = []
    for label in labels:
        rs = [r for r in rows if r["label"] == label]
        times = [r["to_target_s"] for r in rs if r["to_target_s"] is not None]
        reach = _span(times, "{:.1f}") + (
            "" if len(times) == len(rs) else f" [{len(times)}/{len(rs)} seeds]"
        )
        lines.append([label, str(rs[0]["steps"]), f"{rs[0]['cost']:.2f}x",
                      _span([r["val"] for r in rs]), reach])  # fmt: skip
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return out + ["| " + " | ".join(cells) + " |" for cells in lines]
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in [head, *lines]
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--data", type=Path, help="tiny Shakespeare's input.txt")
    p.add_argument("--seeds", default="1337,1,2")
    p.add_argument("--workers", type=int, default=2, help="runs at once, one thread each")
    p.add_argument("--only", help="pieces to run (comma-separated names), beside the references")
    p.add_argument("--target", type=float, default=TARGET)
    p.add_argument("--steps", type=int, help="the speedrun's steps (default: its recipe's; "
                   "fewer for a quick look)")  # fmt: skip
    p.add_argument("--log", type=Path, help="append each run as a JSON line to this file")
    p.add_argument("--table", type=Path, metavar="LOG", help="print the table of a --log file")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = p.parse_args()
    if args.table:
        rows = [json.loads(x) for x in args.table.read_text().splitlines() if x.strip()]
        print("\n".join(table(rows, args.markdown)))
        return
    if args.data is None or not args.data.is_file():
        p.error("--data: tiny Shakespeare's input.txt")
    seeds = [int(s) for s in args.seeds.split(",")]
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - {name for name, *_ in PIECES}
    if unknown:
        p.error(f"--only: no piece named {', '.join(sorted(unknown))}")
    if args.workers < 1:
        p.error("--workers: at least 1")
    from attnlab.tasks.lm import PRESET_TRAINING

    began, load0 = time.perf_counter(), os.getloadavg()[0]
    steps0 = args.steps or PRESET_TRAINING["speedrun"]["max_iters"]
    todo = variants(only)
    print(f"# measuring each variant's step against the speedrun's (load {load0:.1f})", flush=True)
    with mp.get_context("spawn").Pool(args.workers) as pool:
        measured = pool.starmap(step_cost, [(args.data.resolve(), opts) for _, opts in todo[1:]])
        costs = [1.0, *measured]  # the speedrun's step is the unit
        jobs = [{"label": label, "options": opts, "seed": s, "data": str(args.data.resolve()),
                 "target": args.target, "cost": cost, "steps": max(1, round(steps0 / cost))}
                for (label, opts), cost in zip(todo, costs) for s in seeds]  # fmt: skip
        jobs.sort(key=lambda j: -j["steps"] * j["cost"])  # the longest first
        rows = []
        for r in pool.imap_unordered(one_run, jobs):
            rows.append(r)
            print(f"# {r['label']:<28} seed {r['seed']:<5} {r['steps']:>4} steps  val "
                  f"{r['val']:.4f}  to target {r['to_target_s'] or float('nan'):.1f} CPU s  "
                  f"(wall {r['wall_s']:.0f} s, load {r['load']:.1f})", flush=True)  # fmt: skip
            if args.log:
                with open(args.log, "a") as f:
                    f.write(json.dumps(r) + "\n")
    order = {label: i for i, (label, _) in enumerate(todo)}
    rows.sort(key=lambda r: (order[r["label"]], r["seed"]))
    print(f"\n# budget: the speedrun's {steps0} steps; target val <= {args.target}; seeds "
          f"{args.seeds}; {time.perf_counter() - began:.0f} s in all, load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n".join(table(rows, args.markdown)))


if __name__ == "__main__":
    sys.exit(main())
