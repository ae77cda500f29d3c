"""The one place that reads and writes run directories.

A run directory looks like a Hugging Face model directory:
    config.json          {"attnlab_format": 1, "model_type": "gpt", "config": {...}, ...}
    model.safetensors    the weights (tied copies stored once)
    tokenizer.json       see attnlab.tokenizers (an encoder-decoder adds target_tokenizer.json)
plus, for training runs (written by ``attnlab.training.Trainer`` through the functions of the
last section here):
    optimizer.safetensors   AdamW moments of the same step as model.safetensors
    trainer_state.json      step, train config, RNG states, data position, best metric so far
    best/                   config.json, tokenizer.json, model.safetensors of the best evaluation
    metrics.jsonl, loss.png one JSON line per log or evaluation; the loss curve
    snapshots/              attention and head scores every --snapshot-every steps

Every file is written to a temporary name in the same directory, fsynced, then renamed, so a
crash never leaves half a file. Only safetensors and JSON are ever read: nothing is unpickled.

A run directory is untrusted input (someone may send you one), so ``load_run`` allocates
nothing until its files agree with each other (``check_run``):
    1. config.json is read, and model.safetensors' header: names, dtypes, shapes and byte
       offsets, no tensor data (``read_header``: the header's size is bounded and every offset
       checked against the file's length, so a hostile header cannot make us allocate).
    2. The model config.json describes is built on the meta device (shapes, no memory), after
       its layer counts are checked against the number of tensors in the file.
    3. Every tensor name, shape and dtype must be the model's; its computed tables (position
       tables, not stored) must not be larger than the weights; the tokenizer's vocabulary must
       be the config's (both sides for an encoder-decoder; a ViT's image size and classes).
Then the weights are memory-mapped and assigned to the meta model (``assign_weights``): loading
costs one copy of the weights, read as they are used.

How a checkpoint stays whole: its three files are first written into a fresh ``ckpt-tmp/``
directory (each file fsynced), which is then renamed to ``ckpt-ready/``: the rename is the
commit point. The files are then moved into place one by one (each move atomic) and
``ckpt-ready/`` removed. A crash before the commit leaves the previous checkpoint untouched
(``ckpt-tmp/`` is discarded by ``recover_checkpoint``); a crash after it is rolled forward by
finishing the moves. ``model.safetensors`` is always one whole file, and config.json and
tokenizer.json never change during training, so ``load_run`` works at every instant.

A process that writes a run directory holds its writer lock (``writer_lock``): an OS lock on the
directory itself, which dies with the process, even by kill -9. A second writer is refused in
one line naming the holder. Readers take no lock: renames make every file they open whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import ConfigError
from attnlab.tokenizers import PairTokenizer, Tokenizer, TokenizerError, load_tokenizer

FORMAT_VERSION = 1

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


class RunError(ValueError):
    """A run directory that is missing, incomplete, corrupt or inconsistent."""


class FileChangedError(RunError):
    """A file no longer the one whose header was checked (a writer replaced it meanwhile)."""


def looks_like_pickle(path: Path) -> bool:
    """A file named like a PyTorch checkpoint whose first bytes are a pickle (protocol 2-5) or a
    ``torch.save`` zip. Only those bytes are read: the file is never unpickled. (A run's own
    ``tokens.bin`` is raw token ids and is not one.)"""
    if path.suffix.lower() not in PICKLE_SUFFIXES or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head == b"PK\x03\x04"


# ---------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(tmp_path)``, fsync the result, then rename it onto ``path``."""
    path = Path(path)
    _claim(path)  # inside writer_lock: the first file written takes the run directory's lock
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _about(e, path) from None
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename == tmp:
            raise _about(e, path) from None  # name the file the user asked for, not our temp
        raise
    fsync_dir(path.parent)


def _about(e: OSError, path: Path) -> OSError:
    """The same error (type, errno, message) about ``path``."""
    return type(e)(e.errno, e.strerror, str(path)) if e.errno else e


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_tensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


# ---------------------------------------------------------------------------------------------
# Reading safetensors: the header first, then the data
# ---------------------------------------------------------------------------------------------

# A safetensors file is an 8-byte little-endian header length n, n bytes of JSON, then the
# tensor data. 16 MiB of JSON names ~100,000 tensors; attnlab's files hold hundreds.
MAX_HEADER_BYTES = 16 << 20

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it: dtype, shape, and where its bytes lie
    in the data section (``start`` to ``end``). No data."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class SafetensorsHeader:
    """A checked safetensors header: every tensor's ``TensorInfo``, the file's string
    ``metadata``, and ``data_start``, the byte where tensor data begins (8 + header length).
    ``prefix`` holds those first bytes, to tell whether the file was replaced since."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int
    prefix: bytes = dataclasses.field(repr=False, default=b"")

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data: what loading the weights costs in memory."""
        return sum(t.end - t.start for t in self.tensors.values())


