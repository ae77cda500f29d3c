"""What a recipe is given (``Context``: where to write, how big to run, the seeds, a way to
train a run) and what it is registered as (``Experiment``, with ``register``).

To add an experiment, add a module to ``attnlab.experiments`` whose recipe is registered,
``EXPERIMENT = register(Experiment(name, title, summary, citation, recipe, order, about))``:
``attnlab experiment`` finds it (``registry()``), lists it in its help and runs it."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
    models: list[dict] = field(default_factory=list)  # every model trained, judged (judge())

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
                return self._judged(name, given, load_run(path, self.device))
            raise ExperimentError(f"{path} holds another run (or an unfinished one): give the "
                                  "experiment a new --out")  # fmt: skip
        t = time.time()
        outcome = train(p, log=self.log, callbacks=callbacks)
        self.log(f"experiment: trained {name} in {time.time() - t:.0f} s: {outcome.summary}")
        return self._judged(name, given, load_run(path, self.device))

    def _judged(self, name: str, given: dict, run):
        learned, figure, bar = judge(run.config)
        self.models.append({"name": name, "seed": given.get("seed"), "learned": learned,
                            "figure": figure, "bar": bar})  # fmt: skip
        return run


def judge(cfg: dict) -> tuple[bool | None, str, str]:
    """Did a trained run learn its task? (learned, its held-out figure, the bar), from its
    config.json's last evaluation. The bars ask for a model that clearly beats guessing:

    classify (text or image)  held-out accuracy at least a quarter of the way from chance
                              (1 / classes) to 100%
    seq2seq                   held-out exact match at least 10% (one output in ten right)
    lm, mlm                   held-out loss at most 3/4 of ln V (guessing uniformly over the
                              vocabulary scores ln V)
    induction                 the repeated half's loss at most 1/2 ln V
    A task with no bar here, or a run with no evaluation: (None, "", "")."""
    m, task, c = cfg.get("metrics") or {}, cfg.get("task"), cfg.get("config") or {}
    if task in ("classify", "vision") and m.get("val_accuracy") is not None:
        k = max(2, len(cfg.get("labels") or []))
        need = 1 / k + (1 - 1 / k) / 4
        return (m["val_accuracy"] >= need, f"accuracy {m['val_accuracy']:.0%}",
                f"held-out accuracy at least {need:.0%}, chance {1 / k:.0%}")  # fmt: skip
    if task == "seq2seq" and m.get("val_exact") is not None:
        return (m["val_exact"] >= 0.1, f"exact match {m['val_exact']:.0%}",
                "held-out exact match at least 10%")  # fmt: skip
    vocab = c.get("vocab_size")
    if task in ("lm", "mlm") and m.get("val_loss") is not None and vocab:
        need = 0.75 * math.log(vocab)
        return (m["val_loss"] <= need, f"loss {m['val_loss']:.3f}",
                f"held-out loss at most {need:.2f} (3/4 of ln V)")  # fmt: skip
    if task == "induction" and m.get("loss_repeated_half") is not None and vocab:
        need = 0.5 * math.log(vocab)
        return (m["loss_repeated_half"] <= need, f"repeated-half loss {m['loss_repeated_half']:.3f}",
                f"repeated-half loss at most {need:.2f} (1/2 of ln V)")  # fmt: skip
    return None, "", ""


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
