"""DistributedDataParallel on 2 CPU processes (gloo): averaged gradients equal one process's
gradients on the same global batch."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from attnlab.data import RandomWindows
from attnlab.training import DistInfo, TrainConfig, Trainer, init_distributed, next_token_loss
from lm_helpers import random_tokens, tiny_gpt

TOKENS = random_tokens(2000, 20, seed=2)
CFG = dict(
    max_iters=1,
    batch_size=3,
    lr=1e-3,
    warmup_iters=0,
    eval_interval=100,
    eval_iters=1,
    log_interval=1,
    device="cpu",
    grad_clip=0.0,
)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    info = init_distributed(torch.device("cpu"))
    torch.manual_seed(rank)  # different init on purpose: DDP must broadcast rank 0's weights
    model = tiny_gpt()
    batches = RandomWindows(TOKENS, 16, 3, seed=5, rank=info.rank, world_size=info.world_size)
    trainer = Trainer(
        model, next_token_loss, batches, TrainConfig(**CFG), dist_info=info, quiet=True
    )
    trainer.model.train()
    next_token_loss(trainer.model, next(batches)).backward()  # DDP averages the gradients here
    if rank == 0:
        raw = trainer.raw_model
        save_file({n: p.grad for n, p in raw.named_parameters()}, out)
        save_file({n: p.detach() for n, p in raw.named_parameters()}, out + ".w")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_averaged_gradients_equal_single_process_on_the_global_batch(tmp_path):
    out = str(tmp_path / "grads.pt")
    mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    ddp_grads, weights = load_file(out), load_file(out + ".w")
    model = tiny_gpt()
    model.load_state_dict(weights, strict=False)  # rank 0's weights, which DDP gave to both ranks
    whole = next(RandomWindows(TOKENS, 16, 6, seed=5))  # the same 6 windows, in one process
    next_token_loss(model, whole).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(ddp_grads[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_single_process_is_not_distributed():
    assert init_distributed() == DistInfo() and not DistInfo().enabled
