"""Where a model runs: the device choice and the CPU-thread policy (attnlab.runtime).

The thread policy reads /proc/stat; here it reads faked texts, so "an idle machine" and "both
cores busy" are exact and the tests do not depend on what else the machine is doing.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ---------------------------------------------------------------------------------------------
# /proc/stat and the busy measurement
# ---------------------------------------------------------------------------------------------

STAT = """cpu  300 0 100 900 0 0 0 0 0 0
cpu0 100 0 50 400 10 0 0 0 0 0
cpu1 200 5 50 500 0 1 2 3 0 0
intr 12345
ctxt 999
"""


def test_proc_stat_lines_are_parsed_per_core():
    # busy = user + nice + system + irq + softirq + steal; all = busy + idle + iowait
    assert runtime.parse_proc_stat(STAT) == {0: (150, 560), 1: (261, 761)}


def stat_text(ticks: dict[int, tuple[int, int]]) -> str:
    """A /proc/stat text where core c has used `busy` of `all` ticks (the rest idle)."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for c, (busy, total) in sorted(ticks.items()):
        lines.append(f"cpu{c} {busy} 0 0 {total - busy} 0 0 0 0 0 0")
    return "\n".join(lines) + "\n"


def sample(ticks, own=0.0, at=0.0):
    return runtime.CpuSample(runtime.parse_proc_stat(stat_text(ticks)), own, at)


def test_busy_cores_counts_other_processes_not_this_one():
    before = sample({0: (0, 0), 1: (0, 0)}, own=0)
    # over 100 ticks a core: core 0 fully busy, core 1 half busy; 30 of those ticks were ours
    after = sample({0: (100, 100), 1: (50, 100)}, own=30)
    assert runtime.busy_cores(before, after, {0, 1}) == pytest.approx(1.2)
    assert runtime.busy_cores(before, after, {1}) == pytest.approx(0.2)  # only our cores count


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), min_size=1, max_size=8),
       st.integers(0, 300))  # fmt: skip
def test_busy_cores_is_between_none_and_all_of_them(deltas, own):
    cores = {c: (min(b, t), t) for c, (b, t) in enumerate(deltas)}
    before = sample({c: (0, 0) for c in cores})
    after = sample(cores, own=own)
    busy = runtime.busy_cores(before, after, set(cores))
    assert 0.0 <= busy <= len(cores) + 1e-9


class FakeStat:
    """/proc/stat readings in turn; ``sleep`` records how long the measurement waited."""

    def __init__(self, *readings):
        self.readings = [stat_text(r) for r in readings]
        self.slept = []

    def read(self):
        return self.readings.pop(0)

    def sleep(self, s):
        self.slept.append(s)

    def own(self):
        return 0.0  # this process used no CPU in the window


def test_measurement_waits_a_short_window_when_there_is_no_start_sample():
    fake = FakeStat({0: (0, 0), 1: (0, 0)}, {0: (10, 10), 1: (10, 10)})
    assert runtime.measure_busy_cores({0, 1}, fake.read, fake.sleep, own=fake.own) == pytest.approx(
        2.0
    )
    assert fake.slept == [runtime.MIN_WINDOW_S]


def test_measurement_uses_the_start_sample_without_waiting(monkeypatch):
    monkeypatch.setattr(runtime.time, "monotonic", lambda: 100.0)
    start = sample({0: (0, 0), 1: (0, 0)}, at=99.0)  # one second ago: a long enough window
    fake = FakeStat({0: (0, 100), 1: (100, 100)})
    busy = runtime.measure_busy_cores({0, 1}, fake.read, fake.sleep, start=start, own=fake.own)
    assert busy == pytest.approx(1.0) and fake.slept == []


