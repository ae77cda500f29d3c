"""TrainConfig: how a model is trained, in one self-validating dataclass that a checkpoint stores.

Three settings follow ``max_iters`` when they are not given, so that a short run is still warmed
up, evaluated and decayed in proportion (a 40-step run is not all warmup):
    warmup_iters    = min(100, max_iters // 10)
    eval_interval   = min(250, ceil(max_iters / 8))         (at most 8 evaluations a run)
    lr_decay_iters  = max_iters
    cooldown_iters  = max_iters // 3                         (schedule wsd's straight line down)
They are fixed when the config is made, so ``--resume`` with more ``--max-iters`` keeps the
schedule the run started with. A task that takes snapshots by default (induction) sets
``snapshot_every = default_snapshot_interval(max_iters)``: about 40 per run.

It sits below the tasks (a task states its default settings as a TrainConfig's fields) and
the Trainer, which both read it; it imports only ``attnlab.config``.
"""

from __future__ import annotations

import dataclasses

from attnlab.config import BaseConfig, ConfigError

SCHEDULES = ("cosine", "noam", "constant", "wsd")
OPTIMIZERS = ("adamw", "muon")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def default_warmup(max_iters: int) -> int:
    return max(0, min(100, max_iters // 10))


def default_cooldown(max_iters: int) -> int:
    return max_iters // 3


def default_eval_interval(max_iters: int) -> int:
    return min(250, max(1, -(-max_iters // 8)))  # ceil: a 12-step run evaluates 6 times, not 12


DEFAULT_SNAPSHOTS = 40  # a task that snapshots by default does so about this often per run


def default_snapshot_interval(max_iters: int) -> int:
    """Steps between snapshots when a task takes them by default: about 40 per run."""
    return max(1, max_iters // DEFAULT_SNAPSHOTS)


@dataclasses.dataclass
class TrainConfig(BaseConfig):
    max_iters: int = 2000
    batch_size: int = 12  # per process, per micro-step
    grad_accum: int = 1  # micro-steps per optimizer update
    lr: float = 1e-3  # peak learning rate
    min_lr: float = 1e-4  # cosine: the floor it decays to
    schedule: str = "cosine"  # cosine | noam | constant | wsd (see attnlab.training.optim.lr_at)
    warmup_iters: int | None = None  # None: min(100, max_iters // 10)
    lr_decay_iters: int | None = None  # None: max_iters
    cooldown_iters: int | None = None  # wsd: the linear cool-down's steps; None: max_iters // 3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    # adamw, or muon: Muon for the blocks' matrices, AdamW for the rest (training.optim)
    optimizer: str = "adamw"
    muon_lr: float = 0.02  # muon: Muon's peak learning rate (lr is the scalars')
    muon_momentum: float = 0.95
    embed_lr: float | None = None  # muon: AdamW's peak for the embeddings; None: lr
    head_lr: float | None = None  # muon: AdamW's peak for the output head; None: lr
    grad_clip: float = 1.0  # 0 = no clipping
    eval_interval: int | None = None  # None: min(250, ceil(max_iters / 8))
    eval_iters: int = 20  # batches of a task's validation set that are sampled, where it samples
    eval_batch_size: int | None = None  # the rows of those batches; None: batch_size
    log_interval: int = 10
    checkpoint_seconds: float = 30.0  # also checkpoint when this long has passed (0: evals only)
    seed: int = 1337
    device: str = "auto"
    dtype: str = "auto"  # autocast: auto, float32, bfloat16, float16
    compile: bool | None = None  # None: when the run is long enough to repay it (loop.py)
    compile_backend: str = "inductor"  # torch.compile backend ("aot_eager" compiles in seconds)
    snapshot_every: int = 0  # record attention and head scores every N steps (0: never)
    fsdp: bool = False  # under torchrun: shard parameters, gradients, optimizer state (FSDP)

    def __post_init__(self):
        n = self.max_iters if isinstance(self.max_iters, int) else 0
        if self.warmup_iters is None:
            self.warmup_iters = default_warmup(n)
        if self.eval_interval is None:
            self.eval_interval = default_eval_interval(n)
        if self.lr_decay_iters is None:
            self.lr_decay_iters = max(n, 1)
        if self.cooldown_iters is None:
            self.cooldown_iters = default_cooldown(n)
        super().__post_init__()

    def validate(self) -> None:
        self._positive("max_iters", "batch_size", "grad_accum", "lr", "eval_interval")
        self._positive("eval_iters", "log_interval", "lr_decay_iters")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"min_lr must be in [0, lr = {self.lr}], got {self.min_lr}")
        if self.warmup_iters < 0:
            raise ConfigError(f"warmup_iters must be >= 0, got {self.warmup_iters}")
        self._one_of("schedule", SCHEDULES)
        self._one_of("optimizer", OPTIMIZERS)
        self._positive("muon_lr")
        self._positive_or_none("embed_lr", "head_lr", "eval_batch_size")
        if self.cooldown_iters < 0:
            raise ConfigError(f"cooldown_iters must be >= 0, got {self.cooldown_iters}")
        self._fraction("muon_momentum")
        if self.schedule == "noam" and self.warmup_iters < 1:
            raise ConfigError("schedule noam needs warmup_iters >= 1")
        for name in ("weight_decay", "grad_clip", "checkpoint_seconds", "snapshot_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr * self.weight_decay >= 1:  # AdamW scales each weight by 1 - lr x decay
            raise ConfigError(
                f"weight_decay x lr must be below 1 (AdamW multiplies every weight by "
                f"1 - lr x weight_decay each step), got {self.weight_decay} x {self.lr}"
            )
        if self.optimizer == "muon" and self.muon_lr * self.weight_decay >= 1:
            raise ConfigError(
                f"weight_decay x muon_lr must be below 1 (Muon multiplies every matrix by "
                f"1 - muon_lr x weight_decay each step), got {self.weight_decay} x {self.muon_lr}"
            )
        self._fraction("beta1", "beta2")
        if self.compile not in (None, True, False):
            raise ConfigError(f"compile must be true, false or null (auto), got {self.compile!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
