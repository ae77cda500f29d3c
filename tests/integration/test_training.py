"""The Trainer: schedule, determinism, exact resume, and nothing lost when things go wrong."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
import torch

from attnlab.data import RandomWindows
from attnlab.run import load_run
from attnlab.rundir import RunError, read_trainer_state
from attnlab.tasks.lm import LanguageModel
from attnlab.tokenizers import CharTokenizer
from attnlab.training import TrainConfig, Trainer, TrainingError, lr_at
from attnlab.training.faults import Faults
from fault_cli import command, run_faulty
from lm_helpers import TINY_TRAIN, random_tokens, tiny_gpt, train_losses, write_text

TOKENS = random_tokens(3000, 20, seed=1)
TOK = CharTokenizer("abcdefghijklmnopqrst")


def make_trainer(out=None, max_iters=12, seed=0, batches=None, faults=None, **kw):
    """A Trainer of a tiny GPT; ``faults``: a ``Faults`` spec injected through its callbacks."""
    torch.manual_seed(seed)
    model = tiny_gpt(dropout=0.1)  # dropout: the RNG state must be restored too
    fields = dict(
        max_iters=max_iters,
        batch_size=4,
        lr=3e-3,
        min_lr=3e-4,
        warmup_iters=3,
        lr_decay_iters=12,
        eval_interval=4,
        eval_iters=2,
        log_interval=1,
        seed=seed,
        device="cpu",
        checkpoint_seconds=0,  # only at evaluations, so that the checkpoints can be counted
    )
    cfg = TrainConfig(**{**fields, **kw})
    task = LanguageModel.from_tokens(TOKENS, TOKENS[:500], TOK, block_size=16)
    if batches is not None:
        task.train_batches = lambda *args: batches
    callbacks = [Faults(faults)] if faults else []
    return Trainer(model, task, cfg, out, quiet=True, callbacks=callbacks)


def losses(result) -> dict[int, float]:
    return {r["step"]: r["train_loss"] for r in result.history if "val_loss" not in r}


def test_unset_warmup_and_eval_interval_follow_max_iters():
    short, long = TrainConfig(max_iters=40), TrainConfig(max_iters=100_000)
    assert (short.warmup_iters, short.eval_interval, short.lr_decay_iters) == (4, 5, 40)
    assert (long.warmup_iters, long.eval_interval) == (100, 250)
    assert TrainConfig(max_iters=3).eval_interval == 1
    resumed = TrainConfig.from_dict({**short.to_dict(), "max_iters": 80})
    assert resumed.warmup_iters == 4 and resumed.lr_decay_iters == 40  # the run's schedule stays


@pytest.mark.parametrize("schedule", ["cosine", "noam", "constant"])
def test_every_schedule_warms_up_to_the_peak_lr_then_never_rises(schedule):
    c = TrainConfig(lr=1e-3, min_lr=1e-5, warmup_iters=10, max_iters=100, schedule=schedule)
    lrs = [lr_at(t, c) for t in range(300)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10]))
    assert max(lrs) == pytest.approx(1e-3) and lrs.index(max(lrs)) in (9, 10)
    assert all(a >= b - 1e-15 for a, b in zip(lrs[10:], lrs[11:]))
    if schedule == "noam":  # 1/sqrt(step) after warmup: 4x the steps, half the rate
        assert lr_at(39, c) == pytest.approx(lr_at(9, c) / 2)
    if schedule == "constant":
        assert lrs[-1] == 1e-3


def test_lr_warms_up_then_decays_to_min_lr():
    c = TrainConfig(lr=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=100, max_iters=200)
    warm = [lr_at(t, c) for t in range(10)]
    decay = [lr_at(t, c) for t in range(10, 101)]
    assert all(a < b for a, b in zip(warm, warm[1:])) and warm[-1] < 1.0
    assert lr_at(10, c) == pytest.approx(1.0) and lr_at(100, c) == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(decay, decay[1:]))
    assert lr_at(150, c) == 0.1


def test_same_seed_same_losses_other_seed_other_losses():
    a, b, c = (losses(make_trainer(seed=s, max_iters=6).fit()) for s in (3, 3, 4))
    assert a == b and a != c and len(a) == 6


def test_training_lowers_the_loss():
    tokens = torch.arange(3000) % 20  # a perfectly predictable sequence
    batches = RandomWindows(tokens.numpy(), 16, 4, seed=0)
    curve = losses(make_trainer(max_iters=40, batches=batches, lr=1e-2, lr_decay_iters=40).fit())
    assert curve[40] < curve[1] - 1.0


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    whole = make_trainer(tmp_path / "a", max_iters=12).fit()
    make_trainer(tmp_path / "b", max_iters=6).fit()  # stops at step 6 (final checkpoint)
    resumed = make_trainer(tmp_path / "b", max_iters=12, seed=99).fit(resume=True)  # seed ignored
    assert losses(resumed) == losses(whole)  # bit-exact, steps 1..12
    assert resumed.val_loss == whole.val_loss
    ma, mb = load_run(tmp_path / "a")[0], load_run(tmp_path / "b")[0]
    assert all(
        torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values())
    )


def test_run_directory_holds_a_loadable_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_LOSS_PNG", "1")  # the loss curve is one of its files
    make_trainer(tmp_path / "r", max_iters=8).fit()
    run = tmp_path / "r"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
        "metrics.jsonl",
        "loss.png",
        "best/model.safetensors",
    ):
        assert (run / name).is_file(), name
    assert not (run / "ckpt-tmp").exists() and not (run / "ckpt-ready").exists()
    state = read_trainer_state(run)
    assert state["step"] == 8 and state["data"]["drawn"] == 8
    model, tok = load_run(run)
    assert model.config.vocab_size == 20 and tok.vocab_size == 20
    load_run(run / "best")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "train_loss", "lr", "tokens_per_s"} <= set(rows[1])
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 4, 8]


def test_nan_loss_stops_at_once_and_keeps_the_last_checkpoint(tmp_path):
    with pytest.raises(TrainingError, match=r"nan at step 6.*step 4\) is kept.*--lr"):
        make_trainer(tmp_path / "r", faults="nan-at:5").fit()  # the 6th step's loss: NaN
    assert read_trainer_state(tmp_path / "r")["step"] == 4
    model, _ = load_run(tmp_path / "r")
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_weights_gone_to_nan_between_two_reads_of_the_loss_are_never_saved(tmp_path):
    """Issue 32 item 1: a weight that became NaN after a finite loss (read back at the next
    evaluation) was saved as the checkpoint of that evaluation, and the NaN loss that followed
    said that checkpoint was "the last good" one. The evaluation now stops the run, keeping
    the last finite checkpoint."""
    with pytest.raises(TrainingError, match=r"became nan at step 8.*\(step 4\) is kept"):
        make_trainer(tmp_path / "r", faults="nan-weights-at:8").fit()
    assert read_trainer_state(tmp_path / "r")["step"] == 4
    model, _ = load_run(tmp_path / "r")  # loading would refuse weights that are not finite
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_checkpoint_of_weights_that_are_not_finite_is_refused_and_nothing_written(tmp_path):
    trainer = make_trainer(tmp_path / "r", max_iters=4, eval_interval=100)
    trainer.fit()
    before = (tmp_path / "r" / "model.safetensors").read_bytes()
    with torch.no_grad():
        next(trainer.raw_model.parameters()).view(-1)[:3] = float("inf")
    with trainer.run, pytest.raises(TrainingError, match=r"weights \(3 values"):
        trainer.save_checkpoint()
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == before


def test_a_non_finite_step_is_skipped_on_the_device_and_named_when_read_back():
    """The loss is read back only at log lines: the NaN step's update is skipped by the fused
    AdamW itself, so the model in memory stays finite, and the error names that step."""
    trainer = make_trainer(max_iters=8, log_interval=5, eval_interval=100, faults="nan-at:2")
    assert trainer.defers_readback
    for _ in range(4):  # nothing read back, nothing raised yet
        trainer.train_step()
        trainer.step += 1
    with pytest.raises(TrainingError, match="loss became nan at step 3"):
        trainer.read_back()
    assert all(torch.isfinite(p).all() for p in trainer.raw_model.parameters())
    steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
    assert steps == {3}  # 4 steps taken, the non-finite one not counted


def test_a_run_reads_the_loss_back_only_at_log_lines_evaluations_and_checkpoints(monkeypatch):
    trainer = make_trainer(max_iters=20, log_interval=10, eval_interval=20)
    calls = []
    real = trainer._flush
    monkeypatch.setattr(trainer, "_flush", lambda: (calls.append(trainer.step), real())[1])
    result = trainer.fit()
    assert result.step == 20 and len(losses(result)) == 2  # two log lines
    assert set(calls) <= {0, 10, 20} and len(calls) <= 5  # not once a step


def test_an_evaluation_counts_each_pass_under_its_own_name(monkeypatch):
    """The train and validation passes once shared one label, so a long evaluation's heartbeat
    went backwards (11/20, 4/20, 12/20 batches); each now counts up under its own name."""
    from attnlab import heartbeat
    from attnlab.training import loop

    said: list[str] = []
    trainer = make_trainer(eval_iters=3)
    beat = heartbeat.Heartbeat("evaluating at step 0", show=said.append)
    counted: list[tuple[str, int, int]] = []

    def count(done, total=None, unit=""):
        heartbeat.count(done, total, unit)
        counted.append((unit, done, total))
        said.append(beat.line(1.0))

    monkeypatch.setattr(loop, "count_done", count)
    with beat:
        trainer.evaluate()
    assert [u for u, _, _ in counted] == ["train batches"] * 3 + ["val batches"] * 3
    assert [(d, t) for _, d, t in counted] == [(1, 3), (2, 3), (3, 3)] * 2
    said = [re.sub(r", \S+ left$", "", s) for s in said]  # the time left, where it counts
    assert said[:4] == ["evaluating at step 0: 1/3 train batches, 1 s",
                        "evaluating at step 0: 2/3 train batches, 1 s",
                        "evaluating at step 0: 3/3 train batches, 1 s",
                        "evaluating at step 0: 1/3 val batches, 1 s"]  # fmt: skip


def test_compile_pays_only_when_the_steps_left_repay_it():
    from attnlab.training.loop import COMPILE_COST, compile_pays

    cost, factor = COMPILE_COST["cpu"]
    assert not compile_pays("cpu", 2000, 0.045)  # the baby GPT's 2000 steps: 90 s
    assert compile_pays("cpu", 100_000, 0.045)
    assert compile_pays("cpu", 1000, factor * cost / 1000 + 1e-9)
    assert compile_pays("cuda", 2000, 0.1) and not compile_pays("cuda", 200, 0.1)


def test_disk_full_at_a_checkpoint_keeps_the_previous_one(tmp_path):
    with pytest.raises(TrainingError, match=r"step 8.*No space left.*step 4\) is kept"):
        make_trainer(tmp_path / "r", faults="disk-full-at-checkpoint:3").fit()
    assert read_trainer_state(tmp_path / "r")["step"] == 4
    load_run(tmp_path / "r")


def test_unwritable_out_dir_is_found_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RunError, match="cannot write the run directory"):
        make_trainer(blocker / "run").fit()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_out_dir_is_found_before_training(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(RunError, match="cannot write"):
        make_trainer(ro / "run").fit()


class InterruptAt:
    """Batches that deliver a SIGINT (as Ctrl-C would) when the n-th batch is drawn."""

    def __init__(self, n):
        self.inner, self.n = RandomWindows(TOKENS, 16, 4, seed=0), n

    def __next__(self):
        if self.inner.drawn + 1 == self.n:
            os.kill(os.getpid(), signal.SIGINT)
        return next(self.inner)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, s):
        self.inner.load_state_dict(s)


def test_sigint_saves_a_checkpoint_and_stops_cleanly(tmp_path):
    whole = make_trainer(tmp_path / "a").fit()
    result = make_trainer(tmp_path / "b", batches=InterruptAt(6)).fit()
    assert result.interrupted and result.step == 6
    assert read_trainer_state(tmp_path / "b")["step"] == 6
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    resumed = make_trainer(tmp_path / "b").fit(resume=True)
    assert losses(resumed) == losses(whole)


def test_sigterm_saves_the_step_it_finished_and_says_which(tmp_path):
    said = []
    trainer = make_trainer(tmp_path / "r", faults="sigterm-at:5")  # after step 5 is done
    trainer._log = said.append
    result = trainer.fit()
    assert result.interrupted == "SIGTERM" and result.step == 5
    assert read_trainer_state(tmp_path / "r")["step"] == 5
    assert said[-1] == f"saved the checkpoint of step 5 in {tmp_path / 'r'}"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_checkpoint_exists_from_step_0_so_an_early_kill_leaves_a_loadable_run(tmp_path):
    run = tmp_path / "r"

    class Watch(RandomWindows):
        seen = None

        def __next__(self):
            if Watch.seen is None:  # the first training batch: step 0 is done evaluating
                Watch.seen = read_trainer_state(run)
            return super().__next__()

    make_trainer(run, max_iters=3, eval_interval=100, batches=Watch(TOKENS, 16, 4)).fit()
    assert Watch.seen["step"] == 0
    assert load_run(run)[0].config.vocab_size == 20


def test_checkpoints_follow_the_clock_between_evaluations(tmp_path):
    trainer = make_trainer(tmp_path / "r", max_iters=6, eval_interval=100)
    trainer.config.checkpoint_seconds = 1e-9  # due after every step
    saved = []
    original = trainer.save_checkpoint

    def save(*rows):  # an evaluation's checkpoint takes its metrics row
        saved.append(trainer.step)
        original(*rows)
        trainer._last_save_cost = 0.0  # else the next one waits 10x as long as this one took

    trainer.save_checkpoint = save
    trainer.fit()
    assert saved == [0, 1, 2, 3, 4, 5, 6]


def test_a_fresh_fit_will_not_replace_a_run(tmp_path):
    make_trainer(tmp_path / "r", max_iters=4).fit()
    before = (tmp_path / "r" / "model.safetensors").read_bytes()
    with pytest.raises(RunError, match="already holds a training run"):
        make_trainer(tmp_path / "r", max_iters=4).fit()
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == before


def test_best_is_chosen_by_the_tasks_declared_metric(tmp_path):
    trainer = make_trainer(tmp_path / "r", max_iters=8)
    trainer.best_metric = next(m for m in trainer.metrics if m.name == "val_ppl")
    result = trainer.fit()
    evals = [r for r in result.history if "val_ppl" in r and r["step"] > 0]
    best = min(evals, key=lambda r: r["val_ppl"])
    assert result.best == {"metric": "val_ppl", "value": best["val_ppl"],
                           "val_loss": best["val_loss"], "step": best["step"]}  # fmt: skip
    from safetensors import safe_open

    with safe_open(str(tmp_path / "r" / "best" / "model.safetensors"), "pt") as f:
        assert f.metadata()["step"] == str(best["step"])


# ---- whole processes, killed -----------------------------------------------------------------

ARGS = [
    *TINY_TRAIN,
    "--max-iters",
    "12",
    "--eval-interval",
    "4",
    "--dropout",
    "0.1",
    "--lr",
    "3e-3",
    "--warmup-iters",
    "2",
    "--checkpoint-seconds",
    "0",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    from cli_helpers import run_cli

    d = tmp_path_factory.mktemp("whole")
    data = write_text(d)
    r = run_cli("train", "--data", data, "--out", d / "run", *ARGS)
    assert r.returncode == 0, r.stderr
    return data, train_losses(d / "run")


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, expect_step", [("kill-during-checkpoint:3", 4), ("kill-during-install:3", 8)]
)
def test_killed_while_writing_a_checkpoint(tmp_path, cli, uninterrupted, fault, expect_step):
    data, whole = uninterrupted
    run = tmp_path / "run"
    r = run_faulty(fault, "train", "--data", data, "--out", run, *ARGS)
    assert r.returncode == -signal.SIGKILL
    assert (run / ("ckpt-tmp" if "checkpoint" in fault else "ckpt-ready")).exists()
    load_run(run)  # whatever the moment of death, the run directory loads
    r = cli("train", "--data", data, "--out", run, *ARGS, "--resume")
    assert r.returncode == 0, r.stderr
    assert not (run / "ckpt-tmp").exists() and not (run / "ckpt-ready").exists()
    got = train_losses(run)
    assert got == whole  # steps after the checkpoint recomputed bit-exactly
    assert f"resumed from the checkpoint of step {expect_step}" in r.stderr


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_matches_uninterrupted(tmp_path, uninterrupted):
    from cli_helpers import SRC

    data, whole = uninterrupted
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = command("step-delay:0.15", "train", "--data", data, "--out", run, *ARGS)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:  # wait for the first checkpoint and a few steps after it
        state = read_trainer_state(run) if (run / "trainer_state.json").exists() else None
        if state and state["step"] >= 4 and max(train_losses(run), default=0) >= 6:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(train_losses(run))
    assert killed_at < 12
    from cli_helpers import run_cli

    r = run_cli("train", "--data", data, "--out", run, *ARGS, "--resume")
    assert r.returncode == 0, r.stderr
    assert train_losses(run) == whole


def test_the_fast_preset_is_baby_with_rotary_trained_by_its_own_recipe_that_flags_override():
    from attnlab.models.gpt import PRESETS
    from attnlab.tasks.lm import PRESET_TRAINING
    from attnlab.training import run

    fast = run.plan({"data": "input.txt", "preset": "fast", "out": "r"})
    recipe = PRESET_TRAINING["fast"]
    assert {k: getattr(fast.config, k) for k in recipe} == recipe
    model = fast.options.model_config(65)
    assert model.pos == "rotary" and (model.n_layer, model.d_model) == (4, 128)
    assert model.d_ff == 2 * model.d_model  # baby's is 4x
    assert PRESETS["fast"]["block_size"] == PRESETS["baby"]["block_size"]
    mine = run.plan({"data": "input.txt", "preset": "fast", "out": "r", "lr": 1e-3})
    assert mine.config.lr == 1e-3 and mine.config.max_iters == recipe["max_iters"]
    # the recipe's floor keeps its share of a peak given instead: a low --lr is not refused
    share = recipe["min_lr"] / recipe["lr"]
    assert mine.config.min_lr == pytest.approx(1e-3 * share)
    low = run.plan({"data": "input.txt", "preset": "fast", "out": "r", "lr": 1e-5})
    assert low.config.min_lr == pytest.approx(1e-5 * share) and low.config.min_lr <= 1e-5
    floor = run.plan({"data": "input.txt", "preset": "fast", "out": "r", "lr": 1e-3,
                      "min_lr": 0.0})  # fmt: skip
    assert floor.config.min_lr == 0.0
    baby = run.plan({"data": "input.txt", "out": "r"})
    assert (baby.config.lr, baby.config.max_iters) == (1e-3, 2000)


def test_arch_llama_trains_by_its_own_recipe_unless_its_preset_has_one():
    from attnlab.tasks.lm import ARCH_TRAINING, PRESET_TRAINING
    from attnlab.train_config import TrainConfig
    from attnlab.training import run

    plan = lambda **kw: run.plan({"data": "input.txt", "out": "r", **kw}).config  # noqa: E731
    recipe = ARCH_TRAINING["llama"]
    llama = plan(arch="llama")
    assert {k: getattr(llama, k) for k in recipe} == recipe
    assert llama.max_iters == TrainConfig.max_iters  # nanoGPT's CPU budget: 2000 steps
    assert plan(arch="gpt").lr == TrainConfig.lr  # the GPT keeps the TrainConfig defaults
    mine = plan(arch="llama", lr=3e-3)  # a peak given: the floor keeps its share of it
    assert mine.min_lr == pytest.approx(3e-3 * recipe["min_lr"] / recipe["lr"])
    assert plan(arch="llama", beta2=0.99).beta2 == 0.99  # a flag given wins
    fast = plan(arch="llama", preset="fast")  # the preset's recipe is for its shape
    assert {k: getattr(fast, k) for k in PRESET_TRAINING["fast"]} == PRESET_TRAINING["fast"]


def test_loss_png_is_drawn_unless_attnlab_loss_png_is_0(tmp_path, monkeypatch):
    from attnlab.training.plots import loss_png_wanted

    monkeypatch.delenv("ATTNLAB_LOSS_PNG", raising=False)
    assert loss_png_wanted()  # a user's default
    monkeypatch.setenv("ATTNLAB_LOSS_PNG", "0")
    assert not loss_png_wanted()
    make_trainer(tmp_path / "r", max_iters=4).fit()
    assert (tmp_path / "r" / "metrics.jsonl").is_file()
    assert not (tmp_path / "r" / "loss.png").exists()
