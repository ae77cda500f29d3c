"""The random-number states a checkpoint restores (as JSON-safe base64), so that a resumed run
draws the same dropout masks as an uninterrupted one."""

from __future__ import annotations

import base64

import numpy as np
import torch
from torch import Tensor


def _b64(t: Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def unb64(s: str) -> Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy())


def rng_state() -> dict:
    state = {"torch": _b64(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def check_rng_state(state: dict) -> None:
    """Raise (ValueError, RuntimeError, KeyError) if ``state`` cannot be restored."""
    scratch = torch.Generator()
    scratch.set_state(unb64(state["torch"]))


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([unb64(s) for s in state["cuda"]])
