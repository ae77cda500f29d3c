"""Train a task into a run directory: what ``attnlab train`` does, as two library calls.

    p = plan({"task": "seq2seq", "data": "dates", "arch": "lstm-attention"})  # checks options
    outcome = train(p)            # prepares the data, trains, writes p.out; see TrainOutcome

``plan`` checks every option and reads or writes nothing. Its options are ``attnlab train``'s,
every one of them (``--threads`` too), so a run planned in Python is the run the command makes. An option that is not given takes
the task's default (``Task.option_defaults``). An option the task has no use for is refused.

``train`` chooses the CPU threads as every verb does (``runtime.using_threads``: ``threads``, else
OMP_NUM_THREADS, else one per core less those other processes keep busy), then holds the run
directory's writer lock (its ``RunDir``) while it:
  - a new run: refuses a directory that already holds a run; prepares the data and the
    tokenizer (bad data leaves nothing behind); builds the model from the seed;
  - ``init_from`` (``--init-from RUN``, fine-tuning): as a new run, but the data is read in
    RUN's tokenizer and the model is RUN's, its weights copied in (``start_from``) and its
    head the task's; ``plan`` has checked RUN (``fine_tune_source``) and refused what would
    change its architecture; config.json records it as ``init_from``, for ``--resume``;
  - ``resume``: rebuilds the task from the run's config.json (its options, its tokenizer, its
    data) and refuses any typed option that would change the run, except those in RESUMABLE;
  - trains with the Trainer, and records the final figures in config.json.
Under ``torchrun`` every process calls both; rank 0 alone prepares the data and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from attnlab import rundir
from attnlab.config import BaseConfig, ConfigError
from attnlab.heartbeat import Heartbeat, stamped
from attnlab.rundir import RunDir
from attnlab.runtime import THREADS_PER_CORE_MAX, max_threads, resolve_device, using_threads
from attnlab.tasks.base import ARCHITECTURE_OPTIONS, InitFrom, Task, task_class, task_for_run
from attnlab.train_config import TrainConfig
from attnlab.training.distributed import barrier, init_distributed, shutdown
from attnlab.training.loop import Trainer, TrainResult
from attnlab.training.memory import check_fits, size_warnings

RUN_OPTIONS = {"task", "out", "resume", "quiet", "log", "threads", "force", "init_from"}
# Options that may change when a run is resumed; every other one comes from the run.
RESUMABLE = {"max_iters", "eval_interval", "eval_iters", "log_interval", "checkpoint_seconds",
             "device", "dtype", "compile", "compile_backend", "fsdp"}  # fmt: skip
IGNORED_ON_RESUME = {"data", "encoding"}  # the run's own data is read again
# --init-from without --block-size trains on windows of the run's block size, at most this
# many tokens: an imported Qwen's 32,768 positions would make every window (and the memory
# its activations take) 32 times GPT-2's
INIT_BLOCK_SIZE = 1024
# option names that are ordinary words in messages: not rewritten as --flags
WORDS = {"data", "encoding", "device", "seed", "compile", "arch", "task", "out"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def as_flags(message: str, names) -> str:
    """'lr must be positive' -> '--lr must be positive': the option as the user typed it."""
    for name in sorted(set(names) - WORDS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}\b", flag(name), message)
    return message


def option_names(cls: type[Task]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls.Options) + dataclasses.fields(TrainConfig)}


@dataclasses.dataclass
class TrainPlan:
    task: type[Task]
    options: BaseConfig
    config: TrainConfig
    given: dict
    out: Path
    resume: bool = False
    quiet: bool = False
    log: str | None = None  # an experiment tracker: "tensorboard" (attnlab.training.tracking)
    threads: int | None = None  # CPU threads; None: the busy-machine choice (attnlab.runtime)
    force: bool = False  # train even past the memory estimate (attnlab.training.memory)
    init_from: InitFrom | None = None  # the run whose weights and tokenizer it starts from


@dataclasses.dataclass
class TrainOutcome:
    result: TrainResult
    task: Task
    final: dict  # figures measured after training (e.g. test accuracy)
    summary: str  # the result line for stdout
    out: Path
    main: bool = True  # rank 0 (the one process that reports)

    def to_dict(self) -> dict:
        """The outcome as JSON-ready data (``attnlab train --json``): the run directory, the
        task, the last step, the last evaluation's figures, the best one and the final ones."""
        r = self.result
        return {"run": str(self.out), "task": self.task.name, "step": r.step,
                "train_loss": r.train_loss, "val_loss": r.val_loss, "val_loss_on": r.val_on,
                "best": r.best,
                "metrics": {k: v for k, v in r.last_eval.items() if k != "lr"},
                "final": self.final, "summary": self.summary}  # fmt: skip


