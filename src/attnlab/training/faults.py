"""Fault injection for the tests: a Trainer callback, ``Faults(spec)``, given by the test.

``spec`` is comma separated:
kill-during-checkpoint:N  SIGKILL itself while staging the N-th checkpoint of this process
                          (model written, optimizer half written, nothing committed)
kill-during-install:N     SIGKILL itself while installing the N-th checkpoint (committed,
                          model moved into place, trainer_state.json not yet)
disk-full-at-checkpoint:N the N-th checkpoint write fails with ENOSPC
nan-at:S                  the loss of step S (from 0) becomes NaN
step-delay:SECONDS        sleep after every step (so a test can kill a run mid-way)
sigint-at:S, sigterm-at:S the process sends itself SIGINT / SIGTERM once step S is done

The training loop knows nothing of it: a test passes ``callbacks=[Faults(spec)]`` to the
Trainer or to ``attnlab.training.run.train`` (the tests' ``fault_cli.py`` runs the ``attnlab``
command with it).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from attnlab.rundir.layout import OPTIMIZER_FILE


class Faults:
    """The Trainer callback that injects the faults ``spec`` names (see the module docstring)."""

    def __init__(self, spec: str):
        self.items: dict[str, float] = {}
        for part in filter(None, spec.split(",")):
            name, _, value = part.partition(":")
            self.items[name.strip()] = float(value or 1)
        self.saves = 0  # checkpoints begun by this process

    def at(self, name: str, value: float) -> bool:
        return self.items.get(name) == value

    def on_loss(self, trainer, loss):
        return loss * float("nan") if self.at("nan-at", trainer.step) else loss

    def on_step_end(self, trainer) -> None:
        delay = self.items.get("step-delay")
        if delay:
            time.sleep(delay)
        for name, sig in (("sigint-at", signal.SIGINT), ("sigterm-at", signal.SIGTERM)):
            if self.at(name, trainer.step):
                os.kill(os.getpid(), sig)

    def on_save(self, trainer, point: str, staging: Path) -> None:
        if point == "start":
            self.saves += 1
        n = self.saves
        if point == "start" and self.at("disk-full-at-checkpoint", n):
            raise OSError(28, "No space left on device (injected)")
        if point == "optimizer" and self.at("kill-during-checkpoint", n):
            (staging / OPTIMIZER_FILE).write_bytes(b"\0" * 100)  # half a file
            os.kill(os.getpid(), signal.SIGKILL)
        if point == "installed-model" and self.at("kill-during-install", n):
            os.kill(os.getpid(), signal.SIGKILL)
