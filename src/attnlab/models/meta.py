"""Building a model on the meta device (shapes and dtypes, no memory): what checks a run
before its weights are read, and what an import sizes a model with."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from torch import nn

# torch.nn.init's in-place initialisers, which every torch module and attnlab model calls
_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
                   "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                   "kaiming_normal_", "orthogonal_", "sparse_")  # fmt: skip
_skipping = threading.Lock()


def skip_initialising_meta_tensors() -> None:
    """From now on, torch.nn.init's initialisers return a meta tensor as it is (and do what
    they always did to any other). A meta tensor has no values to initialise, and the first
    random fill of one costs seconds (its meta kernel imports torch._dynamo).

    Installed once for the process, never toggled: patching torch.nn.init for the length of
    one meta build is process-wide, so a model another thread built meanwhile (serve builds
    runs on its worker threads) kept torch.empty's memory as its weights, values like 1e37."""
    with _skipping:
        if getattr(nn.init.normal_, "_skips_meta", False):
            return
        for name in _INIT_FUNCTIONS:
            setattr(nn.init, name, _skipping_meta(getattr(nn.init, name)))


def _skipping_meta(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def init(tensor, *args, **kwargs):
        return tensor if tensor.is_meta else fn(tensor, *args, **kwargs)

    init._skips_meta = True  # type: ignore[attr-defined]
    return init
