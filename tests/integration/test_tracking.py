"""`train --log tensorboard`: the metrics.jsonl rows as TensorBoard scalars, read back with
TensorBoard's own reader; without the package, one line saying what to install, before any
training starts."""

from __future__ import annotations

import json
import sys

import pytest

from attnlab.cli import main
from task_helpers import train_args, write_task_data


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_task_data(tmp_path_factory.mktemp("tracking"))


def _rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]


def _events(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["lm", "classify"])
def test_tensorboard_scalars_are_the_metrics_rows_in_the_tasks_words(task_id, data_dir, tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    args = train_args(task_id, data_dir, run, "--max-iters", "6", "--eval-interval", "3")
    assert main([*args, "--log", "tensorboard"]) == 0
    assert list(run.glob("events.out.tfevents.*")), "event files beside metrics.jsonl"
    events = _events(run)
    rows = _rows(run)
    logs = [r for r in rows if "val_loss" not in r]
    evals = [r for r in rows if "val_loss" in r]
    assert len(logs) == 6 and len(evals) == 3  # steps 1..6; evaluations at 0, 3, 6
    expected: dict[str, list] = {}
    for r in rows:
        where = "eval" if "val_loss" in r else "train"
        for k, v in r.items():
            if k not in ("step", "threads") and isinstance(v, (int, float)) and v is not None:
                expected.setdefault(f"{where}/{k}", []).append((r["step"], v))
    assert set(events) == set(expected)
    for tag, points in expected.items():
        got = events[tag]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), tag
    lm = task_id == "lm"
    assert ("eval/val_ppl" in events) == lm  # perplexity: language models only
    assert ("train/tokens_per_s" in events) == lm and ("train/examples_per_s" in events) != lm
    assert lm or "eval/val_accuracy" in events


def test_without_tensorboard_one_line_says_what_to_install_and_nothing_is_written(
    data_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    run = tmp_path / "run"
    code = main([*train_args("lm", data_dir, run, "--max-iters", "2"), "--log", "tensorboard"])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and len(err) == 1, captured.err
    assert err[0].startswith("attnlab: error: --log tensorboard needs the tensorboard package")
    assert "pip install 'attnlab[tensorboard]'" in err[0]
    assert captured.out == "" and not run.exists()  # refused before any data or step


def test_an_unknown_tracker_is_refused_by_the_parser(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*train_args("lm", data_dir, tmp_path / "r", "--max-iters", "2"), "--log", "wandb"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == (
        "attnlab: error: unknown --log choice 'wandb' (choose from tensorboard)\n"
    ), err