def read_header(path: str | Path) -> SafetensorsHeader:
    """Read and check a safetensors header without reading any tensor data.

    Refused (a RunError naming the file): a header longer than ``MAX_HEADER_BYTES`` or than
    the file; a header that is not a JSON object of tensor entries; an unknown dtype; a shape
    whose size is not its byte range; byte ranges that overlap, leave gaps, or run past the
    end of the file (a truncated file). So nothing a header claims is ever allocated.
    """
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: file not found")

    def bad(why: str) -> RunError:
        return RunError(f"{path}: not a valid safetensors file ({why})")

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            n = int.from_bytes(f.read(8), "little")
            if n > min(MAX_HEADER_BYTES, size - 8):
                limit = "the file" if n <= MAX_HEADER_BYTES else f"{MAX_HEADER_BYTES:,} bytes"
                raise bad(f"its header claims {n:,} bytes, more than {limit}")
            raw = f.read(n)
    except OSError as e:
        raise RunError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        entries = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"its header is not JSON: {_short(e)}") from None
    if not isinstance(entries, dict):
        raise bad("its header is not a JSON object")
    metadata = entries.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise bad("__metadata__ is not an object of strings")
    tensors = {name: _tensor_info(name, entry, bad) for name, entry in entries.items()}
    at, data_len = 0, size - 8 - n  # every data byte belongs to exactly one tensor, in order
    for name, t in sorted(tensors.items(), key=lambda item: (item[1].start, item[1].end)):
        if t.start != at:
            what = "overlaps the tensor before it" if t.start < at else "leaves a gap before it"
            raise bad(f"tensor {name!r} {what}")
        at = t.end
    if at > data_len:
        raise bad(f"truncated: its header describes {at:,} bytes of tensor data, the file "
                  f"holds {data_len:,}")  # fmt: skip
    if at < data_len:
        raise bad(f"{data_len - at:,} bytes after the last tensor")
    prefix = n.to_bytes(8, "little") + raw
    return SafetensorsHeader(path, tensors, metadata, 8 + n, prefix)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{next(k for k in keys if keys.count(k) > 1)!r} appears twice")
    return dict(pairs)


def _tensor_info(name: str, entry: Any, bad) -> TensorInfo:
    """One header entry {"dtype": "F32", "shape": [..], "data_offsets": [start, end]}."""
    if not isinstance(entry, dict):
        raise bad(f"entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise bad(f"tensor {name!r} has data_offsets {offsets!r}, not [start, end]")
    need = math.prod(shape) * DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != need:
        raise bad(f"tensor {name!r} of shape {tuple(shape)} and dtype {dtype} needs {need:,} "
                  f"bytes, its offsets span {offsets[1] - offsets[0]:,}")  # fmt: skip
    return TensorInfo(DTYPES[dtype], tuple(shape), offsets[0], offsets[1])


def load_tensors(
    path: str | Path, *, mmap: bool = False, header: SafetensorsHeader | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, its header checked first (``read_header``).

    ``mmap=False`` reads the data into memory once. ``mmap=True`` maps the file privately
    (copy-on-write): pages are read when a tensor is used and shared with the OS's file cache,
    and writing to a tensor never changes the file. Either way the tensors are views into one
    buffer of the file's data size: one copy, never two. ``header`` skips re-reading it.
    """
    if sys.byteorder != "little":
        raise RunError("safetensors data is little-endian; this machine is not")
    header = header or read_header(path)
    path, start, total = header.path, header.data_start, header.data_start + header.nbytes
    try:
        if mmap:
            storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=total)
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)  # (total,) the mapping
            prefix, data = whole[:start].numpy().tobytes(), whole[start:]
        else:
            data = torch.empty(header.nbytes, dtype=torch.uint8)
            with open(path, "rb") as f:
                prefix = f.read(start)
                if f.readinto(memoryview(data.numpy())) != header.nbytes:
                    prefix = b""  # shorter than its header said: replaced since
    except (OSError, RuntimeError) as e:  # RuntimeError: the file is shorter than the mapping
        raise FileChangedError(f"{path}: cannot read ({_short(e)})") from None
    if header.prefix and prefix != header.prefix:
        raise FileChangedError(f"{path}: replaced while it was being read; try again")
    tensors = {}
    for name, t in header.tensors.items():
        raw = data[t.start : t.end]  # (nbytes,) uint8
        if t.start % t.dtype.itemsize:  # not aligned for its dtype: copy it to a fresh buffer
            raw = raw.clone()
        tensors[name] = raw.view(t.dtype).view(t.shape)
    return tensors


def _short(e: Exception) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__


# ---------------------------------------------------------------------------------------------
# The writer lock
# ---------------------------------------------------------------------------------------------

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock (nothing else changes)
    fcntl = None


class _WriterLock:
    """The flock a ``writer_lock`` block holds (``fd``), or waits to take (``run_dir``)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.fd: int | None = None
        self.claimed = False  # taken, or found impossible to take: do not try again

    def take(self, d: Path) -> None:
        self.claimed = True
        if fcntl is None:
            return
        try:
            fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))  # never inherited
        except OSError:
            return  # the write that follows reports what is wrong with the directory
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunError(
                f"{d}: another process is writing this run directory ({lock_holder(d)}); "
                "wait for it to finish or stop it, or write to another directory"
            ) from None
        except OSError:  # a file system without flock (some network mounts): write unlocked
            os.close(fd)
            return
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None


