"""A newcomer's first hour with the command line (issue 12), each step asserted.

They ask for help and the version, mistype a verb and an option, give the prompt without
--prompt, name a device the machine lacks, stop sampling at a newline with --stop '\\n', open
the explorer without --html, press Ctrl-C in a training run, train a few steps, and try a size
that would not fit. Each call is the real ``attnlab`` in its own process (``forked_cli``: a
warm interpreter forks it, so a call costs a fraction of a second); a few properties of the
parser and of the library underneath are checked in-process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from attnlab import __version__
from attnlab.cli import build_parser, main, registered, verbs
from attnlab.cli.generate import unescaped
from cli_helpers import SRC
from fault_cli import command
from lm_helpers import TEXT, TINY_TRAIN

ONE_STEP = ["--max-iters", "1", "--eval-interval", "1", "--eval-iters", "1"]


@pytest.fixture(scope="module")
def home(tmp_path_factory, cli) -> Path:
    """The newcomer's directory: corpus.txt and a one-step GPT run in run/."""
    d = tmp_path_factory.mktemp("newcomer")
    (d / "corpus.txt").write_text(TEXT, encoding="utf-8")
    r = cli("train", "--data", "corpus.txt", "--out", "run", *TINY_TRAIN, *ONE_STEP, cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def one_error_line(r) -> str:
    """Exit 2, nothing on stdout, and stderr is exactly one ``attnlab: error:`` line."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), r.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------
# help and version
# ---------------------------------------------------------------------------------------------


def test_help_lists_every_verb_and_version_says_which(cli, tmp_path):
    r = cli("--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == ""
    for verb in verbs(build_parser()):
        assert re.search(rf"\b{re.escape(verb)}\b", r.stdout), verb
    r = cli("--version", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"attnlab {__version__}\n", "")


def option_help(parser) -> dict[str, str]:
    """--option -> its help as printed (whitespace joined), for one verb's parser."""
    text = " ".join(parser.format_help().split())
    out = {}
    for a in parser._actions:
        long = [o for o in a.option_strings if o.startswith("--")]
        if long and a.help:
            start = text.index(
                " ".join(", ".join(a.option_strings).split()), text.index("options:")
            )
            out[long[0]] = text[start : start + 400]
    return out


def test_every_option_with_a_default_shows_it_in_its_help():
    """Property over every verb: every argument has a help, and an option whose default is a
    value (not None, not an off switch) prints that value in ``--help``, read from the parser
    (defined once)."""
    for verb, parser in verbs(build_parser()).items():
        helps = option_help(parser)
        for a in parser._actions:
            assert a.help, (verb, a.option_strings or a.dest)  # every flag says what it does
            long = [o for o in a.option_strings if o.startswith("--")]
            if not long or a.default in (None, False, "==SUPPRESS==") or long[0] == "--help":
                continue
            assert "default" in helps[long[0]], (verb, long[0], helps[long[0]])
            shown = helps[long[0]].split("default", 1)[1]
            assert str(a.default) in shown or ":" in shown, (verb, long[0], helps[long[0]])


def test_train_help_lists_the_presets_and_each_tasks_defaults(cli, tmp_path):
    from attnlab.models.encoder import ENCODER_PRESETS
    from attnlab.models.gpt import PRESETS
    from attnlab.tasks import task_class

    r = cli("train", "--help", cwd=tmp_path)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    choices = re.search(r"--preset \{([^}]*)\}", text).group(1).split(",")
    assert set(choices) == set(PRESETS) | set(ENCODER_PRESETS)
    helps = option_help(verbs(build_parser())["train"])
    for task in ("lm", "classify", "vision", "induction"):
        d = task_class(task).option_defaults()
        for name in ("max_iters", "batch_size"):
            shown = helps["--" + name.replace("_", "-")].split("(default:", 1)[1]
            assert str(d[name]) in shown, (task, name, shown)


# ---------------------------------------------------------------------------------------------
# typos: one line, the closest spelling
# ---------------------------------------------------------------------------------------------

TYPOS = {
    "verb": (["trian"], "unknown verb 'trian'; did you mean 'train'?"),
    "train option": (["train", "--max-itres", "3"],
                     "unknown option '--max-itres'; did you mean '--max-iters'?"),
    "generate option": (["generate", "run", "--temprature", "0.5"],
                        "unknown option '--temprature'; did you mean '--temperature'?"),
    "choice": (["train", "--task", "clasify"],
               "unknown --task choice 'clasify'; did you mean 'classify'?"),
    "option before the verb": (["--verison"],
                               "unknown option '--verison'; did you mean '--version'?"),
}  # fmt: skip


@pytest.mark.parametrize("case", TYPOS)
def test_a_typo_is_one_line_with_the_closest_spelling(cli, home, case):
    args, expected = TYPOS[case]
    assert one_error_line(cli(*args, cwd=home)) == f"attnlab: error: {expected}"


def test_nothing_close_says_where_the_list_is(cli, home):
    assert "attnlab --help" in one_error_line(cli("frobnicate", cwd=home))
    line = one_error_line(cli("trace", "run", "All", "--zzzz", cwd=home))
    assert "unknown option '--zzzz'" in line and "attnlab trace --help" in line
    line = one_error_line(cli("trace", "run", "I", "like", "apples", cwd=home))
    assert "unexpected argument 'like'" in line and "quote" in line


# ---------------------------------------------------------------------------------------------
# one spelling per concept
# ---------------------------------------------------------------------------------------------


def test_every_verb_that_runs_a_model_takes_device_dtype_and_json():
    declared = registered()
    for verb, parser in verbs(build_parser()).items():
        have = {o for a in parser._actions for o in a.option_strings}
        runs_a_model = declared[verb].runs == "model"
        assert ("--device" in have) == runs_a_model, verb
        dtype = declared[verb].dtype
        takes_dtype = (runs_a_model and dtype == "autocast") or dtype == "weights"
        assert ("--dtype" in have) == takes_dtype, verb
        if runs_a_model and declared[verb].json:
            assert "--json" in have, verb


def test_dtype_runs_the_model_under_autocast(cli, home):
    """--dtype bfloat16 on a verb that runs a model: the same answer to bfloat16's precision,
    and not the float32 bits (so the option does reach the model)."""

    def probs(dtype: str) -> list[float]:
        r = cli("predict", "run", "All", "--json", "--device", "cpu", "--dtype", dtype, cwd=home)
        assert r.returncode == 0, r.stderr
        return [t["p"] for t in json.loads(r.stdout)["predictions"][0]["next"]]

    full, half = probs("float32"), probs("bfloat16")
    assert full == pytest.approx(half, rel=0.02) and full != half


def test_generate_takes_the_prompt_positionally_as_other_verbs_take_text(cli, home):
    common = ["--max-new-tokens", "12", "--seed", "3", "--device", "cpu"]
    positional = cli("generate", "run", "All:", *common, cwd=home)
    option = cli("generate", "run", "--prompt", "All:", *common, cwd=home)
    assert positional.returncode == 0, positional.stderr
    assert positional.stdout == option.stdout and positional.stdout.startswith("All:")
    r = cli("generate", "run", "All:", *common, "--json", cwd=home)
    (sample,) = json.loads(r.stdout)["samples"]
    assert sample["prompt"] == "All:" and "All:" + sample["text"] + "\n" == positional.stdout


def test_stop_backslash_n_is_a_newline(cli, home):
    assert unescaped("\\n") == "\n" and unescaped("a\\tb") == "a\tb"
    assert unescaped("\\\\n") == "\\n"  # an escaped backslash stays one backslash
    assert unescaped("C:\\x") == "C:\\x"  # other backslashes are left alone
    common = ["All", "--max-new-tokens", "300", "--seed", "0", "--device", "cpu"]
    free = cli("generate", "run", *common, cwd=home)
    assert free.returncode == 0 and free.stdout.count("\n") > 1  # the model does write newlines
    stopped = cli("generate", "run", *common, "--stop", "\\n", cwd=home)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.count("\n") == 1 and free.stdout.startswith(stopped.stdout[:-1] + "\n")


def test_explore_without_html_writes_the_page_in_the_run_and_prints_its_path(cli, home):
    page = home / "run" / "explorer.html"
    page.unlink(missing_ok=True)
    r = cli("explore", "run", "All", cwd=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{Path('run') / 'explorer.html'}\n"
    assert page.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["generate", "run", "All"], ["trace", "run", "All"],
                                  ["predict", "run", "All"], ["check", "run"]])  # fmt: skip
