"""The Task interface, and the registry of task families.

A task is what a model is trained to do: its data (read, split, tokenized), the model built for
it, the loss of a batch, its evaluation figures in its own words, the example it shows while it
trains, what its run directory must hold to be rebuilt, and (after training) what it predicts.
The Trainer (``attnlab.training``) calls a task and nothing else; ``attnlab train --task NAME``
finds the task here. To add a task, add a module to ``attnlab.tasks`` holding one ``Task``
subclass that names itself (``name``, and ``order``: its place in ``--task``'s choices) and is
decorated with ``@register``: ``registered()`` finds it, and nothing else changes.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn

from attnlab.config import BaseConfig, ConfigError
from attnlab.evaluation import Evaluation
from attnlab.metrics import Metric
from attnlab.registry import Registry
from attnlab.train_config import TrainConfig

# task name -> its Task class, each registered by its own module of attnlab.tasks
TASKS = Registry("attnlab.tasks")


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: make the Task subclass ``cls`` the task its ``name`` names."""
    return TASKS.register(cls)


def registered() -> dict[str, type[Task]]:
    """Every task by name, in ``--task``'s order (every module of attnlab.tasks imported first)."""
    return TASKS.registered()


def task_class(name: str) -> type[Task]:
    tasks = registered()
    if name not in tasks:
        raise ConfigError(f"unknown task {name!r}; choose {', '.join(tasks)}")
    return tasks[name]


@dataclasses.dataclass
class PredictOptions(BaseConfig):
    """How ``predict`` answers, for every task (the CLI's ``predict`` takes its defaults from
    here): ``top_k`` alternatives (next tokens, fillers of a [MASK], classes, beams), and for an
    encoder-decoder the ``beam`` width (1 = greedy), the length-penalty exponent ``alpha`` and
    the longest output ``max_len`` (None: twice the source plus 10)."""

    top_k: int = 5
    beam: int = 1
    alpha: float = 0.6
    max_len: int | None = None

    def validate(self) -> None:
        self._positive("top_k", "beam")
        self._positive_or_none("max_len")
        if self.alpha < 0:
            raise ConfigError(f"alpha must be >= 0, got {self.alpha}")


@dataclasses.dataclass
class EvalOptions(BaseConfig):
    """What ``eval`` scores and how (the CLI's ``eval`` takes its defaults from here).

    ``data``: a file (or folder of images) to score instead of the run's held-out split, in the
    task's own format (text; label<TAB>text; source<TAB>target; DIR/<label>/*.png); ``split``:
    which of the run's splits (None: its held-out one); ``limit``: score only the first N
    examples (0 = all); ``max_tokens``: a language model scores at most this many tokens.
    """

    data: str | None = None
    encoding: str = "utf-8"
    split: str | None = None
    batch_size: int = 32
    max_tokens: int | None = 1 << 20
    beam: int = 1
    alpha: float = 0.6
    limit: int = 0

    def validate(self) -> None:
        self._positive("batch_size", "beam")
        self._positive_or_none("max_tokens")
        if self.limit < 0:
            raise ConfigError(f"limit must be >= 0, got {self.limit}")
        if self.alpha < 0:
            raise ConfigError(f"alpha must be >= 0, got {self.alpha}")


def open_task(run_dir: str | Path, with_data: bool = False, cfg: dict | None = None,
              tokenizer=None) -> Task:  # fmt: skip
    """The task of a run directory, rebuilt from its config.json and its tokenizer: what
    ``predict`` needs; ``with_data`` also reads its data again (its held-out splits), as
    ``eval`` and ``--resume`` do. Runs written before tasks recorded their options get the
    task's defaults. ``cfg`` and ``tokenizer``: the run's, where they were read already (an
    opened ``Run``)."""
    from attnlab import rundir

    cfg = rundir.read_run_config(run_dir) if cfg is None else cfg
    cls = task_for_run(cfg)
    saved = cfg.get("task_options")
    if not isinstance(saved, dict):
        data = cfg.get("data")
        saved = {"data": data} if isinstance(data, str) else {}
    try:
        options = cls.Options.from_dict(saved)
    except (ConfigError, TypeError) as e:
        raise rundir.RunError(f"{Path(run_dir) / rundir.CONFIG_FILE}: task options ({e})") from None
    seed = (cfg.get("train_config") or {}).get("seed", 1337)
    task = cls(options, seed=seed)
    if cfg.get("init_from") is not None:  # fine-tuned from another run: its model config
        task.init = InitFrom.from_dict(cfg["init_from"])
    tokenizer = rundir.read_tokenizer_files(run_dir) if tokenizer is None else tokenizer
    if with_data:
        task.reload(Path(run_dir), tokenizer, cfg)
    else:
        task.tokenizer = tokenizer
        task.restore(cfg)
    return task


