"""Classic experiments on attention, rerun on models attnlab trains in minutes.

    from attnlab.experiments import run_experiment
    report = run_experiment("pruning", "reports/pruning", quick=True, seeds=[1, 2, 3])

An experiment is a named, seeded recipe: it trains the models it needs (each a normal run
directory under OUT/runs/, through ``attnlab.training.run``, as ``attnlab train`` does), runs
its measurements with the library's interventions, and returns a ``Report`` whose claims put
the published figure beside attnlab's and decide, by a criterion the report states, whether the
finding reproduces. ``run_experiment`` writes OUT/report.html and OUT/figures.json. Each
experiment is a module of this package that registers its recipe (``recipe.register``).

This package is the top layer: nothing in attnlab imports it but the command line.
"""

from __future__ import annotations

import time
from pathlib import Path

from attnlab.experiments.recipe import (
    Context,
    Experiment,
    ExperimentError,
    example_file,
    register,
    registry,
)
from attnlab.experiments.report import Claim, Report, Table

__all__ = ["Claim", "Context", "Experiment", "ExperimentError", "Report", "Table",
           "example_file", "register", "registry", "run_experiment"]  # fmt: skip


def run_experiment(name: str, out: str | Path, quick: bool = False, seeds=(1, 2, 3),
                   device: str = "cpu", threads: int | None = None, log=None) -> Report:  # fmt: skip
    """Run the experiment ``name`` into ``out`` (its runs, report.html and figures.json)."""
    known = registry()
    if name not in known:
        raise ExperimentError(f"unknown experiment {name!r}; choose {', '.join(known)}")
    seeds = list(seeds)
    if len(seeds) < 1 or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ExperimentError(f"--seeds must be distinct non-negative integers, got {seeds}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExperimentError(f"--out {out}: is a file, not a directory")
    exp = known[name]
    ctx = Context(out, quick, seeds, device, threads)
    if log is not None:
        ctx.log = log
    t = time.time()
    report = exp.recipe(ctx)
    import torch

    report.settings = {"quick": quick, "seeds": ",".join(map(str, seeds)),
                       "threads": torch.get_num_threads(), "device": device,
                       "seconds": round(time.time() - t, 1), **report.settings}  # fmt: skip
    report.write(out)
    return report