_writer: _WriterLock | None = None  # this process's writer_lock block, if one is running


@contextlib.contextmanager
def writer_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold the writer lock of the run directory ``run_dir`` while the block runs.

    The lock is ``flock`` on the directory itself. Taking it creates and changes nothing in
    the directory, so a command refused later (a ``train`` without ``--resume`` into an
    existing run) leaves it exactly as it was. The kernel drops it when the process ends,
    however it ends (kill -9 too), so ``--resume`` works at once afterwards. A second writer
    is refused with a RunError naming the holder: its pid, command and start time.

    If ``run_dir`` exists, the lock is taken on entry. If it does not (a new run), it is taken
    by the first file the block writes under it through this module (``create_run_dir`` writes
    one), before that file is written. ``attnlab.training.run.train`` holds it for every task,
    ``Trainer.fit`` for a Trainer used on its own, ``import_hf`` and ``TunedLens.save`` for
    what they write. Readers take no lock. Blocks do not nest: an inner one leaves the outer
    one in charge. Ranks other than 0 of a torchrun job (which write nothing) take no lock.
    """
    global _writer
    if _writer is not None or os.environ.get("RANK", "0") != "0":
        yield
        return
    lock = _WriterLock(Path(run_dir))
    if lock.run_dir.is_dir():
        lock.take(lock.run_dir)
    _writer = lock
    try:
        yield
    finally:
        _writer = None
        lock.release()


def _claim(path: Path) -> None:
    """Called before every write: inside ``writer_lock``, the first write into the run
    directory takes its lock (a RunError if another process holds it: nothing is written)."""
    w = _writer
    if w is not None and not w.claimed and _within(path.parent, w.run_dir):
        w.take(w.run_dir)


def _within(path: Path, root: Path) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def lock_holder(run_dir: str | Path) -> str:
    """Who holds the writer lock of ``run_dir``: "pid 123: attnlab train ..., since <start>",
    read from /proc (Linux); "another process" where that cannot be read. Reads only."""
    try:
        st = os.stat(run_dir)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return "another process"
    # "1: FLOCK  ADVISORY  WRITE 6145 fe:00:2146455 0 EOF"; "1: -> FLOCK ..." is a waiter
    exact = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = {}
    for fields in map(str.split, lines):
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].endswith(f":{st.st_ino}"):
            found[fields[5] == exact] = fields[4]  # exact device, or the inode alone
    pid = found.get(True, found.get(False))
    return _describe_process(pid) if pid else "another process"


def _describe_process(pid: str) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start, in ticks after boot
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))  # fmt: skip
    except (OSError, ValueError, IndexError, StopIteration):
        return f"pid {pid}"
    argv = [a for a in argv if a]
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "attnlab":
        argv = ["attnlab", *argv[argv.index("-m") + 2 :]]
    elif argv and Path(argv[0]).name == "attnlab":
        argv = ["attnlab", *argv[1:]]
    command = " ".join(argv)
    command = command if len(command) <= 120 else command[:117] + "..."
    since = time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(boot + ticks / os.sysconf("SC_CLK_TCK"))
    )
    return f"pid {pid}: {command}, running since {since}"


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def model_class(model_type: str) -> type[nn.Module]:
    """The class registered for config.json's ``model_type`` (``attnlab.models.declare``)."""
    from attnlab.models.declare import registered

    kinds = registered()
    if model_type not in kinds:
        raise RunError(f"unknown model_type {model_type!r}; known: {', '.join(kinds)}")
    return kinds[model_type]


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DistributedDataParallel's wrappers."""
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    return getattr(model, "module", model)  # DistributedDataParallel wrapper


