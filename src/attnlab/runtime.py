"""Where a model runs: the device, the autocast dtype and the number of CPU threads.

One choice of each, used by training and by every verb that runs a model:
    resolve_device("auto" | "cpu" | "cuda" | "cuda:1" | "mps" | "xpu")  -> torch.device, or a
        ConfigError (one line, exit 2 at the CLI) when this machine has no such device
    resolve_dtype("auto" | "float32" | "bfloat16" | "float16", device) -> autocast dtype
    autocast(device, dtype)  -> the context a verb runs its model in (none for float32)
    set_threads(requested)  -> ThreadChoice: how many intra-op CPU threads, and why

Threads. torch's default (one thread per core) is fastest on an idle machine. When other
processes keep cores busy, every parallel op waits at its barrier for a thread that is not
running: on 2 shared cores, 50 steps of the baby GPT took 84 s with 2 threads and 13 s with 1.
So the rule is, in order:
    --threads N            N (the user's choice; at most 4 per usable core: see max_threads)
    OMP_NUM_THREADS set    left as torch read it (the user's choice)
    otherwise              torch's default, less one thread per core that other processes kept
                           busy over a short window (/proc/stat: their CPU ticks against the
                           total, ours subtracted). A core counts as taken when others used more
                           than half of it.
The load average is not used: it lags by a minute, so it still counts a job that has just
finished (on an idle machine it made attnlab take 1 thread of 2 and run 1.5x slower).
The thread count does not change the results (the same bits with 1 and 2 threads).

Nothing here prints: the choice is returned, and the caller says it once input is validated
(the Trainer puts it in the run's log and on its progress line).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnlab.config import ConfigError

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it: the CLI takes its first CPU sample
# (start_cpu_sample) before torch is imported, so that the import itself is the window.

# ---------------------------------------------------------------------------------------------
# Device and dtype
# ---------------------------------------------------------------------------------------------

ACCELERATORS = {"cuda": "CUDA GPU", "mps": "Apple MPS device", "xpu": "Intel XPU"}


def resolve_device(name: str) -> torch.device:
    """The device named by ``--device``; "auto" is a CUDA GPU when torch sees one, else the CPU.

    A device this machine does not have is a ConfigError that says so (never a crash later)."""
    import torch

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
    import torch

    if kind == "mps":
        return 1 if torch.backends.mps.is_available() else 0
    backend = getattr(torch, kind, None)  # torch.cuda, torch.xpu
    if backend is None or not backend.is_available():
        return 0
    return backend.device_count()


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Autocast dtype. ``auto``: bf16 on a GPU that has it; fp32 on CPU, where bf16 autocast
    measured slower for small models (the casts cost more than the matmuls save)."""
    import torch

    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if name == "float16" and device.type != "cuda":
        raise ConfigError("float16 autocast needs a CUDA GPU; on CPU use bfloat16 or float32")
    return getattr(torch, name)