def test_a_stale_start_sample_is_not_used(monkeypatch):
    monkeypatch.setattr(runtime.time, "monotonic", lambda: 1000.0)
    start = sample({0: (0, 0), 1: (0, 0)}, at=1000.0 - runtime.MAX_AGE_S - 1)
    fake = FakeStat({0: (500, 500), 1: (500, 500)}, {0: (500, 600), 1: (500, 600)})
    busy = runtime.measure_busy_cores({0, 1}, fake.read, fake.sleep, start=start, own=fake.own)
    assert busy == pytest.approx(0.0) and fake.slept == [runtime.MIN_WINDOW_S]


def test_no_proc_stat_means_no_measurement():
    assert runtime.measure_busy_cores({0, 1}, read=lambda: None, sleep=lambda s: None) is None


# ---------------------------------------------------------------------------------------------
# the thread policy
# ---------------------------------------------------------------------------------------------


def choose(busy, cpus=2, default=None, requested=None, env=None):
    calls = []

    def measure(cores):
        calls.append(cores)
        return busy

    choice = runtime.choose_threads(
        requested, env=env or {}, cpus=set(range(cpus)), default=default or cpus, measure=measure
    )
    return choice, calls


def test_an_idle_machine_gets_torchs_default_all_cores():
    choice, calls = choose(busy=0.05)
    assert choice.threads == 2 and "idle" in choice.why and calls == [{0, 1}]


def test_both_cores_busy_gives_one_thread():
    choice, _ = choose(busy=2.0)
    assert choice.threads == 1 and "2.0 of 2 cores busy" in choice.why


@pytest.mark.parametrize(
    "cpus, busy, want",
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 4.6, 1), (8, 2.2, 6), (8, 30, 1)],
)
def test_threads_follow_the_cores_others_leave_free(cpus, busy, want):
    assert choose(busy, cpus=cpus)[0].threads == want


def test_never_more_threads_than_torch_would_use():
    assert choose(busy=0.0, cpus=16, default=4)[0].threads == 4


def test_omp_num_threads_is_the_users_choice_and_nothing_is_measured():
    choice, calls = choose(busy=2.0, default=3, env={"OMP_NUM_THREADS": "3"})
    assert choice == runtime.ThreadChoice(3, "OMP_NUM_THREADS=3") and calls == []


def test_the_threads_flag_wins_over_everything():
    choice, calls = choose(busy=2.0, requested=2, env={"OMP_NUM_THREADS": "1"})
    assert choice == runtime.ThreadChoice(2, "--threads 2") and calls == []
    with pytest.raises(ConfigError, match="--threads must be at least 1"):
        choose(busy=0.0, requested=0)


def test_one_core_or_no_measurement_keeps_torchs_default():
    assert choose(busy=None)[0].threads == 2
    choice, calls = choose(busy=5.0, cpus=1, default=1)
    assert choice.threads == 1 and calls == []


def test_using_threads_applies_the_choice_then_restores_torchs_count():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), runtime.using_threads(target) as choice:
        assert torch.get_num_threads() == target == choice.threads
        assert runtime.thread_choice() == choice
    assert torch.get_num_threads() == before
    assert out.getvalue() == err.getvalue() == ""  # the choice is said by its caller, never here


def test_torchs_logs_are_quieted_once_a_process(monkeypatch):
    """set_logs resets every torch logger (~35 ms); the command line quiets the libraries
    twice a command, so torch's part is done once a process, the warnings filter every time."""
    import warnings

    import torch

    from attnlab import runtime

    calls = []
    monkeypatch.setattr(runtime, "_torch_quiet", False)
    monkeypatch.setattr(torch._logging, "set_logs", lambda **kw: calls.append(kw))
    with warnings.catch_warnings():
        runtime.quiet_libraries()
        runtime.quiet_libraries()
        assert len(calls) == 1 and calls[0]["graph_breaks"] is False
        warnings.resetwarnings()
        runtime.quiet_libraries()
        assert warnings.filters[0][0] == "default"  # attnlab's own, put back on each call
    assert len(calls) == 1
