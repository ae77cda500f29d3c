"""The Task interface, and the registry of task families.

A task is what a model is trained to do: its data (read, split, tokenized), the model built for
it, the loss of a batch, its evaluation figures in its own words, the example it shows while it
trains, what its run directory must hold to be rebuilt, and (after training) what it predicts.
The Trainer (``attnlab.training``) calls a task and nothing else; ``attnlab train --task NAME``
finds the task here. A new task is one module in ``attnlab.tasks`` holding one ``Task``
subclass, plus its line in ``TASKS``: nothing else changes.

    cls = task_class("seq2seq")                 # the class; cls.Options holds its options
    task = cls(cls.Options(data="dates"), seed=1337)
    task.prepare(run_dir)                       # read the data, build the tokenizer
    model = task.build_model()
    Trainer(model, task, TrainConfig(...), run_dir).fit()

Each option has one default, defined once: in the task's ``Options`` dataclass (data,
tokenizer, model sizes) or in ``TrainConfig`` unless the task's ``train_defaults`` sets it
otherwise (the ViT trains 600 steps of 64 images at lr 2e-3). ``option_defaults`` lists them.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn

from attnlab.config import BaseConfig, ConfigError
from attnlab.training.config import TrainConfig
from attnlab.training.metrics import Metric

# task name -> "module:Class"
TASKS: dict[str, str] = {
    "lm": "attnlab.tasks.lm:LanguageModel",
    "mlm": "attnlab.tasks.mlm:MaskedLM",
    "classify": "attnlab.tasks.classify:TextClassifier",
    "seq2seq": "attnlab.tasks.seq2seq:Seq2Seq",
    "vision": "attnlab.tasks.vision:ImageClassifier",
    "induction": "attnlab.tasks.induction:Induction",
}


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; choose {', '.join(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def open_task(run_dir: str | Path, with_data: bool = False) -> Task:
    """The task of a run directory, rebuilt from its config.json and its tokenizer: what
    ``predict`` needs; ``with_data`` also reads its data again (its held-out splits), as
    ``eval`` and ``--resume`` do. Runs written before tasks recorded their options get the
    task's defaults."""
    from attnlab import checkpoint as ckpt

    cfg = ckpt.read_run_config(run_dir)
    cls = task_for_run(cfg)
    saved = cfg.get("task_options")
    if not isinstance(saved, dict):
        data = cfg.get("data")
        saved = {"data": data} if isinstance(data, str) else {}
    try:
        options = cls.Options.from_dict(saved)
    except (ConfigError, TypeError) as e:
        raise ckpt.RunError(f"{Path(run_dir) / 'config.json'}: task options ({e})") from None
    seed = (cfg.get("train_config") or {}).get("seed", 1337)
    task = cls(options, seed=seed)
    tokenizer = ckpt.read_tokenizer_files(run_dir)
    if with_data:
        task.reload(Path(run_dir), tokenizer, cfg)
    else:
        task.tokenizer = tokenizer
        task.restore(cfg)
    return task


def task_for_run(cfg: dict) -> type[Task]:
    """The task class of a run, from its config.json (a ViT run says ``classify``)."""
    name = cfg.get("task") or "lm"
    if name not in TASKS:
        raise ConfigError(f"config.json names an unknown task {name!r}")
    return task_class(name).redirect(
        {**(cfg.get("task_options") or {}), "model_type": cfg.get("model_type")}
    )


