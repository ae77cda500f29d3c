"""Fixtures every tier shares: the forked CLI server, SIGINT, the seed. The `cli` and `run`
fixtures live once per tier (tests/*/conftest.py); a fresh-interpreter CLI is
`cli_helpers.run_cli`."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from printed import Printed


def _a_share_of_the_cores() -> None:
    """Under xdist, each worker (and every process it starts) uses its share of the cores.

    torch starts one thread per core in every process, so two workers on two cores ran four
    threads, and every parallel op waited on a descheduled thread: the unit tests took 383 s
    of wall time that way and 128 s with one thread each. A test of thread choice sets or
    removes OMP_NUM_THREADS itself; one already set by whoever runs the suite is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or os.environ.get("OMP_NUM_THREADS"):
        return
    from attnlab.runtime import usable_cpus

    share = max(1, len(usable_cpus()) // workers)
    os.environ["OMP_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)


_a_share_of_the_cores()

# Training draws no loss.png here (about a third of a second of CPU for each of the suite's
# ~500 runs, a tenth of its time) except in the tests of the picture itself, which set
# ATTNLAB_LOSS_PNG=1 (attnlab.training.plots.loss_png_wanted); one set by whoever runs the suite is kept.
os.environ.setdefault("ATTNLAB_LOSS_PNG", "0")


class _Captured:
    """pytest's capsys, its captures handed out as ``Printed`` (tests/printed.py): what a
    test reads of the terminal does not depend on where lines wrap."""

    def __init__(self, capture):
        self._capture = capture

    def readouterr(self):
        res = self._capture.readouterr()
        return res._replace(out=Printed(res.out), err=Printed(res.err))

    def __getattr__(self, name):
        return getattr(self._capture, name)


@pytest.fixture
def capsys(capsys):
    return _Captured(capsys)


@pytest.fixture(scope="session")
def forked_cli():
    """The real CLI, a process per call forked from one warm interpreter (``forked_cli.py``);
    a module whose tests make many calls takes it as its ``cli``. One server a worker: it
    holds no state between calls (each child gets its own cwd, environment and files), and
    starting one (torch imported) was ~2.5 s of the critical path for each of ~25 modules."""
    from forked_cli import ForkedCLI

    server = ForkedCLI()
    yield server
    server.close()


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_reaches_the_suite_and_its_children():
    """SIGINT as in a terminal's foreground, however the suite was started.

    A background job of a non-interactive shell (`make test &` in a script, many CI runners)
    starts with SIGINT ignored (POSIX), and an ignored signal stays ignored across exec. Python
    then installs no KeyboardInterrupt handler, so every `attnlab` the tests start would ignore
    the Ctrl-C they send it (the Ctrl-C test sampled on until its 60 s timeout), and the
    Trainer's in-process tests would find SIG_IGN where they restore Python's handler. So the
    suite takes Python's usual handler for its duration; children started from it then begin
    with SIGINT at its default, as a command typed in a terminal does."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
