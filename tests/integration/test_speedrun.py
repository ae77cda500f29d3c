"""The speedrun preset keeps the project's guarantees: an interrupted run resumes bit for bit
(Muon's state saved beside AdamW's), Ctrl-C saves, two DDP processes train what one does at the
same global batch, export-hf refuses in one line naming the piece transformers lacks; and its
options (and Muon for every kind of model) are checked in one line before anything is built."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from attnlab.config import ConfigError
from attnlab.training import run as training
from attnlab.training.faults import Faults
from lm_helpers import metrics, write_text
from task_helpers import TASKS, given, write_task_data

TINY = ["--preset", "speedrun", "--n-layer", "2", "--n-head", "2", "--d-model", "16",
        "--block-size", "16", "--max-iters", "10", "--eval-interval", "5", "--log-interval", "1",
        "--checkpoint-seconds", "0", "--batch-size", "4", "--eval-iters", "2", "--quiet"]  # fmt: skip


def plan(data, out, *more, resume=False):
    from attnlab.cli import build_parser

    ns = build_parser().parse_args(["train", "--data", str(data), "--out", str(out), *TINY, *more])
    options = {k: v for k, v in vars(ns).items() if k not in ("func", "verb")}
    return training.plan({**options, "resume": resume})


def test_an_interrupted_speedrun_resumes_to_the_same_bits(tmp_path):
    data = write_text(tmp_path)
    whole = training.train(plan(data, tmp_path / "a"))
    stopped = training.train(plan(data, tmp_path / "b"), callbacks=[Faults("sigint-at:3")])
    assert stopped.result.interrupted == "SIGINT" and stopped.result.step == 3
    saved = load_file(str(tmp_path / "b" / "optimizer.safetensors"))
    assert any(k.endswith(".momentum_buffer") for k in saved)  # Muon's state, beside AdamW's
    assert any(k.endswith(".exp_avg") for k in saved)
    resumed = training.train(plan(data, tmp_path / "b", resume=True))
    assert resumed.result.step == whole.result.step == 10
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda r: [(m["step"], m["train_loss"]) for m in metrics(r) if "val_loss" not in m]  # noqa: E731
    assert losses(tmp_path / "b") == losses(tmp_path / "a")


def test_each_piece_turns_off_and_a_bad_value_is_refused_in_one_line(tmp_path):
    data = write_text(tmp_path)
    p = plan(data, tmp_path / "r")
    model = p.options.model_config(20)
    assert (model.activation, model.pos, model.norm, model.qk_norm, model.tie_weights,
            model.zero_init, model.bias) == ("relu2", "rotary", "rms", True, False, True, False)  # fmt: skip
    assert (p.config.optimizer, p.config.schedule) == ("muon", "wsd")
    off = plan(data, tmp_path / "r", "--activation", "gelu", "--pos", "learned", "--norm", "pre",
               "--no-qk-norm", "--tie-weights", "--no-zero-init", "--bias", "--optimizer",
               "adamw", "--schedule", "cosine", "--lr", "1e-3", "--min-lr", "1e-4")  # fmt: skip
    model = off.options.model_config(20)
    from attnlab.models.gpt import PRESETS, GPTConfig

    baby = GPTConfig(vocab_size=20, **{**PRESETS["baby"], "n_layer": 2, "n_head": 2,
                                       "d_model": 16, "block_size": 16, "dropout": 0.0})  # fmt: skip
    assert model.to_dict() == baby.to_dict()  # every piece off: nanoGPT's GPT
    assert (off.config.optimizer, off.config.schedule) == ("adamw", "cosine")
    from cli_helpers import run_cli

    for flag, value, said in (("--softcap", "-1", "--softcap must be >= 0"),
                              ("--muon-lr", "0", "--muon-lr must be positive"),
                              ("--cooldown-iters", "-3", "--cooldown-iters must be >= 0"),
                              ("--eval-batch-size", "0", "--eval-batch-size must be positive")):  # fmt: skip
        r = run_cli("train", "--data", data, "--out", tmp_path / "x", *TINY, flag, value)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) <= 2
        assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("task_id", list(TASKS))
def test_muon_trains_every_kind_with_transformer_blocks_and_refuses_the_others(task_id, tmp_path):
    d = write_task_data(tmp_path)
    options = given(task_id, d, tmp_path / "run", "--optimizer", "muon", "--max-iters", "2",
                    "--eval-interval", "2", "--checkpoint-seconds", "0")  # fmt: skip
    if "lstm" in task_id:
        with pytest.raises(ConfigError, match=r"--optimizer muon .* --optimizer adamw$"):
            training.plan(options)
        return
    outcome = training.train(training.plan(options))
    assert outcome.result.step == 2 and torch.isfinite(torch.tensor(outcome.result.train_loss))
    saved = load_file(str(tmp_path / "run" / "optimizer.safetensors"))
    assert any(k.endswith(".momentum_buffer") for k in saved)


def test_export_hf_refuses_the_speedrun_naming_what_transformers_lacks(tmp_path):
    from cli_helpers import run_cli

    data = write_text(tmp_path)
    training.train(plan(data, tmp_path / "run", "--max-iters", "1"))
    r = run_cli("export-hf", tmp_path / "run", tmp_path / "hf")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "relu2" in r.stderr and not (tmp_path / "hf").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ddp_processes_train_the_speedrun_as_one_process_does_at_the_same_global_batch(
    tmp_path,
):
    from cli_helpers import SRC

    data = write_text(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    args = ["train", "--data", str(data), *TINY, "--max-iters", "4"]
    one = subprocess.run([sys.executable, "-m", "attnlab", *args, "--out", str(tmp_path / "one"),
                          "--batch-size", "4"], env=env, capture_output=True, text=True)  # fmt: skip
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(_free_port()), "-m", "attnlab", *args, "--out",
                          str(tmp_path / "two"), "--batch-size", "2"],
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in ("one", "two"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_the_speedrun_recipe_keeps_its_shares_when_the_run_is_longer_or_shorter():
    from attnlab.tasks.lm import PRESET_TRAINING

    recipe = PRESET_TRAINING["speedrun"]
    plan = lambda **kw: (
        training.plan({"data": "input.txt", "out": "r", "preset": "speedrun", **kw}).config
    )  # noqa: E731
    default = plan()
    assert {k: getattr(default, k) for k in recipe} == recipe
    share = recipe["cooldown_iters"] / recipe["max_iters"]
    for steps in (recipe["max_iters"] // 3, 4 * recipe["max_iters"]):
        c = plan(max_iters=steps)
        assert c.cooldown_iters == int(share * steps)  # the cool-down: a share of any run
        assert c.eval_interval == steps  # evaluated once, at the end
    assert plan(max_iters=4 * recipe["max_iters"]).warmup_iters == recipe["warmup_iters"]
    assert plan(cooldown_iters=7).cooldown_iters == 7  # a flag given wins