@contextmanager
def autocast(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Run the block under ``torch.autocast`` in ``dtype`` on ``device``'s kind; float32 runs
    as written (no autocast), so the default on a CPU changes nothing."""
    import torch

    if dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


# ---------------------------------------------------------------------------------------------
# CPU threads
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op CPU threads torch uses, and why (said in the run's log)."""

    threads: int
    why: str

    def __str__(self) -> str:
        return f"{self.threads} CPU thread{'s' if self.threads != 1 else ''} ({self.why})"

    def to_dict(self) -> dict:
        return {"threads": self.threads, "why": self.why}


# cpu index -> (busy ticks, all ticks) since boot, for each core listed in /proc/stat
CpuTimes = dict[int, tuple[int, int]]


def parse_proc_stat(text: str) -> CpuTimes:
    """Per-core tick counters from the text of /proc/stat.

    A ``cpuN`` line is: user nice system idle iowait irq softirq steal [guest guest_nice];
    busy = user + nice + system + irq + softirq + steal (guest time is already inside user),
    all = busy + idle + iowait."""
    out: CpuTimes = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        v = [int(x) for x in rest.split()[:8]] + [0] * 8
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
        out[int(name[3:])] = (busy, busy + v[3] + v[4])
    return out


def read_proc_stat() -> str | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return f.read()
    except OSError:  # not Linux
        return None


@dataclass(frozen=True)
class CpuSample:
    """One look at the machine: per-core ticks, this process's own CPU ticks, and when."""

    cores: CpuTimes
    own: float  # this process's user + system CPU time, in ticks
    at: float  # time.monotonic()

    @classmethod
    def take(
        cls, read: Callable[[], str | None] = read_proc_stat, own: Callable[[], float] | None = None
    ) -> CpuSample | None:
        text = read()
        if not text:
            return None
        return cls(parse_proc_stat(text), (own or own_ticks)(), time.monotonic())


def own_ticks() -> float:
    """This process's CPU time (user + system, every thread), in /proc/stat's clock ticks."""
    t = os.times()
    try:
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        hz = 100.0
    return (t.user + t.system) * hz


def busy_cores(before: CpuSample, after: CpuSample, cpus: set[int]) -> float:
    """Cores' worth of CPU time other processes used on ``cpus`` between two samples:
    (busy ticks - our own ticks) / (all ticks / number of cores)."""
    common = [c for c in cpus if c in before.cores and c in after.cores]
    if not common:
        return 0.0
    busy = sum(after.cores[c][0] - before.cores[c][0] for c in common)
    total = sum(after.cores[c][1] - before.cores[c][1] for c in common)
    if total <= 0:
        return 0.0
    others = max(0.0, busy - (after.own - before.own))
    return others * len(common) / total


MIN_WINDOW_S = 0.1  # shortest window worth measuring (10 ticks a core at 100 Hz)
MAX_AGE_S = 30.0  # a start sample older than this describes another moment

_torch_default: int | None = None
_start: CpuSample | None = None
_choice: ThreadChoice | None = None


def start_cpu_sample() -> None:
    """Remember how busy the machine is now; a later thread choice measures from here, so the
    window is free when the process has been importing and parsing for longer than it."""
    global _start
    _start = CpuSample.take()


def measure_busy_cores(
    cpus: set[int],
    read: Callable[[], str | None] = read_proc_stat,
    sleep: Callable[[float], None] = time.sleep,
    start: CpuSample | None = None,
    own: Callable[[], float] | None = None,
) -> float | None:
    """Cores' worth of CPU other processes are using now (None where /proc/stat is missing):
    since ``start`` if it is between MIN_WINDOW_S and MAX_AGE_S old, else over MIN_WINDOW_S."""
    before = start
    if before is None or not MIN_WINDOW_S <= time.monotonic() - before.at <= MAX_AGE_S:
        before = CpuSample.take(read, own)
        if before is None:
            return None
        sleep(MIN_WINDOW_S)
    after = CpuSample.take(read, own)
    if after is None:
        return None
    return busy_cores(before, after, cpus)


def usable_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


THREADS_PER_CORE_MAX = 4  # past this many threads a core, every parallel op only waits longer


def max_threads(cpus: set[int] | None = None) -> int:
    """The most ``--threads`` may ask for: THREADS_PER_CORE_MAX per core this process may use.
    More would only make each op wait at its barrier, and thousands exhaust the process table
    (OpenMP starts them all at once); checked before torch is told (``choose_threads``)."""
    return THREADS_PER_CORE_MAX * len(usable_cpus() if cpus is None else cpus)


def torch_default_threads() -> int:
    """torch's own intra-op thread count (one per core, or OMP_NUM_THREADS), read before this
    module first changes it."""
    global _torch_default
    if _torch_default is None:
        import torch

        _torch_default = torch.get_num_threads()
    return _torch_default


def choose_threads(
    requested: int | None = None,
    *,
    env: dict | None = None,
    cpus: set[int] | None = None,
    default: int | None = None,
    measure: Callable[[set[int]], float | None] | None = None,
) -> ThreadChoice:
    """The thread count the module docstring's rule gives; changes nothing.

    ``requested`` is ``--threads``; ``default`` is torch's own count (one per core, or
    OMP_NUM_THREADS); ``measure(cpus)`` returns the cores' worth others are using."""
    env = os.environ if env is None else env
    default = torch_default_threads() if default is None else default
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"--threads must be at least 1, got {requested}")
        most = max_threads(cpus)
        if requested > most:
            raise ConfigError(
                f"--threads must be at most {most} ({THREADS_PER_CORE_MAX} per core this process "
                f"may use), got {requested}"
            )
        return ThreadChoice(requested, f"--threads {requested}")
    omp = env.get("OMP_NUM_THREADS")
    if omp:  # what torch starts with in a fresh process; read here so a forked one obeys it too
        n = int(omp) if omp.strip().isdigit() and int(omp) >= 1 else default
        return ThreadChoice(n, f"OMP_NUM_THREADS={omp}")
    cpus = usable_cpus() if cpus is None else cpus
    if default <= 1 or len(cpus) <= 1:
        return ThreadChoice(default, "torch's default, one per core")
    busy = (measure or measure_busy_cores)(cpus)
    if busy is None:
        return ThreadChoice(default, "torch's default, one per core")
    taken = int(busy + 0.5)  # a core counts as taken when others used more than half of it
    n = max(1, min(default, len(cpus) - taken))
    if n == default:
        return ThreadChoice(n, "torch's default, one per core: the cores were idle")
    return ThreadChoice(
        n,
        f"other processes kept {busy:.1f} of {len(cpus)} cores busy; --threads N to choose",
    )


