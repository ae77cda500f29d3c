"""The train path hands its work to the run directory a handful of times (issue 27): from
``training.run.train`` to the first ``Trainer.train_step``, every call into attnlab/rundir/ whose
nearest attnlab caller is outside it is counted (benchmarks/train_walk.py prints them). A new
run, its resume and a run fine-tuned from it (with snapshots too) each enter the package at most 5
times."""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab.training.loop import Trainer
from attnlab.training.run import plan, train

ATTNLAB = str(Path(__file__).resolve().parents[2] / "src" / "attnlab") + "/"
PACKAGE = ATTNLAB + "rundir/"
TINY = {"n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 16, "batch_size": 2,
        "max_iters": 1, "eval_interval": 1, "eval_iters": 1, "quiet": True, "threads": 1,
        "compile": False}  # fmt: skip


def entries(given: dict) -> list[str]:
    """The package's functions the train path called, in order, up to the first step."""
    step = Trainer.train_step.__code__
    called: list[str] = []
    on = [True]

    def profile(frame, event, arg):
        if not on[0] or event != "call":
            return
        if frame.f_code is step:
            on[0] = False
        elif frame.f_code.co_filename.startswith(PACKAGE) and frame.f_code.co_name != "<lambda>":
            caller = frame.f_back  # the nearest attnlab frame: past torch's and contextlib's
            while caller is not None and not caller.f_code.co_filename.startswith(ATTNLAB):
                caller = caller.f_back
            if caller is not None and not caller.f_code.co_filename.startswith(PACKAGE):
                called.append(frame.f_code.co_qualname)

    p = plan(given)
    sys.setprofile(profile)
    try:
        train(p)
    finally:
        sys.setprofile(None)
    return called


def test_the_train_path_enters_the_run_directory_at_most_five_times(tmp_path):
    (tmp_path / "text.txt").write_text("First Citizen:\nBefore we proceed any further.\n" * 40)
    new = {"task": "lm", "data": str(tmp_path / "text.txt"), "out": str(tmp_path / "run"),
           "tokenizer": "char", **TINY}  # fmt: skip
    first = entries(new)
    assert first[:2] == ["writing", "RunDir.start"] and len(first) <= 5, first
    resumed = entries({**new, "resume": True, "max_iters": 2})
    assert resumed == ["writing", "RunDir.reopen", "RunDir.read_checkpoint", "RunDir.start"]
    fine = {k: v for k, v in new.items() if k not in ("n_layer", "n_head", "d_model", "tokenizer")}
    tuned = entries({**fine, "init_from": new["out"], "out": str(tmp_path / "fine")})
    assert tuned[0] == "open_model" and len(tuned) <= 5, tuned
    # snapshots too: the step-0 snapshot is one more hand-off, the evaluation's metrics row
    # goes with its checkpoint (RunDir.save_checkpoint(metrics=row)), not on its own
    snap = entries({**fine, "init_from": new["out"], "out": str(tmp_path / "snap"),
                    "snapshot_every": 1})  # fmt: skip
    assert "RunDir.write_snapshot" in snap and len(snap) <= 5, snap
    assert "RunDir.append_metrics" not in snap, snap
