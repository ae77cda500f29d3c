"""Distributed data parallel set-up: the process group ``torchrun`` describes.

    torchrun --nproc_per_node 2 -m attnlab train ...

Every process builds the same model from the same seed; DistributedDataParallel broadcasts
rank 0's weights and averages gradients. Each batch source draws the global batch and keeps its
rank's rows, so the run does not depend on how many processes share it. Rank 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import os

import torch


@dataclasses.dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device | None = None) -> DistInfo:
    """Join the process group that ``torchrun`` describes in the environment (RANK, WORLD_SIZE,
    LOCAL_RANK): nccl on CUDA, gloo on CPU. A single process returns DistInfo() untouched."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    import torch.distributed as dist

    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = device is not None and device.type == "cuda"
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return info


def barrier(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def all_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum ``values`` over every process (one all-reduce); unchanged in a single process."""
    if not info.enabled:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