def task_for_run(cfg: dict) -> type[Task]:
    """The task class of a run, from its config.json (a ViT run says ``classify``). A run
    imported from Hugging Face names no task: a GPT is a language model, an encoder a masked LM
    or a classifier by the head it has; an encoder with neither has no task (a RunError that
    says what it can do instead)."""
    name = cfg.get("task") or imported_task(cfg)
    if name not in registered():
        raise ConfigError(f"config.json names an unknown task {name!r}")
    return task_class(name).redirect(
        {**(cfg.get("task_options") or {}), "model_type": cfg.get("model_type")}
    )


def imported_task(cfg: dict) -> str:
    """The task of a run that names none (imported weights, or a run older than tasks)."""
    from attnlab.models.declare import registered
    from attnlab.rundir import RunError

    cls = registered().get(cfg.get("model_type"))
    task = cls.default_task(cfg.get("config") or {}) if cls is not None else "lm"
    if task is None:
        raise RunError(
            "this run is an encoder with no prediction head (no masked-LM or classification "
            "head): it gives contextual vectors, not predictions; use `attnlab embed RUN TEXT` "
            "for a sentence embedding, or `attnlab trace`/`attention` to look inside"
        )
    return task


# Options that would change the architecture or the vocabulary of a model: a run started from
# another (``InitFrom``) has them fixed by that run, so ``attnlab train --init-from`` refuses
# them (its block size may shrink) and its config.json does not record them
ARCHITECTURE_OPTIONS = ("preset", "arch", "n_layer", "n_head", "d_model", "pos", "norm", "ffn",
                        "kv_heads", "qk_norm", "tokenizer", "vocab_size", "min_freq",
                        "src_tokenizer", "tgt_tokenizer", "patch_size", "score",
                        "attention", "bos")  # fmt: skip


@dataclasses.dataclass
class InitFrom:
    """The run a new run starts from (``attnlab train --init-from RUN``): where it is, its
    model_type and its model's config (config.json's ``config``). The new run trains that
    model with its weights and tokenizer; the task changes only its ``block_size`` (it may
    shrink), its ``dropout``, and its head (``Task.head_fields``). Recorded in the new run's
    config.json as ``init_from`` (with the source's own provenance, ``source``), so that
    ``--resume`` rebuilds the same model."""

    path: str
    model_type: str
    config: dict
    source: dict | None = None  # the source run's "source" (import-hf's provenance), if any
    labels: list | None = None  # the source's class names, if it names them

    def to_dict(self) -> dict:
        d = {"path": self.path, "model_type": self.model_type, "config": self.config}
        d.update({k: v for k, v in (("source", self.source), ("labels", self.labels)) if v})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> InitFrom:
        from attnlab.rundir import RunError

        if not (isinstance(d, dict) and isinstance(d.get("config"), dict)
                and isinstance(d.get("model_type"), str)):  # fmt: skip
            raise RunError("config.json: init_from must record path, model_type and config")
        return cls(
            str(d.get("path", "")), d["model_type"], d["config"], d.get("source"), d.get("labels")
        )


def on(result) -> str:
    """`` on 20 sampled held-out batches (15,360 tokens)``: what a summary's val loss was
    computed on (``TrainResult.val_on``), or nothing where it was not said."""
    return f" on {result.val_on}" if getattr(result, "val_on", "") else ""


