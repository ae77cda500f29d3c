"""RunDir: a training run's directory as one object (checkpoints, metrics, best/, snapshots)."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.files import RunError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.run import load_run
from attnlab.rundir import RunDir, read_metrics, save_model
from attnlab.tokenizers import CharTokenizer

TOK = CharTokenizer.from_text("abcdefghijk ")


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, d_model=8))


def started(path, step=0, resumed=False) -> tuple[RunDir, GPT]:
    run, model = RunDir(path), tiny()
    run.create() if not resumed else None
    run.start(model, TOK, {"task": "lm"}, resumed=resumed, step=step)
    return run, model


def checkpoint(run: RunDir, model: GPT, step: int, fault=None) -> None:
    tensors = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    run.save_checkpoint(tensors, {"m": torch.full((2,), float(step))}, {"step": step}, fault)


def test_a_checkpoint_round_trips_and_the_run_loads(tmp_path):
    run, model = started(tmp_path / "run")
    checkpoint(run, model, 3)
    state, tensors, opt = run.read_checkpoint()
    assert state == {"step": 3} and torch.equal(opt["m"], torch.full((2,), 3.0))
    assert torch.equal(tensors["tok_embed.weight"], model.tok_embed.weight)
    load_run(run.path)  # a model directory too
    assert sorted(p.name for p in run.path.iterdir()) == sorted(
        ["best", "config.json", "model.safetensors", "optimizer.safetensors", "tokenizer.json",
         "trainer_state.json"]
    )  # fmt: skip


def test_a_failed_checkpoint_leaves_the_previous_one(tmp_path):
    run, model = started(tmp_path / "run")
    checkpoint(run, model, 1)

    def disk_full(point, staging):
        if point == "optimizer":
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        checkpoint(run, model, 2, disk_full)
    assert run.read_checkpoint()[0]["step"] == 1
    assert not (run.path / "ckpt-tmp").exists()


def test_a_committed_checkpoint_cut_short_is_rolled_forward(tmp_path):
    run, model = started(tmp_path / "run")
    checkpoint(run, model, 1)

    class Died(Exception):
        pass

    def die(point, staging):
        if point == "installed-model":
            raise Died

    with pytest.raises(Died):
        checkpoint(run, model, 2, die)
    reader = RunDir(run.path, writer=False)  # recovers nothing: sees the half-installed one
    with pytest.raises(RunError, match="model.safetensors is from step 2 but trainer_state"):
        reader.read_checkpoint()
    assert run.read_checkpoint()[0]["step"] == 2 and not (run.path / "ckpt-ready").exists()


def test_create_refuses_a_directory_that_holds_a_run(tmp_path):
    run, model = started(tmp_path / "run")
    checkpoint(run, model, 5)
    with pytest.raises(RunError, match=r"already holds a training run \(step 5\); pass --resume"):
        RunDir(run.path).create()
    save_model(tmp_path / "model", model, TOK)
    with pytest.raises(RunError, match="already holds a model"):
        RunDir(tmp_path / "model").create()
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "tokenizer.json").write_text("{}")
    with pytest.raises(RunError, match=r"part of a run .*\(config.json|part of a run .*tokenizer"):
        RunDir(tmp_path / "part").create()
    with pytest.raises(RunError, match="already holds a training run; continue it with resume"):
        run.start(model, TOK, {}, resumed=False, step=0)


def test_discard_removes_what_a_new_run_wrote_and_nothing_else(tmp_path):
    new = RunDir(tmp_path / "new")
    new.create()
    (new.path / "tokens.bin").write_bytes(b"x")
    new.discard(("tokens.bin",))
    assert not new.path.exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    old = RunDir(tmp_path / "mine")
    old.create()
    old.start(tiny(), TOK, {}, resumed=False, step=0)
    old.discard()
    assert [p.name for p in old.path.iterdir()] == ["notes.txt"]


def test_a_resumed_start_keeps_the_metrics_and_snapshots_up_to_its_step(tmp_path):
    run, model = started(tmp_path / "run")
    for step in range(0, 8, 2):
        run.append_metrics({"step": step, "train_loss": 1.0})
        run.write_snapshot(step, {"s": torch.zeros(2)}, {"every": 2})
    again = RunDir(run.path)
    history = again.start(model, TOK, {}, resumed=True, step=4)
    assert [r["step"] for r in history] == [0, 2, 4] == [r["step"] for r in read_metrics(run.path)]
    assert again.snapshot_steps() == [0, 2, 4]
    assert again.read_snapshot(4)[0] == {"step": 4, "every": 2}
    assert again.start(model, TOK, {}, resumed=False, step=0) == []  # from 0: none kept
    assert again.snapshot_steps() == [] and read_metrics(run.path) == []
    assert json.loads((run.path / "best" / "config.json").read_text())["model_type"] == "gpt"


def test_a_reader_writes_nothing(tmp_path):
    run, model = started(tmp_path / "run")
    checkpoint(run, model, 1)
    (run.path / "ckpt-tmp").mkdir()
    reader = RunDir(run.path, writer=False)
    with reader:
        assert not reader.lock.held
        reader.recover()
        assert reader.start(model, TOK, {}, resumed=True, step=1) == []
    assert (run.path / "ckpt-tmp").is_dir()


def test_a_model_built_while_another_thread_checks_a_run_is_initialised():
    """Checking a run builds its model on the meta device, skipping every initialiser; serve
    does that on its worker threads while another may build a model for real. That model is
    the one the same seed gives with nothing else running (the suite once trained a GPT that
    another thread's meta build had left with torch.empty's memory: values like 1e37)."""
    import threading

    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.rundir.read import build_model

    cfg = GPTConfig(vocab_size=50, d_model=32, n_layer=2, n_head=2, block_size=16)
    torch.manual_seed(3)
    want = GPT(cfg).state_dict()
    described = {"model_type": "gpt", "config": cfg.to_dict()}
    stop, built = threading.Event(), []

    def check_runs():
        while not stop.is_set():
            built.append(build_model(described, device="meta"))

    other = threading.Thread(target=check_runs)
    other.start()
    try:
        for _ in range(40):
            torch.manual_seed(3)
            got = GPT(cfg).state_dict()
            for k, t in want.items():
                assert got[k].device == t.device and torch.equal(got[k], t), k
    finally:
        stop.set()
        other.join()
    assert built and all(next(m.parameters()).is_meta for m in built)
