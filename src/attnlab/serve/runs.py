"""The runs a workbench may open, and the pool that holds the loaded ones.

``RunSet``: the run directories named on the command line, and the runs directly inside each
directory named (found again on every listing, so a run that ``attnlab train`` starts writing
there appears). A run is asked for by its name in the listing, never by a path: a name that is
not listed (``..``, an absolute path, a link that leads outside) is refused.

``RunPool``: each run loaded once (``attnlab.run.load_run``), however many clients ask at the
same time; the loaded runs together stay within a memory budget (the bytes of their weights),
and the least recently used one is let go when a new one would pass it. A run's computations
take its lock, one at a time: an intervention edits the model while it runs (hooks), so two
clients never see each other's edits. A run whose weights change on disk (a checkpoint that
training wrote) is loaded again on the next request; reading never takes the writer's lock.
A run that fails to load says why once (a ``RunUnavailable``), and is not tried again until
its files change.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.errors import AttnlabError

GIB = 1024**3


class ServeError(AttnlabError):
    """A request the workbench refuses: one line for the page (HTTP 400)."""


class RunUnavailable(ServeError):
    """A run that is not offered, or that failed to load (HTTP 404)."""


def _weights_bytes(path: Path) -> int:
    """Bytes of a run's model weights on disk (what loading it costs, near enough)."""
    from attnlab.rundir import MODEL_FILE

    try:
        return (path / MODEL_FILE).stat().st_size
    except OSError:
        return 0


def _stamp(path: Path) -> tuple:
    """What changes when a checkpoint lands: config.json's and the weights' mtime and size."""
    from attnlab.rundir import CONFIG_FILE, MODEL_FILE

    out = []
    for name in (CONFIG_FILE, MODEL_FILE):
        try:
            st = (path / name).stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def _is_run(path: Path) -> bool:
    from attnlab.rundir import has_run_config

    return has_run_config(path)


class RunSet:
    """The runs this workbench was started with: ``paths``, each a run directory or a directory
    of runs. ``names()`` lists them; ``path(name)`` is the one door from a name to a path."""

    def __init__(self, paths: list[str | Path]):
        if not paths:
            raise ServeError("name a run directory (or a directory of runs) to serve")
        self.roots: list[tuple[str, Path, bool]] = []  # (name, resolved path, is a run itself)
        seen: set[str] = set()
        for p in paths:
            path = Path(p)
            if not path.exists():
                raise ServeError(f"{p}: no such run directory")
            if not path.is_dir():
                raise ServeError(f"{p}: expected a run directory or a directory of runs")
            real = path.resolve()
            name = path.name or real.name
            while name in seen:
                name += "'"
            seen.add(name)
            self.roots.append((name, real, _is_run(real)))

    def names(self) -> dict[str, Path]:
        """name -> resolved path of every run offered now (directories of runs read again)."""
        out: dict[str, Path] = {}
        for name, real, is_run in self.roots:
            if is_run or not any(True for _ in _children(real)):
                out[name] = real
                continue
            for child in _children(real):
                out[f"{name}/{child.name}"] = child
        return out

    def path(self, name: str) -> Path:
        """The run called ``name`` in the listing; anything else (a path, ``..``) is refused."""
        if not isinstance(name, str) or not name:
            raise RunUnavailable("no run named: pick one of the runs listed")
        offered = self.names()
        if name not in offered:
            if ".." in name.split("/") or name.startswith(("/", "~")) or "\\" in name:
                raise RunUnavailable(f"{name!r}: only the runs this workbench was started with "
                                     "can be opened (a path is refused)")  # fmt: skip
            raise RunUnavailable(f"no run {name!r} here; the runs: {', '.join(offered) or 'none'}")
        return offered[name]


def _children(root: Path):
    """The run directories directly inside ``root`` that stay inside it (a link out is not)."""
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return
    for c in entries:
        if c.name.startswith(".") or not c.is_dir():
            continue
        real = c.resolve()
        if real.parent != root:  # a link that leads outside the directory named
            continue
        if _is_run(real):
            yield real


def describe(name: str, path: Path) -> dict:
    """A run as the listing shows it: kind, size, what it was trained on; or why it cannot
    be read. Reads config.json and the weights' header only (the model is built on the meta
    device), so listing a directory of large runs is quick."""
    from attnlab.run import about
    from attnlab.rundir import check_run

    row: dict = {"name": name, "path": str(path)}
    try:
        checked = check_run(path)
    except (AttnlabError, OSError, ValueError) as e:
        return {**row, "error": _line(e)}
    cfg, model = checked.config, checked.model
    task = cfg.get("task")
    if isinstance(task, dict):
        task = task.get("name")
    source = cfg.get("source") if isinstance(cfg.get("source"), dict) else None
    data = cfg.get("data")
    if data is None and source:
        data = f"imported from {source.get('name_or_path') or source.get('path') or 'Hugging Face'}"
    params = sum(p.numel() for p in model.parameters())
    return {**row, **about(model, cfg), "task": task, "data": data, "parameters": params,
            "bytes": _weights_bytes(path), "reads": model.reads,
            "decodes": bool(model.decodes), "residual": bool(model.residual)}  # fmt: skip


