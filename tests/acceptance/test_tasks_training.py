"""Every task on the one training path: the GPT language model, the masked LM, text
classification, the Transformer and the LSTM with attention on a generated task, and the ViT
each get exact --resume, a checkpoint on SIGINT/SIGTERM and kill -9, gradient accumulation,
torch.compile, bf16 autocast, the NaN stop, a refusal to replace a run, and their own words in
metrics.jsonl and loss.png."""

from __future__ import annotations

import hashlib
import json
import os
import signal

import pytest
import torch

from attnlab.cli import main
from attnlab.run import load_run
from attnlab.rundir import read_trainer_state
from attnlab.training import run as training
from fault_cli import inject, run_faulty
from lm_helpers import metrics
from task_helpers import TASKS, given, train_args, write_task_data

pytest.importorskip("sklearn")  # the ViT's digits

IDS = list(TASKS)
# a run of 8 steps, or its first half: the schedule is fixed so both halves share it
SCHEDULE = ["--warmup-iters", "2", "--lr-decay-iters", "8", "--eval-interval", "2",
            "--checkpoint-seconds", "0"]  # fmt: skip
UNITS = {"lm": "tokens", "mlm": "tokens", "classify": "examples", "transformer": "pairs",
         "lstm-attention": "pairs", "vit": "images", "induction": "tokens"}  # fmt: skip
HEADLINE = {"lm": "val_bpc", "mlm": "val_masked_accuracy", "classify": "val_accuracy",
            "transformer": "val_exact", "lstm-attention": "val_exact", "vit": "val_accuracy",
            "induction": "loss_repeated_half"}  # fmt: skip


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    """One thread choice for every run of a test (runs are compared bit for bit)."""
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_task_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def whole(data_dir, tmp_path_factory):
    """task id -> the run directory of 8 uninterrupted steps (trained once per module)."""
    runs = {}

    def get(task_id: str):
        if task_id not in runs:
            out = tmp_path_factory.mktemp("whole") / task_id
            with pytest.MonkeyPatch.context() as mp:  # its loss curve is checked
                mp.setenv("ATTNLAB_LOSS_PNG", "1")
                assert main(train_args(task_id, data_dir, out, "--max-iters", "8", *SCHEDULE)) == 0
            runs[task_id] = out
        return runs[task_id]

    return get


def train_losses(run) -> dict[int, float]:
    return {r["step"]: r["train_loss"] for r in metrics(run) if "val_loss" not in r}


def val_losses(run) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in metrics(run) if "val_loss" in r}


