"""Safe file writing: atomic writes, and one OS lock object.

    atomic_write_json(path, obj)      written to a temporary name in the same directory,
                                      fsynced, renamed: a crash never leaves half a file
    with FileLock(run_dir):           one writer at a time (an flock that dies with its process)

Nothing here knows who writes what: the lock a writer holds is an object it holds and passes
to whoever writes under it (``attnlab.rundir.RunDir`` holds a run directory's; the
token-shard cache holds its own), never a module global that every write consults.

``RunError`` (a run directory that is missing, incomplete, corrupt, inconsistent, or being
written by another process) is defined here, below everything that raises it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock (nothing else changes)
    fcntl = None


class RunError(AttnlabError):
    """A run directory that is missing, incomplete, corrupt or inconsistent."""


class FileChangedError(RunError):
    """A file no longer the one whose header was checked (a writer replaced it meanwhile)."""


# ---------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------


def atomic_write(path: str | Path, write: Callable[[str], Any]) -> None:
    """Call ``write(tmp_path)``, fsync the result, then rename it onto ``path``."""
    path = Path(path)
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


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def fsync_dir(d: str | Path) -> None:
    """Make a directory's entries (a rename into it) durable; a no-op where that fails."""
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


def _about(e: OSError, path: Path) -> OSError:
    """The same error (type, errno, message) about ``path``."""
    return type(e)(e.errno, e.strerror, str(path)) if e.errno else e


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------------------------


class FileLock:
    """An OS lock (``flock``) on ``path``, held by this object while a ``with`` block runs.

    The kernel drops it when the process ends, however it ends (kill -9 too). Two uses:

    - ``FileLock(run_dir)``: the writer lock of a directory, on the directory itself, so taking
      it creates and changes nothing there. A second writer is refused at once with a RunError
      naming the holder (its pid, command and start time). A directory that does not exist yet
      is not locked on entry: whoever creates it calls ``take()`` before writing into it.
    - ``FileLock(lock_file, wait=True, create=True)``: a lock file (created if missing) that a
      second process waits for, as the token-shard cache does.

    Entering a lock already held by this object is a no-op (the outer block keeps it), so one
    object can be passed down to code that also enters it; outside a ``with`` block it holds
    nothing. ``enabled=False`` takes nothing
    (the processes of a torchrun job other than rank 0, which write nothing).
    """

    def __init__(self, path: str | Path, *, wait: bool = False, create: bool = False,
                 enabled: bool = True):  # fmt: skip
        self.path = Path(path)
        self.wait, self.create, self.enabled = wait, create, enabled
        self.fd: int | None = None
        self._depth = 0

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __enter__(self) -> FileLock:
        self._depth += 1
        if self._depth == 1 and (self.create or self.path.exists()):
            try:
                self.take()
            except BaseException:
                self._depth -= 1
                raise
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.release()

    def take(self) -> None:
        """Take the lock now, if not held (a RunError if another process holds it). A path
        that cannot be opened is left unlocked: the write that follows says what is wrong.
        Outside a ``with`` block this does nothing: the lock is held only while one runs."""
        if self.fd is not None or not self.enabled or fcntl is None or self._depth == 0:
            return
        if self.create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # a directory or a file; os.open's descriptors are not inherited by children
            fd = os.open(self.path, os.O_RDONLY | (os.O_CREAT if self.create else 0), 0o666)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise RunError(
                f"{self.path}: another process is writing this run directory "
                f"({lock_holder(self.path)}); wait for it to finish or stop it, or write to "
                "another directory"
            ) from None
        except OSError:  # a file system without flock (some network mounts): write unlocked
            os.close(fd)
            return
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None


def lock_holder(path: str | Path) -> str:
    """Who holds the flock of ``path``: "pid 123: attnlab train ..., running since <start>",
    read from /proc (Linux); "another process" where that cannot be read. Reads only."""
    try:
        st = os.stat(path)
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
    # a long absolute path (an interpreter, a script) shows as its name: the arguments after
    # it are what tell one run from another, and must not be cut off
    argv = [f".../{Path(a).name}" if a.startswith("/") and len(a) > 24 else a for a in argv]
    command = " ".join(argv)
    command = command if len(command) <= 120 else command[:117] + "..."
    since = time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(boot + ticks / os.sysconf("SC_CLK_TCK"))
    )
    return f"pid {pid}: {command}, running since {since}"