def _line(e: BaseException) -> str:
    return " ".join((str(e).strip() or type(e).__name__).split())


@dataclass
class _Slot:
    path: Path
    lock: threading.Lock = field(default_factory=threading.Lock)  # one computation at a time
    run: object = None
    stamp: tuple = ()
    bytes: int = 0
    error: str | None = None  # why it failed to load (said once, kept until its files change)
    error_stamp: tuple = ()
    extra: dict = field(default_factory=dict)  # per-run caches (recordings), dropped on reload


class RunPool:
    """Loaded runs, at most ``budget`` bytes of weights together (least recently used let go)."""

    def __init__(self, runs: RunSet, budget: int, device: str = "cpu", preloaded=None):
        self.runs, self.budget, self.device = runs, int(budget), device
        self._slots: OrderedDict[Path, _Slot] = OrderedDict()
        self._lock = threading.Lock()
        self._loading = threading.Lock()
        self.loads = 0  # how many times a run was loaded (the load test reads it)
        self.evictions = 0
        self.preloaded = dict(preloaded or {})  # path -> a Run already in memory (a notebook)

    def _slot(self, path: Path) -> _Slot:
        with self._lock:
            slot = self._slots.get(path)
            if slot is None:
                slot = self._slots[path] = _Slot(path)
            self._slots.move_to_end(path)
            return slot

    @contextmanager
    def use(self, name: str):
        """The run called ``name``, loaded (once) and locked for this request's computation."""
        path = self.runs.path(name)
        slot = self._slot(path)
        with slot.lock:
            run, extra = self._ensure(slot)
            yield run, extra

    def loaded(self) -> dict[str, int]:
        """path -> bytes of every run held now."""
        with self._lock:
            return {str(p): s.bytes for p, s in self._slots.items() if s.run is not None}

    def _ensure(self, slot: _Slot):
        """(run, its caches) of ``slot``, loaded if it is not held or its files changed."""
        if slot.path in self.preloaded:
            slot.run = self.preloaded[slot.path]
            return slot.run, slot.extra
        stamp = _stamp(slot.path)
        with self._lock:  # read together: an eviction may clear them
            run, extra = slot.run, slot.extra
        if run is not None and stamp == slot.stamp:
            return run, extra
        if slot.error is not None and stamp == slot.error_stamp:
            raise RunUnavailable(slot.error)
        need = _weights_bytes(slot.path)
        if need > self.budget:
            slot.error, slot.error_stamp = (
                f"{slot.path.name}: its weights need {need / GIB:.2f} GiB, past the workbench's "
                f"memory budget of {self.budget / GIB:.2f} GiB (start it with a larger "
                "--memory-gb)"), stamp  # fmt: skip
            raise RunUnavailable(slot.error)
        with self._lock:
            slot.run, slot.extra, slot.bytes = None, {}, 0
        with self._loading:  # one load at a time, so the room made is not taken meanwhile
            self._make_room(need, slot)
            run, stamp = self._load(slot, stamp)
            extra = {}
            with self._lock:
                slot.run, slot.extra, slot.stamp, slot.bytes = run, extra, stamp, need
                slot.error = None
                self.loads += 1
        return run, extra

    def _load(self, slot: _Slot, stamp: tuple):
        from attnlab.run import load_run

        for attempt in range(3):  # a checkpoint being renamed into place: read it again
            try:
                return load_run(slot.path, self.device), stamp
            except (AttnlabError, OSError, ValueError) as e:
                if attempt == 2 or _stamp(slot.path) == stamp:
                    slot.error, slot.error_stamp = f"{slot.path.name}: {_line(e)}", stamp
                    raise RunUnavailable(slot.error) from None
                stamp = _stamp(slot.path)
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def _make_room(self, need: int, keep: _Slot) -> None:
        """Let go of the least recently used runs until ``need`` more bytes fit. A run in use
        is let go too: the request computing on it keeps it until it answers, the pool no
        longer does (so memory is at most the budget plus the runs of requests in flight)."""
        with self._lock:
            held = sum(s.bytes for s in self._slots.values() if s.run is not None)
            for s in list(self._slots.values()):
                if held + need <= self.budget:
                    break
                if s is keep or s.run is None or s.path in self.preloaded:
                    continue
                held -= s.bytes
                s.run, s.extra, s.bytes, s.stamp = None, {}, 0, ()
                self.evictions += 1


def default_budget() -> int:
    """Half of this machine's memory, at most 16 GiB: what loaded runs may hold by default."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 * GIB
    return int(min(16 * GIB, total / 2))
