"""Every long job says how long it has left (issue 32, item 6): the training step lines and the
heartbeat of any work that counts toward a known total; and a step line still fits 80
columns."""

from __future__ import annotations

import pytest

from attnlab.heartbeat import Heartbeat, duration
from attnlab.training.progress import log_line


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (45, "45s"), (200, "3m20s"),
                                           (3599, "59m59s"), (3900, "1h05m")])  # fmt: skip
def test_a_duration_reads_as_a_clock(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("unit", ["tokens", "pairs", "images", "examples"])
def test_a_step_line_says_the_time_left_within_80_columns(unit):
    row = {"step": 12345, "train_loss": 12.3456, "lr": 1.23e-3, f"{unit}_per_s": 1234567.0,
           "ms_per_iter": 351.2, "threads": 16}  # fmt: skip
    line = log_line(row, 99999, unit, left=3 * 3600 + 125)
    assert line.endswith(" 3h02m left") and len(line) <= 80, (len(line), line)
    assert f" {unit}/s " in line
    last = log_line({**row, "step": 99999}, 99999, unit, left=0)
    assert "left" not in last  # done: nothing left to say


def test_a_heartbeat_that_counts_says_the_time_left():
    beat = Heartbeat("evaluating at step 0", log=lambda s: None)
    beat.done, beat.total, beat.unit = 5, 20, "val batches"
    assert beat.line(10.0) == "evaluating at step 0: 5/20 val batches, 10 s, 30s left"
    beat.total = None  # a count with no end: no estimate
    assert "left" not in beat.line(10.0)
