"""Fault injection for the tests, read from $ATTNLAB_FAULT (comma separated):

kill-during-checkpoint:N  SIGKILL itself while staging the N-th checkpoint of this process
                          (model written, optimizer half written, nothing committed)
kill-during-install:N     SIGKILL itself while installing the N-th checkpoint (committed,
                          model moved into place, trainer_state.json not yet)
disk-full-at-checkpoint:N the N-th checkpoint write fails with ENOSPC
nan-at:S                  the loss of step S (from 0) becomes NaN
step-delay:SECONDS        sleep after every step (so a test can kill a run mid-way)
sigint-at:S, sigterm-at:S the process sends itself SIGINT / SIGTERM once step S is done
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

FAULT_ENV = "ATTNLAB_FAULT"


class Faults:
    def __init__(self, spec: str | None = None):
        spec = os.environ.get(FAULT_ENV) if spec is None else spec
        self.items: dict[str, float] = {}
        for part in filter(None, (spec or "").split(",")):
            name, _, value = part.partition(":")
            self.items[name.strip()] = float(value or 1)

    def at(self, name: str, value: float) -> bool:
        return self.items.get(name) == value

    def after_step(self, step: int) -> None:
        delay = self.items.get("step-delay")
        if delay:
            time.sleep(delay)
        for name, sig in (("sigint-at", signal.SIGINT), ("sigterm-at", signal.SIGTERM)):
            if self.at(name, step):
                os.kill(os.getpid(), sig)

    def checkpoint_hook(self, n: int):
        """The ``fault`` hook of ``checkpoint.write_checkpoint`` for the n-th checkpoint."""

        def hook(point: str, staging: Path) -> None:
            if point == "start" and self.at("disk-full-at-checkpoint", n):
                raise OSError(28, "No space left on device (injected)")
            if point == "optimizer" and self.at("kill-during-checkpoint", n):
                (staging / "optimizer.safetensors").write_bytes(b"\0" * 100)  # half a file
                os.kill(os.getpid(), signal.SIGKILL)
            if point == "installed-model" and self.at("kill-during-install", n):
                os.kill(os.getpid(), signal.SIGKILL)

        return hook
