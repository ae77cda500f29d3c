"""Training: the Trainer (the only training loop in attnlab) and what it is made of.

optim.py        AdamW groups and the learning-rate schedules (cosine, noam, constant)
loop.py         the Trainer: steps, evaluations, best/, checkpoints, signals, NaN stop
progress.py     progress on stderr, in the task's words
plots.py        loss.png
distributed.py  DistributedDataParallel set-up through torchrun
state.py        the RNG states a checkpoint restores
faults.py       fault injection for the tests (a Trainer callback)
run.py          train a task into a run directory: what `attnlab train` calls

TrainConfig (``attnlab.train_config``) and Metric (``attnlab.metrics``) live below the tasks,
which state their defaults and figures with them; both are re-exported here, as is the run
directory the Trainer writes (``RunDir``, from ``attnlab.rundir``).
"""

from attnlab.metrics import Metric
from attnlab.rundir import RunDir
from attnlab.train_config import TrainConfig
from attnlab.training.distributed import DistInfo, init_distributed
from attnlab.training.loop import Trainer, TrainingError, TrainResult
from attnlab.training.optim import lr_at, make_optimizer
from attnlab.training.plots import plot_metrics

__all__ = [
    "DistInfo",
    "Metric",
    "RunDir",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingError",
    "init_distributed",
    "lr_at",
    "make_optimizer",
    "plot_metrics",
]
