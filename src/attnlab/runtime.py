"""Where a model runs: the device, the autocast dtype and the number of CPU threads.

One choice of each, used by training and by every verb that runs a model:
    resolve_device("auto" | "cpu" | "cuda" | "cuda:1" | "mps" | "xpu")  -> torch.device, or a
        ConfigError (one line, exit 2 at the CLI) when this machine has no such device
    resolve_dtype("auto" | "float32" | "bfloat16" | "float16", device) -> autocast dtype
    set_cpu_threads(device)                              -> intra-op threads on a CPU
"""

from __future__ import annotations

import os
import sys

import torch

from attnlab.config import ConfigError

ACCELERATORS = {"cuda": "CUDA GPU", "mps": "Apple MPS device", "xpu": "Intel XPU"}


def resolve_device(name: str) -> torch.device:
    """The device named by ``--device``; "auto" is a CUDA GPU when torch sees one, else the CPU.

    A device this machine does not have is a ConfigError that says so (never a crash later)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or (dev.type != "cpu" and dev.type not in ACCELERATORS):
        raise ConfigError(
            f"--device {name}: unknown device; use cpu, cuda, cuda:N, mps, xpu or auto"
        )
    if dev.type == "cpu":
        return torch.device("cpu")
    what, count = ACCELERATORS[dev.type], device_count(dev.type)
    if count == 0:
        raise ConfigError(f"--device {name}: torch sees no {what} on this machine; use cpu or auto")
    if dev.index is not None and dev.index >= count:
        raise ConfigError(
            f"--device {name}: torch sees {count} {what}{'s' if count != 1 else ''} "
            f"({dev.type}:0..{dev.type}:{count - 1})"
        )
    return dev


def device_count(kind: str) -> int:
    """How many devices of this kind ("cuda", "mps", "xpu") torch can use here."""
    if kind == "mps":
        return 1 if torch.backends.mps.is_available() else 0
    backend = getattr(torch, kind, None)  # torch.cuda, torch.xpu
    if backend is None or not backend.is_available():
        return 0
    return backend.device_count()


def cpu_threads_for_load() -> int | None:
    """Intra-op CPU threads to use when the user has not chosen (``OMP_NUM_THREADS`` unset):
    one per core that the 1-minute load average says is idle, at least 1, at most torch's
    default. None when ``OMP_NUM_THREADS`` is set (the user's choice stands).

    Why: torch's default (one thread per core) is fastest on an idle machine, but when other
    processes keep cores busy every parallel op waits for a thread that is not running: on
    2 shared cores, 50 steps of the baby GPT took 84 s with 2 threads and 13 s with 1. The
    thread count does not change the results (the same bits with 1 and 2 threads).
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        busy = round(os.getloadavg()[0])
    except (AttributeError, OSError):
        busy = 0
    return max(1, min(torch.get_num_threads(), cpus - busy))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Autocast dtype. ``auto``: bf16 on a GPU that has it; fp32 on CPU, where bf16 autocast
    measured slower for small models (the casts cost more than the matmuls save)."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if name == "float16" and device.type != "cuda":
        raise ConfigError("float16 autocast needs a CUDA GPU; on CPU use bfloat16 or float32")
    return getattr(torch, name)


def set_cpu_threads(device: torch.device, quiet: bool = True) -> int | None:
    """On CPU, unless OMP_NUM_THREADS says otherwise, use only the cores that are idle.

    Returns the thread count set, or None when it was left as it was."""
    n = cpu_threads_for_load() if device.type == "cpu" else None
    if n is None or n == torch.get_num_threads():
        return None
    torch.set_num_threads(n)
    if not quiet:
        print(
            f"using {n} CPU thread{'s' if n > 1 else ''}: the other cores are busy "
            "(load average); set OMP_NUM_THREADS to choose",
            file=sys.stderr,
            flush=True,
        )
    return n
