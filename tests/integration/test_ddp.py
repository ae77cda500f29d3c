"""DistributedDataParallel on 2 CPU processes (gloo), for every task: each process keeps its
half of the global batch, and the averaged gradients equal those of one process computing both
halves (the mean of the two halves' gradients)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from attnlab.training import DistInfo, TrainConfig, Trainer, init_distributed
from attnlab.training import run as training
from task_helpers import TASKS, given, write_task_data

CFG = dict(max_iters=1, batch_size=3, lr=1e-3, warmup_iters=0, eval_interval=100, eval_iters=1,
           log_interval=1, device="cpu", grad_clip=0.0)  # fmt: skip


def _task(task_id: str, d, seed: int):
    p = training.plan(given(task_id, d, d / f"run-{task_id}"))
    task = p.task(p.options, seed=1337)
    task.prepare(None if task_id != "lm" else d / f"tokens-{task_id}-{seed}")
    torch.manual_seed(seed)  # different weights on each rank: DDP must broadcast rank 0's
    return task, task.build_model()


def _worker(rank: int, world: int, port: int, d: str) -> None:
    from pathlib import Path

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    info = init_distributed(torch.device("cpu"))
    d = Path(d)
    for task_id in TASKS:
        task, model = _task(task_id, d, seed=rank)
        trainer = Trainer(model, task, TrainConfig(**CFG), dist_info=info, quiet=True)
        trainer.model.eval()  # no dropout: each process would draw its own masks
        batch = next(trainer.train_batches)
        task.loss(trainer.model, batch).backward()  # DDP averages the gradients here
        if rank == 0:
            raw = trainer.raw_model
            save_file({n: p.grad for n, p in raw.named_parameters() if p.grad is not None},
                      str(d / f"{task_id}.grads"))  # fmt: skip
            save_file({n: p.detach() for n, p in raw.named_parameters()}, str(d / f"{task_id}.w"))
    # both ranks leave together: a rank that tears the group down while its peer still
    # writes can abort gloo's threads in the peer (SIGABRT, seen on a loaded 2-core machine)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_averaged_gradients_equal_one_process_on_both_halves_for_every_task(tmp_path):
    d = write_task_data(tmp_path)
    (d / "tokens-lm-0").mkdir()
    (d / "tokens-lm-1").mkdir()
    mp.spawn(_worker, args=(2, _free_port(), str(d)), nprocs=2, join=True)
    (d / "tokens-lm-9").mkdir()
    for task_id in TASKS:
        ddp_grads = load_file(str(d / f"{task_id}.grads"))
        task, model = _task(task_id, d, seed=9)
        model.load_state_dict(load_file(str(d / f"{task_id}.w")), strict=False)  # rank 0's
        model.eval()
        whole = next(task.train_batches(6, 1337))  # the global batch: both ranks' rows
        for half in (slice(0, 3), slice(3, 6)):
            (task.loss(model, tuple(t[half] for t in whole)) / 2).backward()
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            torch.testing.assert_close(ddp_grads[name], p.grad, rtol=1e-4, atol=1e-6,
                                       msg=f"{task_id}: {name}")  # fmt: skip


def test_single_process_is_not_distributed():
    assert init_distributed() == DistInfo() and not DistInfo().enabled


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["lm", "transformer"])
def test_torchrun_trains_a_run_that_rank_0_alone_writes(task_id, tmp_path):
    """Two processes through torchrun: rank 0 prepares the data (the LM's token shards) and
    writes the run; rank 1 reads what rank 0 prepared; the run loads and its steps are all
    there."""
    import subprocess
    import sys

    from attnlab.run import load_run
    from attnlab.rundir import read_trainer_state
    from cli_helpers import SRC
    from task_helpers import train_args

    d = write_task_data(tmp_path)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), "-m", "attnlab",
           *train_args(task_id, d, out, "--max-iters", "4", "--eval-interval", "2")]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("best/ holds the best model") == 1  # rank 0 reports, rank 1 not
    assert read_trainer_state(out)["world_size"] == 2 and read_trainer_state(out)["step"] == 4
    load_run(out)