def state_dict_for_saving(
    model: nn.Module, sd: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The unwrapped model's state dict (or ``sd``, one gathered from a sharded model) with
    tied copies dropped (stored once)."""
    model = unwrap(model)
    sd = model.state_dict() if sd is None else sd
    tied = (
        getattr(model, "tied_weights_keys", ())
        if getattr(model.config, "tie_weights", False)
        else ()
    )
    return {k: v for k, v in sd.items() if k not in tied}


def check_state_dict(
    model: nn.Module, tensors: dict[str, torch.Tensor] | dict[str, TensorInfo], source: str
) -> None:
    """Every name, shape and dtype must match what the config's model expects.

    ``tensors`` may be the tensors or, to check before reading any data, a header's
    ``TensorInfo``s; ``model`` may be on the meta device. The first difference is a RunError."""
    expected = state_dict_for_saving(model)
    missing = [k for k in expected if k not in tensors]  # in the model's order
    extra = sorted(set(tensors) - set(expected))
    if missing:
        raise RunError(f"{source}: does not match config.json: missing tensor {missing[0]!r}"
                       + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))  # fmt: skip
    if extra:
        raise RunError(f"{source}: does not match config.json: unexpected tensor {extra[0]!r}")
    for k, ref in expected.items():
        t = tensors[k]
        if tuple(t.shape) != tuple(ref.shape):
            raise RunError(f"{source}: does not match config.json: {k} has shape {tuple(t.shape)}, "
                           f"config.json implies {tuple(ref.shape)}")  # fmt: skip
        if t.dtype != ref.dtype:
            raise RunError(f"{source}: {k} has dtype {t.dtype}, expected {ref.dtype}")


def save_model(
    run_dir: str | Path,
    model: nn.Module,
    tokenizer: Tokenizer | None = None,
    extra: dict | None = None,
) -> None:
    """Write config.json, model.safetensors (and tokenizer.json) into ``run_dir``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    inner = unwrap(model)
    save_tensors(
        run_dir / "model.safetensors", state_dict_for_saving(inner), metadata={"format": "pt"}
    )
    if tokenizer is not None:
        write_tokenizer(run_dir, tokenizer)
    write_run_config(run_dir, inner, extra)


def write_tokenizer(run_dir: str | Path, tokenizer) -> None:
    """tokenizer.json (and target_tokenizer.json for a PairTokenizer, as a seq2seq run has)."""
    files = getattr(tokenizer, "to_json_files", None)
    files = files() if files else {"tokenizer.json": tokenizer.to_json()}
    for name, text in files.items():
        atomic_write_text(Path(run_dir) / name, text)


def write_run_config(run_dir: str | Path, model: nn.Module, extra: dict | None = None) -> None:
    """Write config.json: format version, model_type, the model's config, and ``extra``."""
    inner = unwrap(model)
    cfg = {"attnlab_format": FORMAT_VERSION, "model_type": inner.model_type}
    cfg["config"] = inner.config.to_dict()
    cfg.update(extra or {})
    atomic_write_json(Path(run_dir) / "config.json", cfg)


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``; a RunError naming the file if it is not one."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise RunError(f"{path}: expected a JSON object")
    return cfg


def read_run_config(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunError(f"{run_dir}: no such run directory")
    if run_dir.is_file():
        if run_dir.suffix.lower() in PICKLE_SUFFIXES:
            raise RunError(f"{run_dir}: pickle checkpoints are refused (attnlab never unpickles); "
                           "give a run directory with model.safetensors")  # fmt: skip
        raise RunError(f"{run_dir}: expected a run directory, got a file")
    pickles = [p.name for p in sorted(run_dir.iterdir()) if looks_like_pickle(p)]
    path = run_dir / "config.json"
    if not path.is_file():
        hint = (
            f" (found {pickles[0]}: pickles are refused, attnlab never unpickles)"
            if pickles
            else ""
        )
        raise RunError(f"{run_dir}: no config.json, so this is not an attnlab run directory{hint}")
    cfg = read_json_object(path)
    version = cfg.get("attnlab_format")
    hf_like = "architectures" in cfg or "model_type" in cfg
    if version is None and hf_like and not isinstance(cfg.get("config"), dict):
        raise RunError(
            f"{run_dir}: a Hugging Face model directory ({cfg.get('model_type') or 'unknown'}), "
            f"not an attnlab run; convert it first: attnlab import-hf {run_dir} --out "
            f"runs/{run_dir.resolve().name or 'imported'}"
        )
    if version is None:
        raise RunError(f"{path}: no attnlab_format version (not written by attnlab, or too old)")
    if version != FORMAT_VERSION:
        raise RunError(
            f"{path}: unknown attnlab_format {version!r}; this attnlab reads {FORMAT_VERSION}"
        )
    if not (run_dir / "model.safetensors").is_file():
        hint = (
            f" (found {pickles[0]}: pickles are refused, attnlab never unpickles)"
            if pickles
            else ""
        )
        raise RunError(f"{run_dir}: no model.safetensors{hint}")
    return cfg


def build_model(
    cfg: dict, source: str | Path = "config.json", *, device: str | torch.device | None = None
) -> nn.Module:
    """The model ``cfg`` (a run's config.json, read from ``source``) describes, freshly built.

    ``device="meta"`` builds it without allocating or initialising anything: every tensor has
    its shape and dtype but no memory (``check_run`` compares those with the weights file).
    """
    try:
        cls = model_class(cfg.get("model_type", ""))
    except RunError as e:
        raise RunError(f"{source}: {e}") from None
    try:
        config = cls.config_class.from_dict(cfg.get("config", {}))
    except (ConfigError, TypeError, AttributeError) as e:
        raise RunError(f"{source}: invalid {cls.__name__} config ({e})") from None
    if device is None:
        return cls(config)
    try:
        with (
            torch.device(device),
            _no_init() if str(device) == "meta" else contextlib.nullcontext(),
        ):
            return cls(config)
    except (ValueError, RuntimeError, OverflowError) as e:  # e.g. a size past int64
        raise RunError(
            f"{source}: cannot build the {cls.__name__} it describes ({_short(e)})"
        ) from None


# torch.nn.init's in-place initialisers, which every torch module and attnlab model calls
_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
                   "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                   "kaiming_normal_", "orthogonal_", "sparse_")  # fmt: skip


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """torch.nn.init does nothing inside this block. A model built on the meta device has
    nothing to initialise, and the first random fill of a meta tensor costs seconds (its meta
    kernel imports torch._dynamo). Not thread-safe: it patches the torch.nn.init module."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    for name in _INIT_FUNCTIONS:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


# Tables a model computes instead of storing (position tables) may take at most the size of
# its weights plus this: a config cannot make a loader allocate through them either.
COMPUTED_ALLOWANCE = 64 << 20


@dataclasses.dataclass
class CheckedRun:
    """A run directory whose files agree with each other, read without its tensor data."""

    run_dir: Path
    config: dict  # config.json
    header: SafetensorsHeader  # model.safetensors: names, dtypes, shapes, offsets
    model: nn.Module  # the model config.json describes, on the meta device
    tokenizer: Any  # Tokenizer, PairTokenizer (encoder-decoder), ImageTokenizer (ViT) or None


def check_run(run_dir: str | Path, cfg: dict | None = None) -> CheckedRun:
    """Check that a run directory's config.json (``cfg`` if it was read already), weights and
    tokenizer agree, allocating nothing; the first difference is a RunError naming the file.
    The steps are listed at the top of this module; ``open_model`` then only has to read the
    weights."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir) if cfg is None else cfg
    config_path, weights = run_dir / "config.json", run_dir / "model.safetensors"
    header = read_header(weights)
    _check_layer_counts(cfg, header, config_path)
    model = build_model(cfg, config_path, device="meta")
    check_state_dict(model, header.tensors, str(weights))
    _check_computed_tables(model, header, config_path)
    tokenizer = read_tokenizer_files(run_dir)
    source = cfg.get("source")
    imported = isinstance(source, dict) and source.get("format") == "huggingface"  # import-hf
    check_tokenizer(model, tokenizer, run_dir, imported)
    return CheckedRun(run_dir, cfg, header, model, tokenizer)


def _check_layer_counts(cfg: dict, header: SafetensorsHeader, source: Path) -> None:
    """Before building: a model on the meta device costs no memory for its tensors, but its
    modules cost time and memory per layer. So the layer counts (every config field named
    like ``n_layer``) are checked first against the number of tensors in the file, predicted
    from tiny builds: tensors(counts) = tensors(all 1) + sum_f (count_f - 1) * per-layer_f.
    Up to twice the file's count is built anyway, to name the first difference."""
    sizes = cfg["config"] if isinstance(cfg.get("config"), dict) else {}
    fields = [k for k, v in sizes.items() if "layer" in k and type(v) is int and v > 1]
    if not fields:
        return

    def tensors(**counts) -> int:
        probe = {**cfg, "config": {**sizes, **counts}}
        return len(state_dict_for_saving(build_model(probe, source, device="meta")))

    ones = {k: 1 for k in fields}
    base = tensors(**ones)
    implied = base + sum((sizes[k] - 1) * (tensors(**{**ones, k: 2}) - base) for k in fields)
    if implied > 2 * len(header.tensors) + 16:
        counts = ", ".join(f"{k} = {sizes[k]:,}" for k in fields)
        raise RunError(f"{source}: {counts} implies {implied:,} tensors, but model.safetensors "
                       f"holds {len(header.tensors):,}")  # fmt: skip


def _check_computed_tables(model: nn.Module, header: SafetensorsHeader, source: Path) -> None:
    sizes = {
        name: (b.numel() * b.element_size(), tuple(b.shape)) for name, b in model.named_buffers()
    }
    total = sum(size for size, _ in sizes.values())
    if total > header.nbytes + COMPUTED_ALLOWANCE:
        name = max(sizes, key=lambda n: sizes[n][0])
        raise RunError(
            f"{source}: the model it describes computes {_size(total)} of tables (such as "
            f"{name}, {sizes[name][1]}), more than its {_size(header.nbytes)} of weights allow"
        )


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def check_tokenizer(
    model: nn.Module, tokenizer, run_dir: str | Path, imported: bool = False
) -> None:
    """The tokenizer must speak the model's ids: the same vocabulary size (each side of an
    encoder-decoder, counting its <pad>, <bos>, <eos>), and for a ViT the same classes, image
    size and channels (the model's ``tokenizer_fields``). A run imported from Hugging Face (``imported``)
    may have a larger vocabulary than its tokenizer, as ``import-hf`` accepts (some models pad
    it), but never a smaller one. A run saved without a tokenizer passes."""
    if tokenizer is None:
        return
    run_dir, kind, fields = Path(run_dir), model.model_type, model.tokenizer_fields
    for name in dict.fromkeys(name for *_, name in fields):
        if not (run_dir / name).is_file():
            raise RunError(f"{run_dir}: has tokenizer.json but no {name}, which a {kind} run needs")
    for field, attr, name in fields:
        got, want = getattr(tokenizer, attr, None), getattr(model.config, field)
        if got is None:
            what = getattr(tokenizer, "kind", type(tokenizer).__name__)
            raise RunError(f"{run_dir / name}: a {kind} run needs a tokenizer with {attr}; "
                           f"this one is a {what} tokenizer")  # fmt: skip
        if got != want and not (imported and field == "vocab_size" and got < want):
            specials = " (with <pad>, <bos>, <eos>)" if isinstance(tokenizer, PairTokenizer) else ""
            raise RunError(f"{run_dir / name}: does not match config.json: the tokenizer's "
                           f"{attr} is {got}{specials}, config.json's {field} is {want}")  # fmt: skip


def assign_weights(model: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """Give a model built on the meta device its weights, by reference: no copy.

    ``load_state_dict(assign=True)`` makes each tensor the parameter itself. Then tied copies
    (a GPT's lm_head is its tok_embed, stored once) are tied again to the stored parameter,
    and each module with tables it computes rather than stores (positions) recomputes them
    with its ``reset_buffers()``. Names, shapes and dtypes must have been checked
    (``check_state_dict``): what is left on the meta device afterwards is an error.
    """
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    result = model.load_state_dict(tensors, strict=False, assign=True)
    for names in names_of.values():
        stored = [n for n in names if n in tensors]
        if len(names) > 1 and len(stored) == 1:  # tied: every name is the stored parameter
            param = model.get_parameter(stored[0])
            for name in names:
                owner, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(owner), leaf, param)
    for module in model.modules():
        if any(b.is_meta for b in module.buffers(recurse=False)):
            if not hasattr(module, "reset_buffers"):  # a new module: see attnlab.positional
                raise TypeError(f"{type(module).__name__} has buffers that are not in the "
                                "checkpoint, so it needs a reset_buffers() that computes them")  # fmt: skip
            module.reset_buffers()
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left or result.unexpected_keys:
        raise RunError(f"weights not assigned: {(left or result.unexpected_keys)[0]!r}")
    return model


def load_model(run_dir: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The run's model in eval mode (see ``open_model``)."""
    return open_model(run_dir, device)[0]


def open_model(
    run_dir: str | Path, device: str | torch.device = "cpu", cfg: dict | None = None
) -> tuple[nn.Module, Tokenizer | None]:
    """``(model, tokenizer)`` for any run directory, trained or imported, in eval mode; the
    loader under ``attnlab.load_run`` (the one door to a run), given its config.json once read.

    Everything is checked before the weights are read (``check_run``); then the weights are
    memory-mapped and assigned to the model built on the meta device (``assign_weights``), so
    loading costs one copy of them. An encoder-decoder run (one with ``target_tokenizer.json``)
    gives a ``PairTokenizer``, a ViT run an ``ImageTokenizer``.
    """
    for attempt in range(3):  # a training run may replace model.safetensors as we read it
        run = check_run(run_dir, cfg if attempt == 0 else None)
        try:
            tensors = load_tensors(run.header.path, mmap=True, header=run.header)
            break
        except FileChangedError:
            if attempt == 2:
                raise
    model = assign_weights(run.model, tensors)
    return model.to(device).eval(), run.tokenizer


# ---------------------------------------------------------------------------------------------
# Training runs: the directory, checkpoints, trainer state and metrics (written by the Trainer)
# ---------------------------------------------------------------------------------------------

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss.png"
SNAPSHOT_DIR, SNAPSHOT_PREFIX = "snapshots", "step-"  # snapshots/step-00000250.safetensors
STAGING, READY = "ckpt-tmp", "ckpt-ready"
CHECKPOINT_FILES = (OPTIMIZER_FILE, MODEL_FILE, STATE_FILE)  # install order: state last
# what makes a directory a run (one of these, and starting a new run there is refused)
RUN_FILES = ("config.json", MODEL_FILE, STATE_FILE, "tokenizer.json", METRICS_FILE)


def check_writable(run_dir: str | Path) -> None:
    """Create ``run_dir`` if needed and prove a file can be written there (then remove it)."""
    d = Path(run_dir)
    try:
        if d.exists() and not d.is_dir():
            raise RunError(f"{d}: exists and is not a directory")
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / ".write-test", "ok")
        (d / ".write-test").unlink()
    except OSError as e:
        raise RunError(
            f"cannot write the run directory {d}: {e.strerror or e} "
            "(nothing was trained; choose another --out)"
        ) from None


def check_new_run(run_dir: str | Path) -> None:
    """A new run may go into a missing or empty directory, or one holding other files; one that
    holds a run (even part of one) is refused: it is continued with --resume, never replaced."""
    d = Path(run_dir)
    if d.exists() and not d.is_dir():
        raise RunError(f"{d}: exists and is not a directory")
    found = [name for name in RUN_FILES if (d / name).exists()]
    if not found:
        return
    if (d / STATE_FILE).is_file():
        try:
            step = read_trainer_state(d).get("step")
        except RunError:
            step = None
        held = f"a training run (step {step})" if step is not None else "a training run"
        raise RunError(
            f"{d} already holds {held}; pass --resume to continue it, or choose another --out"
        )
    if (d / MODEL_FILE).is_file():
        raise RunError(f"{d} already holds a model; choose another --out (it is left as it is)")
    raise RunError(
        f"{d} holds part of a run that never wrote its first checkpoint ({found[0]}); "
        "remove the directory or choose another --out"
    )


def create_run_dir(run_dir: str | Path) -> bool:
    """Create (or reuse) the directory of a new run and prove it writable; True if it is new."""
    created = not Path(run_dir).exists()
    check_writable(run_dir)
    return created


def remove_partial_run(run_dir: str | Path, created: bool, names: tuple[str, ...] = ()) -> None:
    """Bad input found while a new run was being prepared: leave nothing behind. A directory
    this run created is removed whole; in one that existed, only ``names`` (files or
    directories, such as a task's token shards) and the files every run writes are removed,
    with their temporary copies."""
    d = Path(run_dir)
    if created:
        shutil.rmtree(d, ignore_errors=True)
        return
    for name in (*names, *RUN_FILES, "target_tokenizer.json", OPTIMIZER_FILE, CURVE_FILE):
        if (d / name).is_dir() and not (d / name).is_symlink():
            shutil.rmtree(d / name, ignore_errors=True)
        else:
            (d / name).unlink(missing_ok=True)
        for tmp in d.glob(f".{name}.*tmp"):
            tmp.unlink(missing_ok=True)
    shutil.rmtree(d / "best", ignore_errors=True)
    for name in (STAGING, READY, SNAPSHOT_DIR):
        shutil.rmtree(d / name, ignore_errors=True)


def write_run_files(run_dir: str | Path, model: nn.Module, tokenizer, extra: dict) -> None:
    """config.json and the tokenizer files, in ``run_dir`` and in ``run_dir/best``: written
    once, before the first step (which also proves the directory writable before training)."""
    d = Path(run_dir)
    try:
        for target in (d, d / "best"):
            target.mkdir(exist_ok=True)
            write_run_config(target, model, extra)
            if tokenizer is not None:
                write_tokenizer(target, tokenizer)
    except OSError as e:
        raise RunError(
            f"cannot write the run directory {d}: {e.strerror or e} (nothing was trained)"
        ) from None


def write_checkpoint(
    run_dir: str | Path,
    model_tensors: dict[str, torch.Tensor],
    optimizer_tensors: dict[str, torch.Tensor],
    state: dict,
    fault: Callable[[str, Path], None] | None = None,
) -> None:
    """Write one checkpoint (model, optimizer, trainer state of ``state["step"]``) whole or not
    at all: staged in ``ckpt-tmp/``, committed by renaming it ``ckpt-ready/``, then installed.

    ``fault(point, staging_dir)`` is a test hook called at "start", "optimizer" (model staged)
    and "installed-model". An OSError (a full disk) leaves the previous checkpoint in place.
    """
    d = Path(run_dir)
    staging, ready = d / STAGING, d / READY
    hook = fault or (lambda point, where: None)
    try:
        hook("start", staging)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        meta = {"format": "pt", "step": str(state["step"])}
        save_tensors(staging / MODEL_FILE, model_tensors, meta)
        hook("optimizer", staging)
        save_tensors(staging / OPTIMIZER_FILE, optimizer_tensors)
        atomic_write_json(staging / STATE_FILE, state)
        fsync_dir(staging)
        os.replace(staging, ready)  # the commit point
        fsync_dir(d)
        for name in CHECKPOINT_FILES:
            os.replace(ready / name, d / name)
            if name == MODEL_FILE:
                hook("installed-model", staging)
        fsync_dir(d)
        ready.rmdir()
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def recover_checkpoint(run_dir: str | Path) -> None:
    """Bring a run directory back to one whole checkpoint after a crash: finish installing a
    committed ``ckpt-ready/``, discard an uncommitted ``ckpt-tmp/`` and half-written files."""
    run_dir = Path(run_dir)
    ready = run_dir / READY
    if ready.is_dir():
        for name in CHECKPOINT_FILES:
            if (ready / name).exists():
                os.replace(ready / name, run_dir / name)
        fsync_dir(run_dir)
        shutil.rmtree(ready)
    shutil.rmtree(run_dir / STAGING, ignore_errors=True)
    for tmp in list(run_dir.glob(".*.tmp")) + list((run_dir / "best").glob(".*.tmp")):
        tmp.unlink(missing_ok=True)  # a file whose atomic write was cut short


def read_trainer_state(run_dir: str | Path) -> dict | None:
    """trainer_state.json as a dict; None when the run has no checkpoint yet."""
    path = Path(run_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunError(f"{path}: cannot read ({e})") from None
    if not isinstance(state, dict):
        raise RunError(f"{path}: not a trainer state (expected a JSON object)")
    return state


def read_checkpoint(run_dir: str | Path) -> tuple[dict, dict, dict] | None:
    """(trainer state, model tensors, optimizer tensors) of the run's last checkpoint, after
    ``recover_checkpoint``; None if it has none. The state's step must be a number and the
    model's weights must be of that step (their metadata says which)."""
    d = Path(run_dir)
    state = read_trainer_state(d)
    if state is None:
        return None
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise RunError(f"{d / STATE_FILE}: not a trainer state (no step number)")
    tensors = load_tensors(d / MODEL_FILE)
    from safetensors import safe_open

    with safe_open(str(d / MODEL_FILE), "pt") as f:
        model_step = (f.metadata() or {}).get("step", "-1")
    if str(model_step) != str(step):
        raise RunError(
            f"{d}: model.safetensors is from step {model_step} but trainer_state.json "
            f"from step {step}"
        )
    return state, tensors, load_tensors(d / OPTIMIZER_FILE)


def read_tokenizer_files(run_dir: str | Path):
    """The run's tokenizer: tokenizer.json, paired with target_tokenizer.json when there is one
    (an encoder-decoder run); None when the run has no tokenizer."""
    run_dir = Path(run_dir)
    src, tgt = run_dir / "tokenizer.json", run_dir / "target_tokenizer.json"
    if tgt.is_file() and not src.is_file():
        raise RunError(f"{run_dir}: target_tokenizer.json without tokenizer.json")
    try:
        tok = load_tokenizer(src) if src.is_file() else None
        if tok is not None and tgt.is_file():
            tok = PairTokenizer(tok, load_tokenizer(tgt))
    except TokenizerError as e:
        raise RunError(str(e)) from None  # it names the file
    return tok


def write_best(run_dir: str | Path, model_tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """best/model.safetensors; ``meta`` (step, metric, value) goes into its metadata."""
    meta = {"format": "pt", **{k: str(v) for k, v in meta.items()}}
    save_tensors(Path(run_dir) / "best" / MODEL_FILE, model_tensors, meta)


def append_metrics(run_dir: str | Path, row: dict) -> None:
    with open(Path(run_dir) / METRICS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl file (a run directory, or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def truncate_metrics(run_dir: str | Path, step: int) -> list[dict]:
    """Keep the rows up to ``step`` (a resumed run rewrites what came after its checkpoint)."""
    path = Path(run_dir) / METRICS_FILE
    keep = [row for row in read_metrics(path) if row.get("step", 0) <= step]
    if path.is_file():
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in keep))
    return keep


def clear_metrics(run_dir: str | Path) -> None:
    """A run starting from step 0 begins with no metrics and no curve."""
    for name in (METRICS_FILE, CURVE_FILE):
        (Path(run_dir) / name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Training snapshots: attention and head scores recorded during training
# (written by attnlab.training.snapshots, read by attnlab timeline)
# ---------------------------------------------------------------------------------------------


def snapshot_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR / f"{SNAPSHOT_PREFIX}{step:08d}.safetensors"


def write_snapshot(run_dir: str | Path, step: int, tensors: dict[str, torch.Tensor],
                   meta: dict) -> Path:  # fmt: skip
    """``snapshots/step-NNNNNNNN.safetensors``: ``tensors`` and ``meta`` (JSON, in the file's
    metadata), written whole or not at all."""
    path = snapshot_path(run_dir, step)
    path.parent.mkdir(exist_ok=True)
    save_tensors(path, tensors, {"format": "pt", "snapshot": json.dumps({"step": step, **meta})})
    return path


def snapshot_steps(run_dir: str | Path) -> list[int]:
    """The steps that have a snapshot, in order."""
    d = Path(run_dir) / SNAPSHOT_DIR
    steps = []
    for p in d.glob(f"{SNAPSHOT_PREFIX}*.safetensors") if d.is_dir() else ():
        number = p.name[len(SNAPSHOT_PREFIX) : -len(".safetensors")]
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)


def read_snapshot(run_dir: str | Path, step: int, keys=None) -> tuple[dict, dict]:
    """(meta, tensors) of the snapshot of ``step``: every tensor, or those whose name starts
    with one of ``keys`` (the scores alone, without the patterns). A RunError names a damaged
    file."""
    from safetensors import safe_open

    path = snapshot_path(run_dir, step)
    try:
        with safe_open(str(path), "pt") as f:
            meta = json.loads((f.metadata() or {}).get("snapshot", "null"))
            names = [k for k in f.keys() if keys is None or k.startswith(tuple(keys))]  # noqa: SIM118
            tensors = {k: f.get_tensor(k) for k in names}
    except FileNotFoundError:
        raise RunError(f"{path}: file not found") from None
    except Exception as e:  # safetensors' own error types, bad JSON
        raise RunError(f"{path}: not a valid snapshot ({_short(e)})") from None
    if not isinstance(meta, dict) or meta.get("step") != step:
        raise RunError(f"{path}: not a valid snapshot (its metadata names no step {step})")
    return meta, tensors


def truncate_snapshots(run_dir: str | Path, step: int) -> None:
    """Remove the snapshots after ``step`` (a resumed run takes them again)."""
    for s in snapshot_steps(run_dir):
        if s > step:
            snapshot_path(run_dir, s).unlink(missing_ok=True)
    d = Path(run_dir) / SNAPSHOT_DIR
    for tmp in d.glob(".*.tmp") if d.is_dir() else ():
        tmp.unlink(missing_ok=True)


def clear_snapshots(run_dir: str | Path) -> None:
    """A run starting from step 0 begins with no snapshots."""
    shutil.rmtree(Path(run_dir) / SNAPSHOT_DIR, ignore_errors=True)
