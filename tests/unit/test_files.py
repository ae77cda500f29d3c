"""Safe file writing: atomic writes, and the one lock object (no module global)."""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from pathlib import Path

import pytest

from attnlab.files import FileLock, RunError, atomic_write, atomic_write_json, atomic_write_text


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    atomic_write_json(path, {"x": 1})

    def half(tmp):
        Path(tmp).write_text("{half")
        raise RuntimeError("cut short")

    with pytest.raises(RuntimeError):
        atomic_write(path, half)
    assert path.read_text() == '{\n  "x": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_an_atomic_write_into_a_missing_directory_names_the_file_asked_for(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        atomic_write_text(tmp_path / "missing" / "a.txt", "x")
    assert e.value.filename == str(tmp_path / "missing" / "a.txt")


def _free(path) -> bool:
    """Whether another writer (another descriptor, even in this process) could take it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_lock_is_held_by_its_object_and_nests(tmp_path):
    lock = FileLock(tmp_path)
    with lock:
        assert lock.held and not _free(tmp_path)
        with lock:  # the outer block keeps it
            pass
        assert lock.held and not _free(tmp_path)
        atomic_write_text(tmp_path / "a.txt", "writes take no lock of their own")
    assert not lock.held and _free(tmp_path)


def test_a_second_lock_object_is_refused_naming_this_process(tmp_path):
    message = rf"^{re.escape(str(tmp_path))}: another process .*\(pid {os.getpid()}"
    with FileLock(tmp_path), pytest.raises(RunError, match=message), FileLock(tmp_path):
        pass
    with FileLock(tmp_path):  # free again once released
        pass


def test_a_missing_directory_is_locked_when_taken(tmp_path):
    d = tmp_path / "new"
    with FileLock(d) as lock:
        assert not lock.held and not d.exists()  # entering creates nothing
        d.mkdir()
        lock.take()
        assert lock.held and not _free(d)
    assert _free(d)


def test_disabled_takes_nothing(tmp_path):
    with FileLock(tmp_path, enabled=False) as lock:
        lock.take()
        assert not lock.held and _free(tmp_path)


def test_a_waiting_lock_file_waits_for_its_holder(tmp_path):
    """The shard cache's kind: a lock file made on demand, which a second writer waits for."""
    path = tmp_path / "cache" / ".shards.lock"
    got = []
    with FileLock(path, wait=True, create=True):
        assert path.is_file()

        def second():
            with FileLock(path, wait=True):
                got.append(1)

        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and not got  # waiting, not refused
    waiter.join(10)
    assert got == [1]


def test_outside_a_with_block_the_lock_holds_nothing(tmp_path):
    lock = FileLock(tmp_path)
    lock.take()
    assert not lock.held and _free(tmp_path)