@pytest.mark.parametrize("device", ["mps", "cuda"])
def test_a_device_this_machine_lacks_is_one_line_exit_2(cli, home, verb, device):
    from attnlab import runtime

    if runtime.device_count(device) > 0:
        pytest.skip(f"this machine has {device}")
    line = one_error_line(cli(*verb, "--device", device, cwd=home))
    assert line.startswith(f"attnlab: error: --device {device}: torch sees no"), line


@pytest.mark.slow
def test_ctrl_c_names_the_step_that_was_saved(home, tmp_path):
    """A real SIGINT at an arbitrary moment of a run: the step the message names is the
    checkpoint's step and the last step in metrics.jsonl."""
    out = tmp_path / "run"
    loud = [a for a in TINY_TRAIN if a != "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        command("step-delay:0.05", "train", "--data", home / "corpus.txt", "--out", out, *loud,
                "--max-iters", "100000", "--eval-interval", "7"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = []
    for line in proc.stderr:  # until a few steps have run
        lines.append(line)
        if line.startswith("step 9/"):
            break
    time.sleep(0.13)  # mid-step, most likely
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.stderr.read(), proc.wait(timeout=120)
    err = "".join(lines) + rest
    assert proc.returncode == 130, err
    said = re.search(r"stopped at step (\d+); checkpoint saved in", err)
    saved = re.search(r"saved the checkpoint of step (\d+)", err)
    assert said and saved and said.group(1) == saved.group(1), err
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["step"] == int(said.group(1)) >= 9
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == state["step"]


# ---------------------------------------------------------------------------------------------
# short runs, big sizes, long silences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", [None, "fast"])
def test_warmup_and_eval_interval_follow_a_short_max_iters(preset):
    from attnlab.training.run import plan

    given = {"data": "corpus.txt", "max_iters": 40, **({"preset": preset} if preset else {})}
    c = plan(given).config
    assert c.warmup_iters <= 4 and c.eval_interval <= 40 and c.lr_decay_iters == 40
    long = plan({**given, "max_iters": 100_000}).config
    assert long.warmup_iters == 100 and long.eval_interval >= 250


def test_train_json_reports_the_run(cli, home, tmp_path):
    r = cli("train", "--data", home / "corpus.txt", "--out", tmp_path / "r", *TINY_TRAIN,
            *ONE_STEP, "--json", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["step"] == 1 and got["task"] == "lm" and got["run"] == str(tmp_path / "r")
    assert got["val_loss"] == pytest.approx(got["metrics"]["val_loss"])


def test_a_size_too_big_for_the_machine_is_one_warning_with_its_memory():
    from attnlab.models.gpt import GPT, PRESETS, GPTConfig
    from attnlab.train_config import TrainConfig
    from attnlab.training.memory import run_size, size_warnings

    with torch.device("meta"):  # sizes without allocating
        huge = GPT(GPTConfig(vocab_size=65, block_size=100_000, n_layer=4, n_head=4, d_model=128))
        baby = GPT(GPTConfig(vocab_size=65, **PRESETS["baby"]))
    cfg, cpu = TrainConfig(), torch.device("cpu")
    (line,) = size_warnings(huge, cfg, None, cpu)
    s = run_size(huge, cfg.batch_size)
    assert (
        "more memory than this machine has" in line and f"{s.total_bytes / 2**30:.1f} GiB" in line
    )
    assert size_warnings(baby, cfg, None, cpu) == []


@pytest.mark.slow
def test_the_gpt2_preset_on_a_cpu_is_one_warning_with_its_memory():
    from attnlab.models.gpt import GPT, PRESETS, GPTConfig
    from attnlab.train_config import TrainConfig
    from attnlab.training.memory import size_warnings

    with torch.device("meta"):  # ~6 s to build, though nothing is allocated
        gpt2 = GPT(GPTConfig(vocab_size=65, **{**PRESETS["gpt2"], "dropout": 0.0}))
    (line,) = size_warnings(gpt2, TrainConfig(), None, torch.device("cpu"))
    assert "slow on a CPU" in line and "GiB" in line and "85.9M parameters" in line


def test_train_says_the_warning_before_training(home, tmp_path, monkeypatch, capsys):
    from attnlab.training import memory

    monkeypatch.setattr(memory, "SLOW_ON_CPU_FLOP", 0.0)  # this tiny run counts as slow
    loud = [a for a in TINY_TRAIN if a != "--quiet"]
    args = ["train", "--data", str(home / "corpus.txt"), "--out", str(tmp_path / "r"), *loud]
    assert main([*args, *ONE_STEP, "--device", "cpu"]) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [i for i, x in enumerate(err) if x.startswith("attnlab: warning: ")]
    assert len(warnings) == 1 and "slow on a CPU" in err[warnings[0]] and "GiB" in err[warnings[0]]
    assert warnings[0] < next(i for i, x in enumerate(err) if x.startswith("training on"))


def test_a_heartbeat_says_how_far_long_work_is_and_nothing_for_short_work():
    from attnlab.heartbeat import Heartbeat, count

    said: list[str] = []
    with Heartbeat("scoring", said.append, every=0.2):
        count(3, 10, "batches")
        time.sleep(0.9)
    assert said and all(line.startswith("scoring: 3/10 batches, ") for line in said)
    assert 2 <= len(said) <= 5  # one every 0.2 s of silence, not a flood
    quick: list[str] = []
    with Heartbeat("quick", quick.append, every=5):
        time.sleep(0.1)
    assert quick == []
