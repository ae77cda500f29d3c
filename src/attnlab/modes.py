"""Eval mode for a while: ``with evaluating(model): ...``.

Scoring, decoding, probing and checking all run a model in eval mode (dropout off) and must
hand it back as they found it: a model sampled from or scored mid-training goes on training.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode inside the block; after it, even on an exception, every
    submodule's ``training`` flag is what it was before (a part frozen in eval mode stays so).
    Yields the model. Autograd is the caller's choice: add ``torch.no_grad()`` where wanted."""
    flags = [(m, m.training) for m in model.modules()]
    if any(was for _, was in flags):  # a model already in eval mode (served, sampled) is left be
        model.eval()
    try:
        yield model
    finally:
        for m, was in flags:
            if m.training != was:  # setting a module's flag costs; most are what they were
                m.training = was
