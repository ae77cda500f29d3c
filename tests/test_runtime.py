"""Where a model runs: the device choice (attnlab.runtime)."""

from __future__ import annotations

import pytest
import torch

from attnlab import runtime
from attnlab.config import ConfigError

# ---------------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cpu", "auto"])
def test_cpu_and_auto_resolve_on_a_machine_without_a_gpu(name):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert runtime.resolve_device(name) == torch.device("cpu")


@pytest.mark.parametrize(
    "name, says",
    [
        ("nonsense", "unknown device"),
        ("meta", "unknown device"),
        ("cuda:x", "unknown device"),
        ("mps", "no Apple MPS device"),
        ("xpu", "no Intel XPU"),
        ("cuda", "no CUDA GPU"),
        ("cuda:3", "no CUDA GPU"),
    ],
)
def test_a_device_this_machine_lacks_is_a_config_error_naming_it(name, says):
    if name.startswith("cuda") and says != "unknown device" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=f"--device {name}: .*{says}"):
        runtime.resolve_device(name)


def test_a_gpu_index_past_the_last_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(runtime, "device_count", lambda kind: 2 if kind == "cuda" else 0)
    assert runtime.resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match=r"sees 2 CUDA GPUs \(cuda:0..cuda:1\)"):
        runtime.resolve_device("cuda:2")
