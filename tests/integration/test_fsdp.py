"""FSDP (``--fsdp``) on 2 CPU processes (gloo): the same losses as DDP on the same global batch,
about half of DDP's parameter and optimizer memory in each process, for every kind of model;
through torchrun, an ordinary run directory that one process loads and that resumes exactly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from attnlab.cli import main
from attnlab.models.gpt import GPT
from attnlab.training import DistInfo, TrainConfig, Trainer, init_distributed
from attnlab.training import run as training
from attnlab.training.distributed import shard_units
from lm_helpers import train_losses
from task_helpers import TASKS, given, train_args, write_task_data

STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(model, task, fsdp: bool, info: DistInfo, steps: int, batch: int) -> tuple[list, int]:
    cfg = TrainConfig(max_iters=steps, batch_size=batch, lr=3e-3, warmup_iters=0,
                      eval_interval=1000, eval_iters=1, log_interval=1, device="cpu",
                      compile=False, fsdp=fsdp)  # fmt: skip
    trainer = Trainer(model, task, cfg, dist_info=info, quiet=True)
    result = trainer.fit()
    losses = [r["train_loss"] for r in result.history if "train_loss" in r and "val_loss" not in r]
    return losses, trainer.held_bytes()


def _small_gpt_task():
    """The ``small`` preset (6 layers, 6 heads, width 384) on random tokens, block 64."""
    from attnlab.tasks.lm import LanguageModel

    tokens = np.random.default_rng(0).integers(0, 65, 20_000).astype(np.uint16)
    return LanguageModel.from_tokens(tokens[:18_000], tokens[18_000:], preset="small",
                                     block_size=64, dropout=0.0)  # fmt: skip


def _task(task_id: str, d, out_name: str):
    from pathlib import Path

    p = training.plan(given(task_id, Path(d), Path(d) / out_name, "--dropout", "0"))
    task = p.task(p.options, seed=1337)
    task.prepare(None)
    return task


def _worker(rank: int, world: int, port: int, d: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    info = init_distributed(torch.device("cpu"))
    out: dict = {}
    task = _small_gpt_task()
    for fsdp in (False, True):
        torch.manual_seed(0)
        model = GPT(task.options.model_config(65))
        out["fsdp" if fsdp else "ddp"] = _train(model, task, fsdp, info, STEPS, batch=2)
    for task_id in TASKS:
        task = _task(task_id, d, f"run-{task_id}")
        for fsdp in (False, True):
            torch.manual_seed(0)
            model = task.build_model()
            out[f"{task_id}-{'fsdp' if fsdp else 'ddp'}"] = _train(model, task, fsdp, info, 2, 2)
    with open(os.path.join(d, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_fsdp_losses_equal_ddp_and_each_process_holds_half_the_state(tmp_path):
    d = write_task_data(tmp_path)
    mp.spawn(_worker, args=(2, _free_port(), str(d)), nprocs=2, join=True)
    ranks = [json.loads((d / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        (ddp, ddp_bytes), (fsdp, fsdp_bytes) = r["ddp"], r["fsdp"]
        assert len(ddp) == len(fsdp) == STEPS
        np.testing.assert_allclose(fsdp, ddp, rtol=0, atol=1e-5)
        # parameters + AdamW's two moments: ~12 bytes a parameter with DDP, half with FSDP
        assert 0.45 < fsdp_bytes / ddp_bytes < 0.55, (fsdp_bytes, ddp_bytes)
        assert ddp_bytes > 10e6 * 12  # the small preset: ~10.7M parameters
    for task_id in TASKS:  # every kind of model trains alike under FSDP
        ddp, ddp_bytes = ranks[0][f"{task_id}-ddp"]
        fsdp, fsdp_bytes = ranks[0][f"{task_id}-fsdp"]
        np.testing.assert_allclose(fsdp, ddp, rtol=0, atol=1e-5, err_msg=task_id)
        assert fsdp_bytes < 0.6 * ddp_bytes, task_id


def test_shard_units_are_the_blocks_and_tied_weights_stay_in_the_root():
    from attnlab.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=3, n_head=2, d_model=8))
    units = shard_units(model)
    assert units == list(model.blocks)
    inside = {id(p) for u in units for p in u.parameters()}
    assert id(model.lm_head.weight) not in inside and id(model.tok_embed.weight) not in inside


def test_fsdp_without_torchrun_is_refused_in_one_line(tmp_path, capsys):
    d = write_task_data(tmp_path)
    assert main(train_args("lm", d, tmp_path / "run", "--fsdp")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnlab: error: --fsdp") and "torchrun" in err[0]
    assert not (tmp_path / "run").exists()


def test_fsdp_with_snapshots_is_refused_in_one_line(tmp_path, monkeypatch):
    from attnlab.config import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")  # as under torchrun
    d = write_task_data(tmp_path)
    with pytest.raises(ConfigError, match=r"--snapshot-every does not work with --fsdp"):
        training.plan(given("lm", d, tmp_path / "run", "--fsdp", "--snapshot-every", "5"))
    assert training.plan(given("lm", d, tmp_path / "run", "--fsdp")).config.fsdp


def _torchrun(d, out, *more) -> subprocess.CompletedProcess:
    from cli_helpers import SRC

    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), "-m", "attnlab",
           *train_args("lm", d, out, "--dropout", "0", "--fsdp", *more)]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _failure(r: subprocess.CompletedProcess) -> str:
    """What torchrun's ranks said: the whole of it, since a dying rank's own message comes
    before torchrun's long summary of the failure (a tail would keep only the summary)."""
    return f"exit {r.returncode}\n--- stdout ---\n{r.stdout[-4000:]}\n--- stderr ---\n{r.stderr}"


@pytest.mark.slow
def test_torchrun_fsdp_writes_an_ordinary_run_that_resumes_exactly(tmp_path):
    """2 FSDP steps, then --resume to 4: the losses of one process training the same global
    batch (twice the per-process batch) for 4 steps; the run loads in a single process."""
    from attnlab.run import load_run
    from attnlab.rundir import read_trainer_state

    d = write_task_data(tmp_path)
    schedule = ("--eval-interval", "2", "--lr", "3e-3", "--warmup-iters", "0",
                "--lr-decay-iters", "4")  # fmt: skip
    out = tmp_path / "fsdp"
    r = _torchrun(d, out, "--max-iters", "2", *schedule)
    assert r.returncode == 0, _failure(r)
    model, _ = load_run(out)  # one process, no torch.distributed: an ordinary run directory
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())
    r = _torchrun(d, out, "--max-iters", "4", "--resume", *schedule)
    assert r.returncode == 0, _failure(r)
    assert read_trainer_state(out)["step"] == 4
    one = tmp_path / "one"
    args = train_args("lm", d, one, "--dropout", "0", "--max-iters", "4", *schedule,
                      "--batch-size", "8")  # fmt: skip
    assert main(args) == 0
    sharded, single = train_losses(out), train_losses(one)
    assert sharded.keys() == single.keys() == {1, 2, 3, 4}
    assert all(abs(sharded[s] - single[s]) < 1e-5 for s in single), (sharded, single)
    load_run(out / "best")