def same_weights(a, b) -> bool:
    sa, sb = load_run(a)[0].state_dict(), load_run(b)[0].state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def resume(data_dir, run, *more) -> int:
    data = TASKS[run.name][1] if ":" in TASKS[run.name][1] else data_dir / TASKS[run.name][1]
    return main(["train", "--data", str(data), "--out", str(run), "--resume", "--quiet", *more])


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_resume_continues_exactly_like_an_uninterrupted_run(task_id, data_dir, whole, tmp_path):
    half = tmp_path / task_id
    assert main(train_args(task_id, data_dir, half, "--max-iters", "4", *SCHEDULE)) == 0
    assert read_trainer_state(half)["step"] == 4
    assert resume(data_dir, half, "--max-iters", "8") == 0
    run = whole(task_id)
    assert train_losses(half) == train_losses(run) and len(train_losses(run)) == 8
    assert val_losses(half) == val_losses(run)  # steps 0, 2, ..., 8
    assert same_weights(half, run)


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_a_signal_saves_the_step_it_finished_then_resume_matches(
    task_id, data_dir, whole, tmp_path, monkeypatch, capsys
):
    sig = "sigterm" if IDS.index(task_id) % 2 else "sigint"
    run = tmp_path / task_id
    with monkeypatch.context() as m:
        inject(m, f"{sig}-at:3")
        code = main(train_args(task_id, data_dir, run, "--max-iters", "8", *SCHEDULE))
    assert code == (143 if sig == "sigterm" else 130)
    err = capsys.readouterr().err
    assert f"saved the checkpoint of step 3 in {run}" in err
    assert f"stopped at step 3; checkpoint saved in {run}" in err
    assert read_trainer_state(run)["step"] == 3
    load_run(run)
    assert resume(data_dir, run) == 0
    assert train_losses(run) == train_losses(whole(task_id))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_grad_accum_compile_and_bf16_autocast_train_every_task(task_id, data_dir, tmp_path):
    """torch.compile with the aot_eager backend (it traces the model exactly as inductor does,
    in seconds rather than a minute; tests/integration/test_compile.py runs inductor once)."""
    for name, extra in (
        ("compiled", {"compile": True, "compile_backend": "aot_eager", "grad_accum": 2}),
        ("bf16", {"dtype": "bfloat16"}),
    ):
        out = tmp_path / name
        args = ("--max-iters", "3", "--eval-interval", "3")  # few shapes: few recompilations
        p = training.plan({**given(task_id, data_dir, out, *args), **extra})
        result = training.train(p).result
        assert result.step == 3 and not result.interrupted
        rows = metrics(out)
        assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in rows if "train_loss" in r)
        assert read_trainer_state(out)["train_config"]["grad_accum"] == extra.get("grad_accum", 1)
        model, _ = load_run(out)
        assert not any("_orig_mod" in k or k.startswith("module.") for k in model.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_a_nan_loss_stops_every_task_and_keeps_the_last_checkpoint(
    task_id, data_dir, tmp_path, monkeypatch, capsys
):
    inject(monkeypatch, "nan-at:3")  # the 4th step's loss
    run = tmp_path / task_id
    assert main(train_args(task_id, data_dir, run, "--max-iters", "8", *SCHEDULE)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "the loss became nan at step 4" in err[0] and "(step 2) is kept" in err[0]
    )
    assert read_trainer_state(run)["step"] == 2
    assert all(torch.isfinite(p).all() for p in load_run(run)[0].parameters())


def _snapshot(root) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_training_into_an_existing_run_is_refused_and_leaves_it_as_it_was(
    task_id, data_dir, whole, capsys
):
    run = whole(task_id)
    before = _snapshot(run)
    assert main(train_args(task_id, data_dir, run, "--max-iters", "8")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a training run (step 8); pass --resume" in err[0]
    assert _snapshot(run) == before


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_metrics_and_the_loss_curve_speak_the_tasks_words(task_id, whole):
    from attnlab.rundir import read_run_config
    from attnlab.tasks import task_for_run
    from attnlab.training.plots import loss_figure

    run = whole(task_id)
    rows = metrics(run)
    unit = UNITS[task_id]
    logs = [r for r in rows if "val_loss" not in r]
    assert logs and all(f"{unit}_per_s" in r for r in logs)
    assert all(k.endswith("_per_s") is False or k == f"{unit}_per_s" for r in logs for k in r)
    evals = [r for r in rows if "val_loss" in r]
    assert all(HEADLINE[task_id] in r for r in evals)
    assert ("val_ppl" in evals[-1]) == (task_id == "lm")  # perplexity: language models only
    cls = task_for_run(read_run_config(run))
    headline = (
        None if cls.best == "val_loss" else next(m for m in cls.metrics if m.name == cls.best)
    )
    fig = loss_figure(rows, cls.loss_unit, headline, "t")
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels[0] == f"loss ({cls.loss_unit})" and cls.loss_unit.split(" / ")[1] in labels[0]
    assert (len(labels) == 2) == (headline is not None)
    if headline is not None:
        assert headline.label in labels[1]
    assert (run / "loss.png").stat().st_size > 1000
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["metrics"]["step"] == 8 and HEADLINE[task_id] in cfg["metrics"]


def test_unset_options_take_the_tasks_defaults_and_typed_ones_win(tmp_path):
    dates = training.plan({"task": "seq2seq", "data": "dates", "arch": "lstm-attention"})
    assert dates.config.max_iters == 3000 and dates.config.batch_size == 64
    assert dates.config.lr == 2e-3 and dates.config.warmup_iters == 100
    assert dates.config.eval_interval == 250 and dates.out.name == "dates-lstm-attention"
    short = training.plan({"task": "seq2seq", "data": "dates", "max_iters": 40, "lr": 1e-3})
    assert (short.config.max_iters, short.config.lr) == (40, 1e-3)
    assert (short.config.warmup_iters, short.config.eval_interval) == (4, 5)
    vit = training.plan({"task": "classify", "data": "digits"})
    assert vit.task.name == "vision" and vit.config.max_iters == 600
    lm = training.plan({"data": "input.txt"})
    assert lm.task.name == "lm" and lm.config.batch_size == 12 and lm.options.preset == "baby"


@pytest.mark.parametrize(
    "opts, needle",
    [
        ({"data": "x.txt", "arch": "lstm"}, "--arch lstm is an encoder-decoder: use --task seq2seq"),
        ({"task": "classify", "data": "digits", "preset": "baby"},
         "--preset does not apply to --arch vit (size it with"),
        ({"task": "seq2seq", "data": "dates", "block_size": 8}, "--block-size does not apply"),
        ({"task": "mlm", "data": "x.txt", "pos": "rotary"}, "--pos rotary is not available"),
        ({"task": "seq2seq", "data": "dates", "schedule": "noam", "warmup_iters": 0},
         "--schedule noam needs --warmup-iters >= 1"),
        ({"data": "x.txt", "tokenizer": "wordpiece"}, "--tokenizer must be one of char, word, bpe"),
    ],
)  # fmt: skip
def test_an_option_a_task_cannot_use_is_refused_by_name(opts, needle):
    from attnlab.config import ConfigError

    with pytest.raises(ConfigError, match=None) as e:
        training.plan(opts)
    assert needle in str(e.value)


@pytest.fixture(scope="module")
def forked(forked_cli):
    return forked_cli


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_kill_9_while_installing_a_checkpoint_leaves_a_run_that_loads_and_resumes(
    task_id, data_dir, whole, tmp_path, forked
):
    """SIGKILL after the model of step 4 is in place but not yet its trainer state: the run
    loads as it is, and --resume rolls the checkpoint forward and continues bit for bit (as
    the uninterrupted run this module trains once per task)."""
    run = tmp_path / "killed"
    args = train_args(task_id, data_dir, run, "--max-iters", "8", *SCHEDULE)
    r = run_faulty("kill-during-install:3", *args)  # checkpoints 0, 2, then 4
    assert r.returncode == -signal.SIGKILL and (run / "ckpt-ready").is_dir()
    load_run(run)
    data = TASKS[task_id][1] if ":" in TASKS[task_id][1] else data_dir / TASKS[task_id][1]
    r = forked("train", "--data", data, "--out", run, "--resume", "--max-iters", "8")
    assert r.returncode == 0, r.stderr
    assert "resumed from the checkpoint of step 4" in r.stderr
    assert train_losses(run) == train_losses(whole(task_id))


PROBES = {"lm": "First", "mlm": "Spe[MASK]k.", "classify": "the day was good indeed",
          "transformer": "abcd", "lstm-attention": "abcd", "vit": "test:0",
          "induction": "0123012"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_a_run_rebuilds_its_task_which_scores_and_predicts_as_in_training(task_id, whole):
    from attnlab.tasks import open_task

    run = whole(task_id)
    cfg = json.loads((run / "config.json").read_text())
    model, _ = load_run(run)
    task = open_task(run, with_data=True)  # the held-out split of training, rebuilt
    task.val_batches(4, 2)
    with torch.no_grad():
        figures = task.evaluate(model, cfg["metrics"]["val_loss"])
    assert figures and all(figures[k] == pytest.approx(cfg["metrics"][k]) for k in figures)
    (pred,) = open_task(run).predict(model, [PROBES[task_id]], top_k=2)  # no data needed
    assert pred["input"] == PROBES[task_id]
    if task_id in ("classify", "vit"):
        assert {c["label"] for c in pred["classes"]} <= set(cfg["labels"])
        assert len(pred["classes"]) == 2 and 0 < sum(c["p"] for c in pred["classes"]) <= 1 + 1e-6
    elif task_id in ("lm", "induction"):
        assert len(pred["next"]) == 2 and pred["next"][0]["p"] >= pred["next"][1]["p"]
    elif task_id == "mlm":
        assert len(pred["masks"]) == 1 and len(pred["masks"][0]) == 2
    else:
        assert set(pred["output"]) <= set("abcde")


def test_progress_announces_the_step_0_evaluation_and_speaks_the_tasks_words(
    data_dir, tmp_path, capsys
):
    args = train_args("vit", data_dir, tmp_path / "r", "--max-iters", "2", "--eval-interval", "2")
    args.remove("--quiet")
    assert main(args) == 0
    err = capsys.readouterr().err.splitlines()
    first = next(i for i, line in enumerate(err) if line.startswith("evaluating at step 0 ..."))
    assert "(val loss: on the whole held-out split (" in err[first]  # what it is computed on
    said = " ".join(err[first + 1].split())  # two spaces apart, or one where 80 columns need it
    assert said.startswith("eval step 0 val loss ") and "accuracy" in said
    assert "held-out image ->" in err[first + 2]  # the example of the evaluation
    assert any(line.startswith("step 2/2  loss ") and "images/s" in line for line in err)
    assert not any("tok/s" in line or "tokens/s" in line or "perplexity" in line for line in err)


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_every_tasks_progress_lines_speak_its_words(task_id, data_dir, tmp_path, capsys):
    """Throughput in the task's unit on every log line; perplexity (and tokens/s) only where
    the task is a language model that predicts every next token."""
    args = train_args(task_id, data_dir, tmp_path / "r", "--max-iters", "2", "--eval-interval", "2")
    args.remove("--quiet")
    assert main(args) == 0
    err = capsys.readouterr().err.splitlines()
    unit = UNITS[task_id]
    steps = [line for line in err if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/2", "2/2"]
    assert all(f" {unit}/s " in line for line in steps), steps
    evals = [line for line in err if line.split()[:2] == ["eval", "step"]]  # 1 or 2 spaces
    assert len(evals) == 2 and all(" val loss " in line for line in evals)
    assert any("perplexity" in line for line in evals) == (task_id == "lm"), evals
    said_tokens = any("tokens/s" in line or "tok/s" in line for line in err)
    assert said_tokens == (unit == "tokens")
