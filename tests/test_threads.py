"""CPU thread policy: only idle cores, unless OMP_NUM_THREADS chooses."""

from __future__ import annotations

import os

import pytest
import torch

from attnlab import runtime


@pytest.fixture
def machine(monkeypatch):
    """A machine with `cpus` cores and a given load average; OMP_NUM_THREADS unset."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    old = torch.get_num_threads()

    def set_(cpus: int, load: float, torch_default: int | None = None):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        torch.set_num_threads(torch_default or cpus)

    yield set_
    torch.set_num_threads(old)


@pytest.mark.parametrize(
    "cpus,load,want",
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 4.6, 1), (8, 2.2, 6), (8, 30, 1)],
)
def test_threads_follow_idle_cores(machine, cpus, load, want):
    machine(cpus, load)
    assert runtime.cpu_threads_for_load() == want


def test_never_more_than_torch_would_use(machine):
    machine(16, 0.0, torch_default=4)
    assert runtime.cpu_threads_for_load() == 4


def test_omp_num_threads_is_the_users_choice(machine, monkeypatch):
    machine(2, 4.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert runtime.cpu_threads_for_load() is None


def test_cli_sets_the_threads_on_cpu_only(machine):
    from attnlab.cli.lm import _set_cpu_threads

    machine(4, 3.0)
    _set_cpu_threads(torch.device("meta"))
    assert torch.get_num_threads() == 4
    _set_cpu_threads(torch.device("cpu"))
    assert torch.get_num_threads() == 1