class Task:
    """What the Trainer needs to train a model on one kind of problem (see module docstring).

    Class attributes say what the task is; an instance holds its data, once ``prepare`` (a new
    run) or ``reload`` (a run directory) has read it.
    """

    name: ClassVar[str]  # its key in TASKS and in config.json's "task"
    label: ClassVar[str] = ""  # how errors name it, e.g. "--task lm"
    Options: ClassVar[type[BaseConfig]]  # its options, each with its default
    train_defaults: ClassVar[dict[str, Any]] = {}  # TrainConfig fields it sets otherwise
    unit: ClassVar[str] = "examples"  # what throughput counts: tokens, pairs, images, examples
    loss_unit: ClassVar[str] = "nats / example"
    metrics: ClassVar[tuple[Metric, ...]] = ()  # its figures, besides val_loss
    best: ClassVar[str] = "val_loss"  # the metric that chooses best/
    data_files: ClassVar[tuple[str, ...]] = ()  # files prepare() writes into the run directory

    def __init__(self, options: BaseConfig, seed: int = 1337):
        self.options = options
        self.seed = seed
        self.tokenizer = None
        self.log: Callable[[str], None] = lambda msg: None  # progress while data is prepared

    # -- options -------------------------------------------------------------------------------

    @classmethod
    def redirect(cls, given: dict) -> type[Task]:
        """The task that really handles ``given`` (``classify`` on images is ``vision``)."""
        return cls

    @classmethod
    def defaults_for(cls, given: dict) -> dict[str, Any]:
        """TrainConfig values of this task where they differ from TrainConfig's defaults (a
        task may choose them by another option, e.g. seq2seq by ``arch``)."""
        return dict(cls.train_defaults)

    @classmethod
    def option_defaults(cls, given: dict | None = None) -> dict[str, Any]:
        """Every option's default for this task: its Options, then TrainConfig's, as the task
        sets them (None = chosen later: a preset's size, or scaled with max_iters)."""
        out = {f.name: f.default for f in dataclasses.fields(cls.Options) if f.name != "data"}
        train = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        return {**out, **train, **cls.defaults_for(given or {})}

    @classmethod
    def default_out(cls, options) -> Path:
        return Path("runs") / (Path(str(options.data)).stem or cls.name)

    # -- data and model ------------------------------------------------------------------------

    def prepare(self, run_dir: Path | None) -> None:
        """A new run: read and check the data, build the tokenizer (``self.tokenizer``); may
        write ``data_files`` into ``run_dir``. Bad data is a DataError naming the file."""
        raise NotImplementedError

    def reload(self, run_dir: Path, tokenizer, cfg: dict) -> None:
        """A run directory's task: its tokenizer as saved, its data rebuilt from what config.json
        records (so that a resumed run sees the same batches)."""
        raise NotImplementedError

    def model_config(self) -> BaseConfig:
        """The config of the model this task trains (sized by its tokenizer or its data)."""
        raise NotImplementedError

    def build_model(self) -> nn.Module:
        """That model, freshly initialised (seed torch first)."""
        raise NotImplementedError

    def restore(self, cfg: dict) -> None:
        """What a run's config.json says that prediction needs without the data (the class
        names of a classifier)."""

    @classmethod
    def self_attention(cls, options: BaseConfig) -> bool:
        """Does the model these options build have self-attention heads (what snapshots and
        ``attnlab heads`` score)? An LSTM's attention reads the encoder from the decoder."""
        return True

    def sample_inputs(self, n: int, max_len: int) -> tuple[Tensor, bool] | None:
        """A few held-out inputs, fixed, that the model's probe forward reads (see
        ``attnlab.inspect.heads.probe_forward``): (inputs, True when they are token ids
        (n, <= max_len)); None when the task has none to give."""
        return None

    # -- what the Trainer calls ----------------------------------------------------------------

    def train_batches(self, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        """An endless source of training batches with ``state_dict``/``load_state_dict``."""
        raise NotImplementedError

    def val_batches(self, batch_size: int, eval_iters: int) -> list:
        """Fixed held-out batches: their mean loss is ``val_loss``."""
        raise NotImplementedError

    def train_eval_batches(self, batch_size: int, eval_iters: int) -> list:
        """Fixed training batches whose mean loss is logged at each evaluation (or none)."""
        return []

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
        """Mean loss of ``batch``. Calls ``model(...)`` (its forward), never a method of it, so
        that the DistributedDataParallel and torch.compile wrappers see the call."""
        raise NotImplementedError

    def count(self, batch: tuple[Tensor, ...]) -> int:
        """How many ``unit`` (tokens, pairs, images, examples) one batch trains on."""
        return int(batch[0].size(0))

    def evaluate(self, model: nn.Module, val_loss: float) -> dict[str, float]:
        """The task's figures on its held-out data (called in eval mode, without gradients)."""
        return {}

    def example(self, model: nn.Module) -> str | None:
        """One line shown at each evaluation: a sample, a translation, a prediction."""
        return None

    # -- the run directory ---------------------------------------------------------------------

    @property
    def title(self) -> str:
        """A title for loss.png."""
        return f"{self.name}: {self.options.data}"

    def run_config(self) -> dict[str, Any]:
        """What config.json holds besides the model: enough to rebuild this task."""
        return {"task": self.name, "task_options": self.options.to_dict()}

    def describe(self, model: nn.Module) -> str:
        """One line on stderr before training starts."""
        n = sum(p.numel() for p in model.parameters())
        return f"{self.name}: {n:,} parameters"

    def finish(self, model: nn.Module) -> dict[str, Any]:
        """Figures measured once training is done (e.g. test accuracy), for config.json."""
        return {}

    def summary(self, result, final: dict) -> str:
        """The result line printed on stdout."""
        val = result.val_loss
        return f"trained {result.step} steps: " + (
            f"val loss {val:.4f}" if val is not None else "no validation split"
        )

    # -- after training ------------------------------------------------------------------------

    def predict(self, model: nn.Module, inputs: list[str], top_k: int = 5) -> list[dict]:
        """What the trained model says about each input (one dict per input)."""
        raise NotImplementedError(f"the {self.name} task has no prediction yet")
