"""What a recipe is given (``Context``: where to write, how big to run, the seeds, a way to
train a run) and what it is registered as (``Experiment``, with ``register``).

To add an experiment, add a module to ``attnlab.experiments`` whose recipe is registered,
``EXPERIMENT = register(Experiment(name, title, summary, citation, recipe, order, about))``:
``attnlab experiment`` finds it (``registry()``), lists it in its help and runs it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.experiments.report import Report
from attnlab.registry import Registry


class ExperimentError(AttnlabError):
    """An experiment that cannot run as asked (unknown name, bad seeds): one line, exit 2."""


@dataclass
class Context:
    """What a recipe is given: where to write, how big to run, the seeds, and a log."""

    out: Path
    quick: bool
    seeds: list[int]
    device: str = "cpu"
    threads: int | None = None
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)

    def train(self, name: str, given: dict, callbacks=()):
        """A run trained with ``attnlab train``'s options ``given`` into OUT/runs/NAME, loaded
        (an ``attnlab.run.Run``). A finished run already there with the same options is reused,
        so a second call of the experiment only measures again. ``callbacks`` watch the
        training (the Trainer's; a reused run is not trained, so they see nothing)."""
        from attnlab import rundir
        from attnlab.run import load_run
        from attnlab.training.run import plan, train

        path = self.out / "runs" / name
        if str(given.get("data", "")).startswith("examples/"):
            given = {**given, "data": str(example_file(given["data"]))}
        p = plan({**given, "out": str(path), "quiet": True, "device": self.device,
                  "threads": self.threads})  # fmt: skip
        if rundir.has_run_config(path):
            cfg = rundir.read_run_config(path)
            same = cfg.get("task_options") == p.options.to_dict() and (
                (cfg.get("train_config") or {}).get("seed") == p.config.seed)  # fmt: skip
            if "metrics" in cfg and same:
                self.log(f"experiment: reusing {path}")
                return load_run(path, self.device)
            raise ExperimentError(f"{path} holds another run (or an unfinished one): give the "
                                  "experiment a new --out")  # fmt: skip
        t = time.time()
        outcome = train(p, log=self.log, callbacks=callbacks)
        self.log(f"experiment: trained {name} in {time.time() - t:.0f} s: {outcome.summary}")
        return load_run(path, self.device)


def example_file(name: str) -> Path:
    """A file of the repository's examples/ folder (``examples/language_en_es.tsv``), found
    beside the source tree whatever the working directory."""
    path = Path(__file__).resolve().parents[3] / "examples" / Path(name).name
    if not path.is_file():
        raise ExperimentError(f"{path}: not found (the experiments read attnlab's examples/ "
                              "folder from a source checkout)")  # fmt: skip
    return path


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    summary: str  # one line for --help and the list
    citation: str
    recipe: Callable[[Context], Report]
    order: int = 0  # its place in `attnlab experiment`'s list (lower first)
    about: str = ""  # what `attnlab experiment --help` says of it: the paper and what it measures


EXPERIMENTS = Registry("attnlab.experiments")


def register(experiment: Experiment) -> Experiment:
    """Make ``experiment`` one that ``attnlab experiment NAME`` runs (in its own module)."""
    return EXPERIMENTS.register(experiment)


def registry() -> dict[str, Experiment]:
    """Every experiment by name, in order (every module of attnlab.experiments imported first)."""
    return EXPERIMENTS.registered()
