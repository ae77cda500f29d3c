"""Several processes: the process group ``torchrun`` describes, data parallel or sharded.

    torchrun --nproc_per_node 2 -m attnlab train ...            DistributedDataParallel
    torchrun --nproc_per_node 2 -m attnlab train ... --fsdp     FSDP: parameters sharded

Every process builds the same model from the same seed. Each batch source draws the global
batch and keeps its rank's rows, so the run does not depend on how many processes share it.
Rank 0 alone writes.

DDP keeps a whole copy of the parameters, gradients and AdamW moments in every process and
averages the gradients (all-reduce). FSDP (``torch.distributed.fsdp.fully_shard``) keeps
1/N of each in each of N processes: a layer's parameters are all-gathered just before its
forward and backward and freed after, and the gradients are reduce-scattered, so each process
updates only its shard. Per step the arithmetic is DDP's; per process the memory of the
parameters and optimizer state is about 1/N of DDP's. Checkpoints are gathered whole
(``full_state_dict`` / ``load_full_state_dict``), so an FSDP run directory is an ordinary one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor, nn


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


# -- FSDP ---------------------------------------------------------------------------------------


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules that each become one FSDP unit besides the root: every element of an
    ``nn.ModuleList`` that holds parameters (a GPT's, encoder's or ViT's blocks, a seq2seq
    model's encoder and decoder layers). What is outside them (embeddings, the tied LM head,
    final norms, an LSTM) belongs to the root unit, so tied weights stay in one unit."""
    units = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList):
            units.extend(c for c in m if any(True for _ in c.parameters()))
    return units


def shard(model: nn.Module, device: torch.device) -> nn.Module:
    """Shard ``model`` in place over the process group (FSDP2's ``fully_shard``): each of
    ``shard_units`` then the root. Its parameters become DTensors holding 1/N of each tensor;
    build the optimizer after this, from the sharded parameters."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # A model whose output is a view (a reshape) gets a warning against in-place ops on it;
    # the tasks only read the output (a loss), so it would only alarm.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """FSDP: whether this backward reduce-scatters the gradients (off for all but the last
    micro-batch of gradient accumulation, as DDP's ``no_sync``)."""
    model.set_requires_gradient_sync(sync)


@contextlib.contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """Inside: every parameter of a sharded ``model`` is whole in this process, so that any of
    its methods runs (greedy decoding, sampling, scoring), not only ``forward``. Every process
    must enter it together (it all-gathers); a model that is not sharded is left alone."""
    if not is_sharded(model):
        yield
        return
    units = _fsdp_modules(model)
    for m in units:
        m.set_reshard_after_forward(False)
        m.unshard()
    try:
        yield
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(True)


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The whole model state dict, gathered on CPU in rank 0 (empty in the other ranks).
    Every process must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=opts)


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The whole optimizer state dict in ``torch.optim``'s own form (parameters numbered in
    the order of the optimizer's groups), gathered on CPU in rank 0. Every process calls it."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    if not optimizer.state:  # before the first step: torch would take a step of lr 0 to
        return optimizer.state_dict()  # make the state, and AdamW would count it
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_optimizer_state_dict(model, optimizer, options=opts)
    if not sd:
        return {"state": {}, "param_groups": []}
    index: dict[str, int] = {}
    groups = []
    for g in sd["param_groups"]:
        ids = []
        for name in g["params"]:
            index[name] = len(index)
            ids.append(index[name])
        groups.append({**g, "params": ids})
    return {"state": {index[k]: v for k, v in sd["state"].items()}, "param_groups": groups}


def load_full_state_dicts(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_sd: dict[str, Tensor],
    optimizer_sd: dict,
) -> None:
    """The inverse of ``full_state_dict`` and ``full_optimizer_state_dict``: every process
    holds the whole state dicts (read from a run directory) and keeps its shard of them."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, model_sd, options=opts)
    if not optimizer_sd["state"]:  # saved before the first step: nothing to restore
        return
    names = _optimizer_names(model, optimizer)
    groups = [
        {**g, "params": [names[i] for i in g["params"]]} for g in optimizer_sd["param_groups"]
    ]
    state = {names[i]: v for i, v in optimizer_sd["state"].items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups},
                             options=opts)  # fmt: skip


def _optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's order (a tied parameter under its first name)."""
    name_of = {}
    for name, p in model.named_parameters():
        name_of.setdefault(id(p), name)
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state that this process holds between
    steps (a sharded tensor counts its local shard only)."""
    seen: set[int] = set()

    def size(t) -> int:
        if t is None or not torch.is_tensor(t) or id(t) in seen:
            return 0
        seen.add(id(t))
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    total = 0
    for p in model.parameters():
        total += size(p) + size(p.grad)
    for st in optimizer.state.values():
        total += sum(size(v) for v in st.values())
    return total