def plan(given: dict) -> TrainPlan:
    """Check the options of a training run (names as in ``attnlab train --help``, None = not
    given); raises ConfigError naming the option as typed. Reads and writes nothing."""
    # None: not given; False from a flag of the run itself (--resume, --quiet) is not given
    # either, but --no-compile's False is a choice
    given = {k: v for k, v in given.items()
             if v is not None and not (v is False and k in RUN_OPTIONS)}  # fmt: skip
    init = planned = None
    if given.get("init_from") and not given.get("resume"):
        init, cls, planned = fine_tune_source(given)  # may set block_size: the source's
    elif given.get("resume") and "task" not in given and given.get("out"):
        cls = task_for_run(rundir.read_run_config(given["out"]))  # the run says what it is
    else:
        cls = task_class(given.get("task") or "lm").redirect(given)
    opt_fields = {f.name for f in dataclasses.fields(cls.Options)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    names = option_names(cls)
    for key in given:
        if key not in names | RUN_OPTIONS:
            hint = getattr(cls, "hint", "")
            raise ConfigError(f"{flag(key)} does not apply to {cls.label}" + (f" {hint}" if hint else ""))  # fmt: skip
    try:
        options = cls.Options(**{k: v for k, v in given.items() if k in opt_fields})
        values = {
            **cls.defaults_for(given),
            **{k: v for k, v in given.items() if k in train_fields},
        }
        config = TrainConfig(**values)
        device = resolve_device(config.device)  # --device cuda without a GPU: said before any work
        check_fsdp(config)
        if not given.get("resume"):  # a run too big for the device: refused before it is built
            check_fits(options, config, device, force=bool(given.get("force")), planned=planned)
    except ConfigError as e:
        raise ConfigError(as_flags(str(e), names)) from None
    if not options.data and not given.get("resume"):
        raise ConfigError(f"{cls.label} needs --data (see attnlab train --help)")
    if config.optimizer == "muon" and not cls.self_attention(options):
        raise ConfigError(
            f"--optimizer muon updates the matrices of transformer blocks, and this {cls.label} "
            "model has none (an LSTM's matrices are its recurrent cell's): train it with "
            "--optimizer adamw"
        )
    if config.snapshot_every and not cls.self_attention(options):
        raise ConfigError(
            f"--snapshot-every records self-attention heads, and this {cls.label} model has "
            "none (an LSTM's one attention reads the encoder from the decoder, or pools a "
            "classifier's states)"
        )
    threads = given.get("threads")
    if threads is not None and (type(threads) is not int or threads < 1):
        raise ConfigError(f"--threads must be an integer of at least 1, got {threads!r}")
    if threads is not None and threads > max_threads():  # before torch is told: see runtime
        raise ConfigError(f"--threads must be at most {max_threads()} ({THREADS_PER_CORE_MAX} "
                          f"per core this process may use), got {threads}")  # fmt: skip
    if given.get("log"):  # its package checked now: before any data is read or step trained
        from attnlab.training.tracking import require

        require(given["log"])
    out = Path(given["out"]) if given.get("out") else cls.default_out(options)
    return TrainPlan(cls, options, config, given, out, bool(given.get("resume")),
                     bool(given.get("quiet")), given.get("log"), threads,
                     bool(given.get("force")), init)  # fmt: skip


def fine_tune_source(given: dict) -> tuple[InitFrom, type[Task], BaseConfig]:
    """What ``--init-from RUN`` starts from, checked without reading a weight: the run (its
    config.json, weights' header and tokenizer agree), the task that trains it (``--task``, or
    the run's own), and the model config the new run will train. Refused in one line: a
    missing or broken run, a run without a tokenizer, a model the task cannot train (naming
    the tasks that can), an option that would change the architecture or the vocabulary, a
    block size longer than the run's. Sets ``given["block_size"]`` to the run's, at most
    INIT_BLOCK_SIZE, when not given (a task whose options have one)."""
    from attnlab.models.declare import max_positions
    from attnlab.tasks import registered

    path = given["init_from"]
    try:
        checked = rundir.check_run(path)
    except OSError as e:
        raise ConfigError(f"--init-from {path}: cannot read it ({e.strerror or e})") from None
    except rundir.RunError as e:
        raise ConfigError(f"--init-from {e}") from None
    cfg, model = checked.config, checked.model
    what = f"{path} holds a model of kind {model.kind}"
    for name in ARCHITECTURE_OPTIONS:
        if name in given:
            raise ConfigError(
                f"{flag(name)} would change the model --init-from starts from ({what}); drop "
                "it: a fine-tuned run keeps its architecture and tokenizer (--block-size may "
                "shrink)"
            )
    if checked.tokenizer is None:
        raise ConfigError(f"--init-from {path}: the run has no tokenizer.json, so new data "
                          "cannot be read in its vocabulary")  # fmt: skip
    able = [name for name, task in registered().items() if task.fine_tunes(type(model))]
    remedy = (
        f"fine-tune it with {' or '.join(f'--task {n}' for n in able)}"
        if able
        else "train a new model instead (without --init-from)"
    )
    if "task" in given:
        cls = task_class(given["task"]).redirect({**given, "model_type": cfg.get("model_type")})
    elif type(model).default_task(cfg.get("config") or {}) is None:
        raise ConfigError(f"--init-from: {what}, which has no prediction head: {remedy}")
    else:
        cls = task_for_run(cfg)
    if not cls.fine_tunes(type(model)):
        raise ConfigError(f"--init-from: {what}, which {cls.label} cannot train: {remedy}")
    longest = max_positions(model)
    opt_fields = {f.name for f in dataclasses.fields(cls.Options)}
    if (
        given.get("block_size") is not None
        and longest is not None
        and given["block_size"] > longest
    ):
        raise ConfigError(
            f"--block-size {given['block_size']} is longer than the {longest} positions of "
            f"{path}: a fine-tuned model's block size may shrink, not grow"
        )
    if given.get("block_size") is None and longest is not None and "block_size" in opt_fields:
        given["block_size"] = min(longest, INIT_BLOCK_SIZE)
    init = InitFrom(str(Path(path).resolve()), cfg["model_type"], dict(cfg["config"]),
                    cfg.get("source") or (cfg.get("init_from") or {}).get("source"),
                    cfg.get("labels"))  # fmt: skip
    sizes = {k: given[k] for k in ("block_size", "dropout") if given.get(k) is not None}
    planned = type(model).config_class.from_dict({**init.config, **sizes})
    return init, cls, planned


def check_fsdp(config: TrainConfig) -> None:
    """--fsdp shards over the processes torchrun starts: one process has nothing to shard."""
    if config.fsdp and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        raise ConfigError(
            "--fsdp shards the model over several processes: launch them with torchrun "
            "--nproc_per_node N -m attnlab train ... --fsdp"
        )
    if config.fsdp and config.optimizer == "muon":  # a shard is not the matrix Muon orthogonalises
        raise ConfigError(
            "optimizer muon does not work with fsdp: Muon orthogonalises each whole matrix, and "
            "fsdp holds a shard of it in each process; train with optimizer adamw, or without fsdp"
        )
    if config.fsdp and config.snapshot_every:  # rank 0 alone would wait for the others' shards
        raise ConfigError(
            "snapshot_every does not work with fsdp yet: a snapshot runs the whole model in one "
            "process while the others hold its shards; train with snapshot_every 0 or without fsdp"
        )


def train(p: TrainPlan, log: Callable[[str], None] | None = None,
          callbacks: Sequence = ()) -> TrainOutcome:  # fmt: skip
    """Prepare (or reopen), train and record the run ``p`` describes, on the CPU threads
    ``p.threads`` or the busy-machine rule gives (torch's count as it was afterwards).
    ``callbacks`` are the Trainer's, after those ``p`` asks for (a test's fault injection)."""
    log = stamped(log or (lambda msg: print(msg, file=sys.stderr, flush=True)))
    with using_threads(p.threads):  # the Trainer says the choice (first line, config.json)
        return _locked(p, log, callbacks)


def _locked(p: TrainPlan, log: Callable[[str], None], callbacks: Sequence = ()) -> TrainOutcome:
    """``train`` in the run directory's writer lock, in the process group."""
    device = resolve_device(p.config.device)
    source = _source(p)  # the run --init-from starts from: read (its weights checked finite)
    # before anything is written or printed
    # One writer per run directory, whatever the task: a second train into p.out is refused
    # here, naming this process, until it ends (kill -9 too). Rank 0 alone takes it, and for a
    # new run makes the directory (refused where one is: continue it with --resume).
    main = os.environ.get("RANK", "0") == "0"
    with rundir.writing(p.out, writer=main, new=not p.resume) as run_dir:
        dist = init_distributed(device)
        try:
            outcome = _train(p, run_dir, dist, device, log, callbacks, source)
            # every process leaves together: one that closes its gloo connections while rank 0
            # still writes the run's last files could cut a peer off mid-read (gloo aborts)
            barrier(dist)
            return outcome
        except ConfigError as e:  # found in the data (an image size, ...): name the option typed
            raise ConfigError(as_flags(str(e), option_names(p.task))) from None
        finally:
            shutdown(dist)


def _source(p: TrainPlan):
    """(model, tokenizer) of the run a new run fine-tunes (``--init-from``), read and checked
    once; None otherwise. Its tokenizer, there when the run was planned, may be gone since."""
    if p.init_from is None or p.resume:
        return None
    model, tokenizer = rundir.open_model(p.init_from.path)
    if tokenizer is None:
        raise rundir.RunError(f"--init-from {p.init_from.path}: its tokenizer.json is gone")
    return model, tokenizer


def _train(p: TrainPlan, run_dir: RunDir, dist, device, log, callbacks,
           source=None) -> TrainOutcome:  # fmt: skip
    """The body of ``train``, in the process group ``dist`` (``source``: see ``_source``)."""
    if p.resume:
        task, config, model = _reopen(p, run_dir, log)
    else:
        task, config = p.task(p.options, seed=p.config.seed), p.config
        if source is not None:  # fine-tuning: the run's tokenizer, then its weights
            task.init = p.init_from
            source, task.tokenizer = source
        if not p.quiet and dist.is_main:
            task.log = log
        beat = _heartbeat(log, p.quiet or not dist.is_main)
        model = _prepare(task, run_dir, beat, source, dist.enabled) if dist.is_main else None
        barrier(dist)
        if model is None:  # the other processes read what rank 0 prepared
            task.reload(p.out, run_dir.read_tokenizer(), {})
            model = _build(task, config)
            if task.init is not None:  # each process starts where rank 0 does
                start_from(model, task, source)
    if dist.is_main and not p.quiet:
        for line in size_warnings(model, config, task, device):
            log(f"attnlab: warning: {line}")
    with _heartbeat(log, p.quiet or not dist.is_main)("setting up the optimizer"):
        trainer = Trainer(model, task, config, run_dir, dist_info=dist, quiet=p.quiet, log=log,
                          callbacks=[*_callbacks(task, config, p.log), *callbacks])  # fmt: skip
    if p.resume:  # a checkpoint that cannot be continued: one line, before anything else
        trainer.load_checkpoint()
        if task.model_config().to_dict() != model.config.to_dict():
            raise rundir.RunError(
                f"{p.out / rundir.CONFIG_FILE}: its model config is not the one the run's task "
                "options and tokenizer give; it was edited, so it cannot be resumed"
            )
    if dist.is_main and not p.quiet:
        log(f"{task.describe(model)}; run directory {p.out}")
    result = trainer.fit(resume=p.resume)
    final: dict = {}
    if not result.interrupted:
        with trainer.unsharded():  # FSDP: every process gathers, rank 0 measures
            final = task.finish(trainer.raw_model) if dist.is_main else {}
    if not result.interrupted and dist.is_main:
        metrics = {k: v for k, v in result.last_eval.items() if k != "lr"}
        extra = {**trainer.run_record(), "metrics": metrics, **final}
        rundir.write_run_config(p.out, trainer.raw_model, extra)  # the final figures too
    summary = task.summary(result, final)
    return TrainOutcome(result, task, final, summary, p.out, dist.is_main)


ICL_WINDOWS = 32  # held-out windows the snapshots' in-context learning score is averaged over


def _callbacks(task: Task, config: TrainConfig, log: str | None = None) -> list:
    """What watches the run besides the loop: snapshots when ``snapshot_every`` asks, an
    experiment tracker when ``log`` names one."""
    out: list = []
    if log == "tensorboard":
        from attnlab.training.tracking import TensorBoardLog

        out.append(TensorBoardLog())
    if not config.snapshot_every:
        return out
    from attnlab.training.snapshots import PATTERN_TOKENS, Snapshots

    sample = task.sample_inputs(4, PATTERN_TOKENS)
    inputs, ids = sample if sample is not None else (None, True)
    windows = task.sample_inputs(ICL_WINDOWS, 1 << 20)  # as long as the block: the ICL score
    context = windows[0] if windows is not None and windows[1] else None
    return [*out, Snapshots(config.snapshot_every, inputs, ids, seed=config.seed,
                            context=context)]  # fmt: skip


def _build(task: Task, config: TrainConfig):
    torch.manual_seed(config.seed)
    return task.build_model()


def _heartbeat(log, quiet: bool):
    """``Heartbeat(what)`` saying through ``log``, or nothing when the run is quiet."""
    return (lambda what: contextlib.nullcontext()) if quiet else (lambda what: Heartbeat(what, log))


def _prepare(task: Task, run_dir: RunDir, beat, source=None, shared: bool = False):
    """A new run's data, tokenizer and model (with --init-from, the weights of the run it
    starts from, ``source``, copied in), in the directory ``writing`` made; bad input leaves
    nothing behind. ``shared`` (a torchrun job): the tokenizer is written at once, for the
    other processes to read (``start`` writes it for a single process, with config.json).
    ``beat(what)`` keeps building a large model from being silent (the data's own steps say
    themselves once the data is checked: no line may come before a data error's)."""
    try:
        task.prepare(run_dir.path)
        if shared:
            run_dir.write_tokenizer(task.tokenizer)
        torch.manual_seed(task.seed)
        with beat("building the model"):
            model = task.build_model()
        if task.init is not None:  # --init-from: its weights (a run gone since: nothing kept)
            with beat(f"reading the weights of {task.init.path}"):
                task.log(start_from(model, task, source))
        return model
    except BaseException:
        run_dir.discard(task.data_files)
        raise


def _reopen(p: TrainPlan, run_dir: RunDir, log) -> tuple[Task, TrainConfig, torch.nn.Module]:
    """The task and train config of the run in ``p.out`` (with the changes --resume allows),
    and the model its config.json describes (whose checkpoint is then checked against it)."""
    out = p.out
    # config.json, the weights' header and the tokenizer must agree before the model config.json
    # describes is built for real: an edited config could otherwise allocate without bound
    checked = run_dir.reopen()
    cfg = checked.config
    cls = task_for_run(cfg)
    if "task" in p.given and cls is not p.task:
        raise rundir.RunError(
            f"{out}: a {cfg.get('task', 'lm')} run ({cfg.get('model_type')}), not --task "
            f"{p.given['task']}; resume it without --task"
        )
    saved = cfg.get("task_options")
    if not isinstance(saved, dict):
        raise rundir.RunError(
            f"{out}: config.json does not record the task's options (an older attnlab wrote "
            "it), so it cannot be resumed; start a new run"
        )
    state = checked.state
    saved_train = (state or {}).get("train_config") or cfg.get("train_config") or {}
    model_cfg = cfg.get("config") or {}
    defaults = {f.name: f.default for f in dataclasses.fields(cls.Options)}
    if cfg.get("init_from") is not None:  # its source fixes these: refused below, saying so
        defaults = {k: v for k, v in defaults.items() if k not in ARCHITECTURE_OPTIONS}
    for name in sorted(set(p.given) - RUN_OPTIONS - RESUMABLE - IGNORED_ON_RESUME):
        was = [d[name] for d in (saved_train, saved, model_cfg) if name in d]
        if not was and name in defaults:  # a task option config.json leaves out when unset
            was = [defaults[name]]
        if was and p.given[name] not in was:
            trained = "without it" if was[0] in (None, False) else f"with {was[0]}"
            raise ConfigError(
                f"{flag(name)} cannot change on --resume (the run was trained {trained}); "
                "start a new run with another --out instead"
            )
    try:
        options = cls.Options.from_dict(saved)
        changes = {k: v for k, v in p.given.items() if k in RESUMABLE}
        config = TrainConfig.from_dict({**saved_train, **changes})
    except (ConfigError, TypeError) as e:
        raise rundir.RunError(
            f"{out / rundir.CONFIG_FILE}: cannot resume with these settings ({e})"
        ) from None
    task = cls(options, seed=config.seed)
    if cfg.get("init_from") is not None:  # fine-tuned: its model config is the source's
        task.init = InitFrom.from_dict(cfg["init_from"])
    for name in ARCHITECTURE_OPTIONS if task.init is not None else ():
        if name in p.given:  # the run it started from fixes them
            raise ConfigError(f"{flag(name)} would change the model of a fine-tuned run "
                              f"(started from {task.init.path}); drop it to resume")  # fmt: skip
    given_init = p.given.get("init_from")
    if given_init and (task.init is None
                       or Path(given_init).resolve() != Path(task.init.path).resolve()):  # fmt: skip
        was = f"was started from {task.init.path}" if task.init else "was not fine-tuned"
        raise ConfigError(f"--init-from cannot change on --resume (the run {was}); drop "
                          "--init-from to continue it")  # fmt: skip
    task.reload(out, checked.tokenizer, cfg)
    if state is None:
        log(f"{out}: no checkpoint written yet, starting from step 0 with the run's settings")
    torch.manual_seed(config.seed)  # the model config.json describes, built to be trained
    return task, config, type(checked.model)(checked.model.config)


def start_from(model: torch.nn.Module, task: Task, source: torch.nn.Module | None = None) -> str:
    """Copy the weights of the run ``task.init`` names into ``model`` (built from its config,
    with the task's head and block size), read through the one loader
    (``rundir.open_model``); returns what it did, in one line. Each tensor comes from the
    source's tensor of the same name, a table with one row per position keeps its first
    block_size rows, and a head the source lacks (or that ``task.fresh`` names) keeps the
    initialisation it was built with. ``source``: that run's model, where it was read already."""
    from attnlab.models.declare import max_positions

    init = task.init
    if source is None:  # read now (the other processes of a torchrun job)
        source, _ = rundir.open_model(init.path)
    theirs = source.state_dict()
    blocks = (init.config.get("block_size"), max_positions(model))
    copied, fresh, cut = set(), [], []
    with torch.no_grad():
        for name, mine in model.state_dict().items():
            their = theirs.get(name)
            if their is None or name.startswith(task.fresh()):
                fresh.append(name)
                continue
            if (their.shape != mine.shape and their.shape[1:] == mine.shape[1:]
                    and (their.shape[0], mine.shape[0]) == blocks):  # fmt: skip
                their = their[: mine.shape[0]]  # (block_size, C): the first positions
                cut.append(name)
            if their.shape != mine.shape:
                raise rundir.RunError(f"{init.path}: {name} is {tuple(their.shape)}; the model "
                                    f"it starts needs {tuple(mine.shape)}")  # fmt: skip
            mine.copy_(their)
            copied.add(mine.data_ptr())
    fresh = [n for n, t in model.state_dict().items() if n in fresh and t.data_ptr() not in copied]
    n = sum(1 for t in model.state_dict().values() if t.data_ptr() in copied)
    said = f"starting from the weights of {init.path} ({n} tensors"
    if fresh:
        said += f"; new: {', '.join(fresh)}"
    if cut:
        said += f"; position tables cut to the first {blocks[1]}"
    return said + ")"
