"""The language-model verbs end to end: train, generate, eval (bad inputs: test_bad_inputs.py)."""

from __future__ import annotations

import json

import pytest

from attnlab import load_run
from attnlab.cli import main
from lm_helpers import TEXT, TINY_TRAIN, metrics, write_text


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from cli_helpers import run_cli

    d = tmp_path_factory.mktemp("cli")
    data = write_text(d)
    run = d / "run"
    r = run_cli(
        "train",
        "--data",
        data,
        "--out",
        run,
        *TINY_TRAIN,
        "--max-iters",
        "6",
        "--eval-interval",
        "3",
        env={"ATTNLAB_LOSS_PNG": "1"},  # its loss curve is checked below
    )
    assert r.returncode == 0, r.stderr
    return data, run, r


@pytest.mark.slow
def test_train_writes_a_complete_run(trained):
    data, run, r = trained
    assert "trained 6 steps" in r.stdout and "Traceback" not in r.stderr
    rows = metrics(run)
    assert [x["step"] for x in rows if "val_loss" in x] == [0, 3, 6]
    assert all({"val_loss", "val_ppl", "val_bpc"} <= set(x) for x in rows if "val_loss" in x)
    model, tok = load_run(run)
    assert tok.vocab_size == len(set(TEXT)) == model.config.vocab_size
    assert (run / "loss.png").stat().st_size > 1000


@pytest.mark.slow
def test_generate_prints_the_prompt_and_a_continuation(trained, cli):
    _, run, _ = trained
    r = cli("generate", run, "--prompt", "All:", "--max-new-tokens", "20", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("All:") and len(r.stdout) == len("All:") + 20 + 1
    again = cli(
        "generate", run, "--prompt", "All:", "--max-new-tokens", "20", "--seed", "1", "--no-cache"
    )
    assert again.stdout == r.stdout  # the cache changes nothing but speed


def test_generate_batch_and_eval_in_process(trained, capsys):
    data, run, _ = trained
    assert (
        main(
            [
                "generate",
                str(run),
                "--prompt",
                "All",
                "--prompt",
                "You",
                "--num-samples",
                "2",
                "--max-new-tokens",
                "5",
                "--temperature",
                "0",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.split("-" * 40 + "\n")
    assert len(out) == 4 and out[0] == out[1] and out[2].startswith("You")
    assert main(["eval", str(run), "--data", str(data)]) == 0
    text = capsys.readouterr().out
    for key in ("loss", "perplexity", "bits/char"):
        assert key in text
    # --limit N scores N windows of the block (it was taken and ignored); --max-tokens still caps
    from attnlab.run import load_run

    block = load_run(run).model.config.block_size
    for extra, windows in (
        (["--limit", "3"], 3),
        (["--limit", "3", "--max-tokens", str(block * 2)], 2),
    ):
        assert main(["eval", str(run), "--data", str(data), "--json", *extra]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == windows * block
    # an option the task's eval would not read is refused in one line, not ignored
    assert main(["eval", str(run), "--data", str(data), "--beam", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--beam does not apply to eval of this lm run" in err and "\n" not in err


@pytest.mark.slow
def test_resume_with_more_iterations_and_refusing_a_changed_setting(trained, capsys, tmp_path):
    data, run, _ = trained
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(copy),
                "--resume",
                "--max-iters",
                "8",
                "--quiet",
            ]
        )
        == 0
    )
    assert max(x["step"] for x in metrics(copy)) == 8
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(copy), "--resume", "--lr", "0.5"]) == 2
    assert "--lr cannot change on --resume" in capsys.readouterr().err
    assert main(["train", "--data", str(data), "--out", str(copy)]) == 2
    assert "pass --resume" in capsys.readouterr().err