def set_threads(requested: int | None = None, **kw) -> ThreadChoice:
    """Choose (``choose_threads``) and apply the thread count; remembered for ``thread_choice``.
    Prints nothing."""
    import torch

    global _choice
    default = torch_default_threads()  # read before anything below changes it
    kw.setdefault("default", default)
    if "measure" not in kw:
        kw["measure"] = lambda cpus: measure_busy_cores(cpus, start=_start)
    choice = choose_threads(requested, **kw)
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
    _choice = choice
    return choice


def thread_choice() -> ThreadChoice:
    """The threads torch uses now and why: the choice ``set_threads`` made, or torch's own."""
    import torch

    n = torch.get_num_threads()
    if _choice is not None and _choice.threads == n:
        return _choice
    if os.environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(n, f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    return ThreadChoice(n, "torch's setting in this process")


@contextmanager
def using_threads(requested: int | None = None) -> Iterator[ThreadChoice]:
    """``set_threads`` for the length of a ``with`` block, then torch's count as it was (so a
    verb run in-process, as the tests do, leaves the caller's threads alone)."""
    import torch

    global _choice
    before = torch.get_num_threads()
    try:
        yield set_threads(requested)
    finally:
        _choice = None
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


LIBRARY_LOGGERS = ("torch", "transformers", "huggingface_hub", "tokenizers", "safetensors",
                   "matplotlib", "PIL", "filelock", "urllib3", "sklearn")  # fmt: skip


def quiet_libraries() -> None:
    """No library's warning reaches the user, only attnlab's own: a Python warning issued
    outside attnlab is ignored, and the loggers of the libraries attnlab runs say only
    errors (torch's compiler among them: its graph breaks and recompilations are warnings
    of how it compiles, logged with a traceback into our code). The command line and the demo
    call it first; a program that imports attnlab keeps its own settings."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"attnlab(\.|$)")
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    torch = sys.modules.get("torch")
    set_logs = getattr(getattr(torch, "_logging", None), "set_logs", None)
    global _torch_quiet
    if set_logs is not None and not _torch_quiet:
        # once a process: it resets every torch logger (about 35 ms), and the command line
        # calls this twice a command, a test process some thousands of times
        set_logs(all=logging.ERROR, graph_breaks=False, recompiles=False)
        _torch_quiet = True


_torch_quiet = False  # torch's logs were set to errors only, in this process
