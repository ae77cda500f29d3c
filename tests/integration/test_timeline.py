"""Snapshots during training (every task, bounded, exact across --resume), the timeline built
from them (where each score rose fastest), and the `timeline` and `heads` verbs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.inspect.timeline import fastest_change, timeline
from attnlab.rundir import RunDir
from attnlab.train_config import default_snapshot_interval
from attnlab.training.snapshots import PATTERN_BUDGET, Snapshots
from fault_cli import inject
from lm_helpers import metrics
from task_helpers import train_args, write_task_data

# --threads 1: runs compared bit for bit use one thread count, whatever the machine is doing
# (attnlab takes fewer threads when other processes keep the cores busy)
SCHEDULE = ["--threads", "1", "--warmup-iters", "2", "--lr-decay-iters", "8", "--eval-interval", "4",
            "--checkpoint-seconds", "0", "--snapshot-every", "2"]  # fmt: skip


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_task_data(tmp_path_factory.mktemp("data"))


# -- where a series changed fastest ------------------------------------------------------------


def test_fastest_change_is_the_midpoint_of_the_rise_or_fall():
    steps = [0, 10, 20, 30, 40]
    rise = fastest_change(steps, [0.1, 0.15, 0.6, 0.7, 0.72])  # half way: 0.41
    assert rise["step"] == 20 and rise["from"] == 0.15 and rise["to"] == 0.6
    assert rise["change"] == pytest.approx(0.62)
    fall = fastest_change(steps, [4.2, 4.1, 3.0, 1.0, 0.9], rise=False)  # half way: 2.55
    assert fall["step"] == 30 and fall["change"] == pytest.approx(-3.3)


def test_fastest_change_of_a_sigmoid_is_its_steepest_point_whatever_the_noise():
    """A logistic rise centred on step c, sampled every 25 steps with noise, drifting slowly
    afterwards: the midpoint lands within one interval of c."""
    import math
    import random

    rng = random.Random(0)
    for c in (150, 260, 410):
        steps = list(range(0, 1001, 25))
        ys = [0.05 + 0.7 / (1 + math.exp(-(s - c) / 30)) + 0.0001 * s + rng.gauss(0, 0.01)
              for s in steps]  # fmt: skip
        assert abs(fastest_change(steps, ys)["step"] - c) <= 25
        down = [4.2 - y * 5 for y in ys]
        assert abs(fastest_change(steps, down, rise=False)["step"] - c) <= 25


def test_fastest_change_skips_gaps_and_ignores_the_other_direction():
    steps = [0, 5, 10, 15, 20]
    gap = fastest_change(steps, [0.0, None, 0.25, 0.75, 1.0])
    assert gap["step"] == 15 and gap["from"] == 0.25  # the value before, across the gap
    assert fastest_change(steps, [1.0, 0.8, 0.5, 0.2, 0.1]) is None  # never rose
    assert fastest_change(steps, [0.0, 0.5, 0.5, 0.5, 0.5])["step"] == 5
    assert fastest_change([0], [0.3]) is None
    assert fastest_change(steps, [float("nan")] * 5) is None


@pytest.mark.parametrize("every", [1, 7, 50])
def test_default_snapshot_interval_gives_about_forty_snapshots(every):
    steps = every * 40
    assert default_snapshot_interval(steps) == every
    assert default_snapshot_interval(3) == 1


def test_patterns_are_thinned_to_the_budget_and_scores_kept_at_every_snapshot(tmp_path):
    """A model whose patterns would take 4x the budget over the run keeps them at every 4th
    snapshot (and the last), and its scores at all."""
    from attnlab.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=16, n_layer=2, n_head=4, d_model=16, block_size=48))
    snaps = Snapshots(every=1, n_probe=2)
    snaps.run = RunDir(tmp_path)
    snaps.repeat = torch.randint(0, 16, (2, 48))
    per = 2 * 4 * 48 * 48 * 2  # maps x heads x T x T x 2 bytes (one probe)
    max_iters = 4 * PATTERN_BUDGET // per
    for step in (0, 1, 2, 3, 4, max_iters):
        snaps.take(model, step, max_iters)
    assert snaps.keep_every == 5  # ceil((max_iters + 1) * per / budget)
    kept = [
        s
        for s in RunDir(tmp_path).snapshot_steps()
        if RunDir(tmp_path).read_snapshot(s)[0]["patterns"]
    ]
    assert kept == [0, max_iters]
    for s in RunDir(tmp_path).snapshot_steps():
        meta, t = RunDir(tmp_path).read_snapshot(s)
        assert t["scores.repeat.blocks.1.attn.weights"].shape == (4, 6)
        assert ("patterns.repeat.blocks.1.attn.weights" in t) == meta["patterns"]


# -- snapshots in training ---------------------------------------------------------------------


def snapshots(run) -> dict[int, dict[str, torch.Tensor]]:
    return {s: RunDir(run).read_snapshot(s)[1] for s in RunDir(run).snapshot_steps()}


def same_snapshots(a, b) -> bool:
    sa, sb = snapshots(a), snapshots(b)
    return sa.keys() == sb.keys() and all(
        sa[s].keys() == sb[s].keys() and all(torch.equal(sa[s][k], sb[s][k]) for k in sa[s])
        for s in sa
    )


def train(data_dir, out, task_id="induction", *more) -> int:
    return main(train_args(task_id, data_dir, out, *SCHEDULE, *more))


def resume(out, *more) -> int:
    """``train --resume`` on one thread, as the runs it is compared with were trained."""
    return main(["train", "--out", str(out), "--resume", "--quiet", "--threads", "1", *more])


@pytest.fixture(scope="module")
def whole(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "induction"
    assert train(data_dir, out, "induction", "--max-iters", "8") == 0
    return out


@pytest.mark.slow
def test_snapshots_do_not_change_training(data_dir, whole, tmp_path):
    out = tmp_path / "plain"
    args = [a for a in train_args("induction", data_dir, out, *SCHEDULE, "--max-iters", "8")]
    args[args.index("--snapshot-every") + 1] = "0"
    assert main(args) == 0
    assert RunDir(out).snapshot_steps() == [] and RunDir(whole).snapshot_steps() == [0, 2, 4, 6, 8]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "ms_per_iter", "elapsed_s")}
                          for r in rows]  # fmt: skip
    assert strip(metrics(out)) == strip(metrics(whole))


@pytest.mark.slow
def test_snapshots_survive_resume_exactly(data_dir, whole, tmp_path):
    half = tmp_path / "induction"
    assert train(data_dir, half, "induction", "--max-iters", "4") == 0
    assert RunDir(half).snapshot_steps() == [0, 2, 4]
    # a snapshot written after the last checkpoint (a crash in between) is taken again
    meta, tensors = RunDir(half).read_snapshot(4)
    RunDir(half).write_snapshot(6, {k: torch.zeros_like(v) for k, v in tensors.items()}, meta)
    assert resume(half, "--max-iters", "8") == 0
    assert same_snapshots(half, whole)


@pytest.mark.slow
def test_a_signal_mid_run_then_resume_gives_the_same_snapshots(data_dir, whole, tmp_path,
                                                              monkeypatch):  # fmt: skip
    run = tmp_path / "induction"
    with monkeypatch.context() as m:
        inject(m, "sigint-at:3")
        assert train(data_dir, run, "induction", "--max-iters", "8") == 130
    assert RunDir(run).snapshot_steps() == [0, 2]
    assert resume(run) == 0
    assert same_snapshots(run, whole)


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["lm", "mlm", "classify", "transformer", "vit"])
def test_every_task_with_self_attention_takes_snapshots_the_timeline_reads(
    task_id, data_dir, tmp_path, capsys
):
    pytest.importorskip("sklearn")  # the ViT's digits
    out = tmp_path / task_id
    assert train(data_dir, out, task_id, "--max-iters", "4") == 0
    assert RunDir(out).snapshot_steps() == [0, 2, 4]
    meta, tensors = RunDir(out).read_snapshot(4)
    assert any(k.startswith("scores.") for k in tensors) and meta["patterns"]
    capsys.readouterr()
    assert main(["timeline", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps"] == [0, 2, 4] and data["heads"]
    probe = "sample" if task_id == "vit" else "repeat"  # a ViT reads images, not token ids
    assert data["probe"] == probe
    for h in data["heads"]:
        assert len(h["scores"]["previous-token"]) == 3
        assert all(0 <= v <= 1 for v in h["scores"]["entropy"])


def test_snapshots_of_an_lstm_are_refused_in_one_line(data_dir, tmp_path, capsys):
    out = tmp_path / "lstm"
    code = main(train_args("lstm-attention", data_dir, out, "--snapshot-every", "2"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("attnlab: error: --snapshot-every records self-attention heads")
    assert not out.exists()


# -- the verbs ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_timeline_verb_prints_json_and_draws_a_png(whole, tmp_path, capsys):
    png = tmp_path / "t.png"
    assert main(["timeline", str(whole), "--json", "--png", str(png)]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote timeline {png}" in err
    assert [h["name"] for h in data["heads"]] == ["0.0", "0.1", "1.0", "1.1"]
    assert len(data["in_context"]["loss_repeated_half"]) == 5
    tl = timeline(whole)
    assert tl.to_dict()["steps"] == data["steps"]
    for score, f in tl.fastest.items():
        if score in ("in-context loss", "icl score"):
            continue
        series = tl.head(f["head"])["scores"][score]
        assert f["step"] in tl.steps and f["to"] == series[tl.steps.index(f["step"])]


@pytest.mark.slow
def test_the_icl_score_of_each_snapshot_is_olssons_on_held_out_windows(whole, capsys):
    """Olsson et al.'s in-context learning score joins the timeline: at the last snapshot it is
    the loss of the last token of 32 held-out windows as long as the block minus the loss of
    the token a tenth of the way in, recomputed here from the run's final model."""
    from attnlab import load_run
    from attnlab.metrics import icl_positions, icl_score
    from attnlab.tasks import open_task

    tl = timeline(whole)
    run = load_run(whole)
    block = run.model.config.block_size
    assert tl.icl_positions == list(icl_positions(block)) == [-(-block // 10), block]
    x, _ = open_task(whole, with_data=True).sample_inputs(32, 1 << 20)
    with torch.no_grad():
        score, _, _ = icl_score(run.model.eval()(x), x)
    assert len(tl.in_context["icl_score"]) == len(tl.steps)
    assert tl.in_context["icl_score"][-1] == pytest.approx(score, abs=1e-5)
    assert main(["timeline", str(whole)]) == 0
    assert f"ICL score (loss of token {block} minus token" in capsys.readouterr().out


def test_timeline_and_heads_refuse_in_one_line(data_dir, tmp_path, capsys):
    run = tmp_path / "plain"
    assert main(train_args("lm", data_dir, run, "--max-iters", "2")) == 0
    lstm = tmp_path / "lstm"
    assert main(train_args("lstm-attention", data_dir, lstm, "--max-iters", "1")) == 0
    capsys.readouterr()
    for argv, msg in (
        (["timeline", str(run)], "has no snapshots: train it again taking them: `attnlab train"),
        (["timeline", str(run), "--png", str(tmp_path / "x.jpg")], "expected a .png"),
        (["timeline", str(tmp_path / "nope")], "no such run directory"),
        (["heads", str(lstm)], "no self-attention heads"),
        (["heads", str(run), "Some text"], "TEXT goes with --importance"),
        (["heads", str(run), "--importance", "--all"], "--all go with the head scores"),
    ):  # fmt: skip
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and msg in lines[0] and lines[0].startswith("attnlab: error:")
        assert out == ""


@pytest.mark.slow
def test_heads_verb_lists_every_head_with_scores_in_zero_one(whole, capsys):
    assert main(["heads", str(whole), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert list(d) == ["about", "heads"]  # what the model is, then the list of heads
    rows = d["heads"]
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in rows:
        assert set(r) >= {"layer", "head", "scores", "kind"}
        assert {"previous-token", "induction", "duplicate-token", "first-token", "self",
                "entropy"} == set(r["scores"])  # fmt: skip
        assert all(0 <= v <= 1 for v in r["scores"].values())
    assert main(["heads", str(whole), "--json", "--all"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert len(full["composition"]) == 4 and full["loss_repeated_half"] > 0


@pytest.mark.slow
def test_eval_of_an_induction_run_reports_both_halves_with_and_without_ablation(whole, capsys):
    assert main(["eval", str(whole), "--json"]) == 0
    clean = json.loads(capsys.readouterr().out)
    assert set(clean) >= {"loss_first_half", "loss_repeated_half", "ln_vocab"}
    assert clean["ln_vocab"] == pytest.approx(torch.log(torch.tensor(8.0)).item())
    assert main(["eval", str(whole), "--json", "--ablate", "1.0,1.1", "--mode", "mean"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["heads"] == ["1.0", "1.1"] and r["mode"] == "mean"
    assert r["intact"]["loss_repeated_half"] == pytest.approx(clean["loss_repeated_half"])
    assert r["ablated"]["loss_repeated_half"] != r["intact"]["loss_repeated_half"]
    assert main(["eval", str(whole), "--ablate", "1.7"]) == 2
    assert "1.7" in capsys.readouterr().err
    assert clean["sequences"] == 64
    assert main(["eval", str(whole), "--json", "--limit", "5"]) == 0  # it was taken and ignored
    assert json.loads(capsys.readouterr().out)["sequences"] == 5
    # without --data it reads its own sequences: a text's options are refused, not ignored
    assert main(["eval", str(whole), "--max-tokens", "100"]) == 2
    assert "--max-tokens does not apply to eval of this induction run" in capsys.readouterr().err


# -- the step slider of `explore --steps` -------------------------------------------------------


@pytest.mark.slow
def test_explore_steps_writes_a_page_of_every_snapshot(whole, tmp_path, capsys):
    import re

    out = tmp_path / "steps.html"
    assert main(["explore", str(whole), "--steps", "--html", str(out)]) == 0
    assert f"wrote step explorer {out}" in capsys.readouterr().err
    html = out.read_text()
    data = json.loads(re.search(r'type="application/json">(.*?)</script>', html, re.S).group(1))
    rep = data["probes"]["repeat"]
    assert [f["step"] for f in rep["frames"]] == [0, 2, 4, 6, 8] == rep["steps"]
    assert [h["name"] for h in rep["heads"]] == ["0.0", "0.1", "1.0", "1.1"]
    assert "http" not in html.split("<script")[0]  # nothing fetched
    for argv, msg in ((["explore", str(whole), "--html", str(out)], "explore needs TEXT"),
                      (["explore", str(whole), "abc", "--steps", "--html", str(out)], "give no TEXT")):  # fmt: skip
        assert main(argv) == 2 and msg in capsys.readouterr().err


@pytest.mark.browser
@pytest.mark.slow
def test_step_slider_in_chromium_redraws_the_head_at_each_step(whole, tmp_path):
    from cdp import CHROMIUM, Browser

    if not os.path.exists(CHROMIUM):
        pytest.skip("!!! BROWSER TEST SKIPPED: /usr/bin/chromium is missing !!!")
    from attnlab.inspect.step_explorer import explore_steps

    out = explore_steps(whole).save(tmp_path / "steps.html")
    with Browser() as b:
        b.open(out.as_uri())
        state = lambda: json.loads(b.eval("JSON.stringify(window.attnlabSteps.state)"))  # noqa: E731
        canvas = lambda: b.eval("document.getElementById('matrix').toDataURL()")  # noqa: E731
        assert state()["frame"] == 4 and state()["draws"] >= 1  # opens at the last snapshot
        last = canvas()
        b.eval("window.attnlabSteps.setFrame(0)")
        assert state()["frame"] == 0 and canvas() != last
        assert "step 0 (1 of 5)" in b.eval("document.getElementById('status').textContent")
        first_head = canvas()
        b.eval("(() => { const s = document.getElementById('head'); s.value = '3'; "
               "s.dispatchEvent(new Event('change')) })()")  # fmt: skip
        assert state()["head"] == 3 and canvas() != first_head
        b.drain(0.3)
        assert b.errors() == []


@pytest.mark.slow
def test_induction_on_a_text_file_repeats_stretches_of_its_held_out_text(data_dir, tmp_path,
                                                                         capsys):  # fmt: skip
    from attnlab.tasks import open_task

    out = tmp_path / "text"
    args = ["train", "--task", "induction", "--data", str(data_dir / "corpus.txt"), "--out",
            str(out), "--block-size", "16", "--d-model", "16", "--max-iters", "4", "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert RunDir(out).snapshot_steps() == [0, 1, 2, 3, 4]  # max_iters // 40, at least 1
    task = open_task(out, with_data=True)
    x = task.eval_sequences(5)
    text = task.tokenizer.decode(np.asarray(task.val_tokens).tolist())  # shards on disk
    for row in x:
        assert torch.equal(row[:8], row[8:]) and task.tokenizer.decode(row[:8].tolist()) in text
    capsys.readouterr()
    assert main(["eval", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["half"] == 8 and r["loss_first_half"] > 0 and r["loss_repeated_half"] > 0


def test_a_score_that_never_rose_past_the_noise_has_no_fastest_rise():
    steps = list(range(0, 500, 50))
    flat = [0.045, 0.046, 0.044, 0.048, 0.047, 0.045, 0.049, 0.046, 0.047, 0.048]
    assert fastest_change(steps, flat)["step"] == 150  # noise has a midpoint too ...
    assert fastest_change(steps, flat, min_change=0.1) is None  # ... which the timeline skips
    assert fastest_change(steps, [0.1, 0.1, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6],
                          min_change=0.1)["step"] == 100  # fmt: skip