class Task:
    """What the Trainer needs to train a model on one kind of problem (see module docstring).

    Class attributes say what the task is; an instance holds its data, once ``prepare`` (a new
    run) or ``reload`` (a run directory) has read it.
    """

    name: ClassVar[str]  # its name in registered() and in config.json's "task"
    order: ClassVar[int] = 0  # its place in --task's choices (lower first)
    label: ClassVar[str] = ""  # how errors name it, e.g. "--task lm"
    Options: ClassVar[type[BaseConfig]]  # its options, each with its default
    train_defaults: ClassVar[dict[str, Any]] = {}  # TrainConfig fields it sets otherwise
    unit: ClassVar[str] = "examples"  # what throughput counts: tokens, pairs, images, examples
    loss_unit: ClassVar[str] = "nats / example"
    metrics: ClassVar[tuple[Metric, ...]] = ()  # its figures, besides val_loss
    best: ClassVar[str] = "val_loss"  # the metric that chooses best/
    data_files: ClassVar[tuple[str, ...]] = ()  # files prepare() writes into the run directory
    splits: ClassVar[tuple[str, ...]] = ("val", "train")  # what eval scores; the first by default
    eval_reads: ClassVar[frozenset[str]] = frozenset({"data", "split", "limit"})  # EvalOptions'

    def __init__(self, options: BaseConfig, seed: int = 1337):
        self.options = options
        self.seed = seed
        self.tokenizer = None
        self.init: InitFrom | None = None  # the run whose weights and tokenizer it starts from
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

    # -- fine-tuning (--init-from) -------------------------------------------------------------

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        """Can this task train a model of the registered ``model_class`` that another run
        holds (``attnlab train --init-from``)? None can unless it says so."""
        return False

    def head_fields(self) -> dict[str, Any]:
        """The model config fields this task's head sets on a model it starts from another
        run (a classifier's ``num_labels``); a head the source lacks starts fresh."""
        return {}

    def fresh(self) -> tuple[str, ...]:
        """Prefixes of the parameters that start fresh rather than from the source's tensors
        of the same name (a classifier over other labels)."""
        return ()

    def init_model_config(self) -> BaseConfig:
        """The config of the model ``self.init`` holds, as this task trains it: its
        ``block_size`` and ``dropout`` where the options give them, and the task's head."""
        from attnlab.models.declare import registered

        fields = dict(self.init.config)
        for name in ("block_size", "dropout"):
            value = getattr(self.options, name, None)
            if value is not None and name in fields:
                fields[name] = value
        cls = registered()[self.init.model_type]
        return cls.config_class.from_dict({**fields, **self.head_fields()})

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

    # the held-out loss is the mean over val_batches: a sample of the split, or all of it
    val_whole: ClassVar[bool] = False

    def val_source(self, batches: list) -> str:
        """What ``val_loss`` is computed on, in words: ``20 sampled held-out batches (15,360
        tokens)``, or ``the whole held-out split (359 images)``. Training's val loss, and
        ``heads --importance``'s intact loss by default, are this one figure; ``attnlab
        eval`` scores the whole split."""
        n = sum(self.count(b) for b in batches)
        if self.val_whole:
            return f"the whole held-out split ({n:,} {self.unit})"
        return f"{len(batches)} sampled held-out batches ({n:,} {self.unit})"

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
        if self.init is None:
            return {"task": self.name, "task_options": self.options.to_dict()}
        options = {k: v for k, v in self.options.to_dict().items()
                   if k not in ARCHITECTURE_OPTIONS}  # fmt: skip
        return {"task": self.name, "task_options": options, "init_from": self.init.to_dict()}

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
            f"val loss {val:.4f}{on(result)}" if val is not None else "no validation split"
        )

    # -- after training ------------------------------------------------------------------------

    def predict(self, model: nn.Module, inputs: list[str], options: PredictOptions | None = None,
                **given) -> list[dict]:  # fmt: skip
        """What the trained model says about each input (one dict per input); ``options`` or
        keyword arguments (``top_k=3``) override ``PredictOptions``'s defaults."""
        raise NotImplementedError(f"the {self.name} task has no prediction yet")

    def predict_recorded(self, model: nn.Module, rec, options: PredictOptions) -> dict | None:
        """``predict``'s answer for the one input of ``rec``, read off that recorded forward
        pass (an ``attnlab.inspect.Recording``: its ``text``, ``logits``, ``cache``, ``ids``
        and ``extra``) instead of a pass of its own: ``Run.predict`` shares one pass with the
        tools that look inside (the workbench's panels). None where this task's answer needs
        another pass (a beam search) or the recording does not hold it: ``predict`` then runs
        its own."""
        return None

    def prediction_lines(self, pred: dict) -> list[str]:
        """One prediction as terminal lines."""
        return [str(pred)]

    def score(self, model: nn.Module, options: EvalOptions | None = None) -> Evaluation:
        """The task's figures on ``options.data`` or, without it, on the held-out split that
        ``reload`` rebuilt (``open_task(run, with_data=True)``)."""
        raise NotImplementedError(f"the {self.name} task has no evaluation yet")

    def eval_fields(self, options: EvalOptions) -> frozenset[str]:
        """The EvalOptions fields ``score`` reads with ``options`` (``eval_reads``; a task
        whose options change with ``--data`` says so here)."""
        return self.eval_reads

    def check_eval_options(self, options: EvalOptions) -> None:
        """A ConfigError naming the first option set away from its default that this task's
        ``score`` does not read (``eval_fields``): eval --beam of a GPT was taken and ignored."""
        default, reads = EvalOptions(), self.eval_fields(options)
        ignored = [f.name for f in dataclasses.fields(EvalOptions)
                   if f.name not in reads and getattr(options, f.name) != getattr(default, f.name)]  # fmt: skip
        if ignored:
            flags = [f"--{n.replace('_', '-')}" for n in [ignored[0], *sorted(reads)]]
            raise ConfigError(f"{flags[0]} does not apply to eval of this {self.name} run (it "
                              f"reads {', '.join(flags[1:])})")  # fmt: skip

    def check_split(self, options: EvalOptions) -> str:
        """The split ``eval`` scores: ``options.split`` if this task has it, else its first."""
        split = options.split or self.splits[0]
        if split not in self.splits:
            raise ConfigError(f"--split {split}: runs of the {self.name} task have the splits "
                              f"{', '.join(self.splits)}")  # fmt: skip
        return split


def predict_options(options: PredictOptions | None, given: dict) -> PredictOptions:
    """``options`` with the keyword arguments ``given`` applied (PredictOptions' defaults)."""
    base = options.to_dict() if options is not None else {}
    return PredictOptions.from_dict({**base, **given})
