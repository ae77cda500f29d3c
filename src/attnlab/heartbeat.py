"""No silence longer than a couple of seconds: a ``Heartbeat`` says that long work is still
running, and how far it is when the work counts (``count``).

Used where work has no progress bar of its own: an evaluation, scoring a big file, training a
tokenizer, building a large model, importing weights. It speaks only after its input has been
checked (so nothing precedes an error line), on stderr, and only while nothing else is said.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

_last_output = 0.0  # time.monotonic() of the last line said through stamped()
_beating: list[Heartbeat] = []  # the heartbeats running now, innermost last


def stamped(log: Callable[[str], None]) -> Callable[[str], None]:
    """``log`` that also notes when it last spoke, so a Heartbeat keeps quiet while other lines
    (tokenizing, evaluating) are arriving."""

    def say(line: str) -> None:
        global _last_output
        _last_output = time.monotonic()
        log(line)

    return say


def duration(seconds: float) -> str:
    """``45s``, ``3m20s``, ``1h05m``: a time left, to the second under an hour."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def count(done: int, total: int | None = None, unit: str = "") -> None:
    """Work in progress reports how far it is (``count(12, 40, "batches")``); the innermost
    running Heartbeat shows it. Without one, this does nothing."""
    if _beating:
        _beating[-1].done, _beating[-1].total, _beating[-1].unit = done, total, unit


class Heartbeat:
    """A line on stderr after every ``every`` seconds that ``what`` is still running with
    nothing else said (``evaluating at step 0: 12/40 batches, 6 s``); none if it ends sooner.
    Work that can count reports through ``count``. ``show`` replaces the printed line (a
    progress bar's label, say). Nested heartbeats: only the innermost speaks.

        with Heartbeat("importing gpt2", log):
            slow_work()
    """

    def __init__(self, what: str, log: Callable[[str], None] | None = None,
                 every: float = 2.0, show: Callable[[str], None] | None = None):  # fmt: skip
        self.what, self.every = what, every
        self.show = show or stamped(log or (lambda s: print(s, file=sys.stderr, flush=True)))
        self.done: int | None = None
        self.total: int | None = None
        self.unit = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self, seconds: float) -> str:
        """``evaluating at step 0: 9/20 val batches, 6 s, 7s left`` (the time left at the pace
        so far, once the work counts and knows its total)."""
        if self.done is None:
            return f"{self.what} ... {seconds:.0f} s"
        of = f"/{self.total:,}" if self.total else ""
        line = f"{self.what}: {self.done:,}{of} {self.unit}, {seconds:.0f} s".replace("  ", " ")
        if self.total and 0 < self.done < self.total:
            line += f", {duration(seconds / self.done * (self.total - self.done))} left"
        return line

    def _beat(self) -> None:
        start = last = time.monotonic()
        while not self._stop.wait(0.25):
            now = time.monotonic()
            if self is _beating[-1] and now - max(last, _last_output) >= self.every:
                self.show(self.line(now - start))
                last = time.monotonic()

    def __enter__(self) -> Heartbeat:
        _beating.append(self)
        self._thread = threading.Thread(target=self._beat, name="attnlab-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        _beating.remove(self)


def beating(what: str, log: Callable[[str], None] | None):
    """``Heartbeat(what, log)``, or nothing when there is no ``log`` (a quiet run)."""
    import contextlib

    return Heartbeat(what, log) if log is not None else contextlib.nullcontext()
