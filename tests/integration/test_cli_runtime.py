"""Devices, CPU threads and Ctrl-C through the real command line.

- A device this machine lacks is one line and exit 2, on every verb that takes --device.
- The thread choice is said by the Trainer (its first progress line, config.json), never before
  an input error.
- Ctrl-C at any moment, start-up included, ends the command with "attnlab: interrupted" and 130.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from attnlab import runtime
from attnlab.cli import main
from cli_helpers import SRC
from lm_helpers import TEXT, TINY_TRAIN

COPY = "copy:n_train=40,n_val=8,n_test=8,min_len=3,max_len=5,symbols=4"
ONE_STEP = ["--max-iters", "1", "--eval-interval", "1", "--eval-iters", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cli) -> Path:
    """A directory with corpus.txt, labels.tsv, a one-step GPT run (gpt/) and a one-step
    encoder-decoder run (s2s/)."""
    d = tmp_path_factory.mktemp("runtime")
    (d / "corpus.txt").write_text(TEXT, encoding="utf-8")
    (d / "labels.tsv").write_text("".join(f"{n % 2}\tline {n}\n" for n in range(40)))
    r = cli("train", "--data", d / "corpus.txt", "--out", d / "gpt", *TINY_TRAIN, *ONE_STEP)
    assert r.returncode == 0, r.stderr
    r = cli("train", "--task", "seq2seq", "--data", COPY, "--out", d / "s2s", "--d-model", "16",
            "--batch-size", "4", "--quiet", *ONE_STEP)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return d


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def one_error_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), r.stderr
    assert r.stdout == ""
    return lines[0]


# ---------------------------------------------------------------------------------------------
# --device
# ---------------------------------------------------------------------------------------------

DEVICE_VERBS = {
    "train lm": ["train", "--data", "corpus.txt", "--out", "new", *TINY_TRAIN],
    "train mlm": ["train", "--task", "mlm", "--data", "corpus.txt", "--out", "new", "--quiet"],
    "train classify": ["train", "--task", "classify", "--data", "labels.tsv", "--out", "new",
                       "--quiet"],
    "train seq2seq": ["train", "--task", "seq2seq", "--data", COPY, "--out", "new", "--quiet"],
    "train vit": ["train", "--task", "classify", "--data", "digits", "--arch", "vit", "--out",
                  "new", "--quiet"],
    "generate": ["generate", "gpt", "--max-new-tokens", "3"],
    "eval gpt": ["eval", "gpt", "--data", "corpus.txt"],
    "eval seq2seq": ["eval", "s2s"],
}  # fmt: skip
NO_SUCH_DEVICE = {"mps": "no Apple MPS device", "cuda:3": "no CUDA GPU", "xpu": "no Intel XPU",
                  "nonsense": "unknown device"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("verb", DEVICE_VERBS)
@pytest.mark.parametrize("device", NO_SUCH_DEVICE)
def test_a_device_this_machine_lacks_is_one_line_and_exit_2(cli, runs, verb, device):
    if device.startswith("cuda") and runtime.device_count("cuda") > 3:
        pytest.skip("this machine has a cuda:3")
    before = tree(runs)
    line = one_error_line(cli(*DEVICE_VERBS[verb], "--device", device, cwd=runs))
    assert f"--device {device}: " in line and NO_SUCH_DEVICE[device] in line, line
    assert tree(runs) == before  # nothing written: no run directory, no token file


# ---------------------------------------------------------------------------------------------
# --threads and the thread choice
# ---------------------------------------------------------------------------------------------


def verbs(parser) -> dict:
    """verb -> its sub-parser."""
    return next(a for a in parser._actions if a.dest == "verb").choices


def test_every_verb_that_runs_a_model_takes_threads():
    from attnlab.cli import build_parser, registered

    for verb, parser in verbs(build_parser()).items():
        has = any("--threads" in a.option_strings for a in parser._actions)
        assert has == (registered()[verb].runs != "nothing"), verb


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, env, why",
    [(["--threads", "1"], {}, "--threads 1"),
     ([], {"OMP_NUM_THREADS": "1"}, "OMP_NUM_THREADS=1")],
    ids=["flag", "env"],
)  # fmt: skip
def test_training_says_its_threads_first_and_records_them(cli, tmp_path, runs, args, env, why):
    tiny = [a for a in TINY_TRAIN if a != "--quiet"]
    r = cli("train", "--data", runs / "corpus.txt", "--out", tmp_path / "run", *tiny,
            "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1", *args,
            env={"OMP_NUM_THREADS": None, **env})  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    said = f"training on cpu, 1 CPU thread ({why})"
    assert said in lines, r.stderr
    assert all(not ln.startswith(("eval", "step")) for ln in lines[: lines.index(said)])
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert steps and all("  1 thr" in ln for ln in steps), steps  # then the time left
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["runtime"] == {"device": "cpu", "threads": 1, "why": why}


@pytest.fixture
def busy_machine(monkeypatch):
    """Both of two cores kept busy by other processes (a faked measurement), OMP_NUM_THREADS
    unset, torch's default 2 and the caller's process at 2 threads: the rule's choice is 1."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "measure_busy_cores", lambda cpus, **kw: float(len(cpus)))
    monkeypatch.setattr(runtime, "usable_cpus", lambda: {0, 1})
    monkeypatch.setattr(runtime, "_torch_default", 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def logged(run: Path) -> tuple[dict, list[dict]]:
    """The run's recorded thread choice, and its metrics.jsonl rows less what measures time."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    timing = ("_per_s", "ms_per_iter", "seconds", "time", "elapsed")
    rows = [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in rows]
    return json.loads((run / "config.json").read_text())["runtime"], rows


def test_train_from_python_and_the_cli_choose_the_same_threads_on_a_busy_machine(
    tmp_path, busy_machine
):
    """train(plan(...)) once skipped the CLI's busy-machine choice: it ran on the caller's
    threads (on a shared machine, 100 steps took 278.6 s at 2 threads against 22.8 s at 1)."""
    import torch

    from attnlab.training import run as training

    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    args = ["--data", str(tmp_path / "corpus.txt"), *TINY_TRAIN, "--max-iters", "2",
            "--eval-interval", "2"]  # fmt: skip
    assert main(["train", *args, "--out", str(tmp_path / "cli")]) == 0
    assert torch.get_num_threads() == 2  # the caller's count, given back
    from attnlab.cli import build_parser

    given = vars(build_parser().parse_args(["train", *args, "--out", str(tmp_path / "api")]))
    given = {k: v for k, v in given.items() if k not in ("func", "verb", "json")}
    training.train(training.plan(given))
    assert torch.get_num_threads() == 2
    (cli_threads, cli_rows), (api_threads, api_rows) = (
        logged(tmp_path / "cli"),
        logged(tmp_path / "api"),
    )
    assert cli_threads == api_threads
    assert cli_threads["threads"] == 1 and "2.0 of 2 cores busy" in cli_threads["why"]
    assert any("val_loss" in r for r in cli_rows) and cli_rows == api_rows


def test_every_train_option_is_a_plan_field():
    """What `attnlab train` takes, plan() takes, under the same name (--threads included; --json
    is how the CLI prints the outcome, TrainOutcome.to_dict() from Python)."""
    import dataclasses

    from attnlab.cli import build_parser
    from attnlab.tasks import registered, task_class
    from attnlab.training import run as training

    fields = set(training.RUN_OPTIONS)
    for name in registered():
        fields |= training.option_names(task_class(name))
    train = verbs(build_parser())["train"]
    dests = {a.dest for a in train._actions if a.dest != "help"} - {"json"}
    assert dests - fields == set()
    assert {f.name for f in dataclasses.fields(training.TrainPlan)} >= training.RUN_OPTIONS
    p = training.plan({"task": "lm", "data": "corpus.txt", "threads": 1})
    assert p.threads == 1
    for bad in (0, -2, 1.5, "2"):
        with pytest.raises(ValueError, match="--threads must be an integer of at least 1"):
            training.plan({"data": "corpus.txt", "threads": bad})


BAD_INPUTS = [
    ["train", "--data", "missing.txt", "--out", "x"],
    ["train", "--data", "corpus.txt", "--out", "x", "--lr", "-1"],
    ["generate", "no-such-run"],
    ["trace", "no-such-run", "hello"],
    ["eval", "no-such-run", "--data", "corpus.txt"],
]


@pytest.mark.parametrize("args", BAD_INPUTS, ids=lambda a: " ".join(a[:2]))
def test_nothing_precedes_the_error_line_on_a_busy_machine(tmp_path, monkeypatch, args):
    """The old policy printed "using 1 CPU thread..." before input errors when cores were
    busy. Here the cores are busy (a faked measurement) and OMP_NUM_THREADS is unset."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "measure_busy_cores", lambda cpus, **kw: float(len(cpus)))
    monkeypatch.setattr(runtime, "usable_cpus", lambda: {0, 1})
    monkeypatch.setattr(runtime, "_torch_default", 2)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as e:  # refused by the parser (--lr -1: its bound)
            code = e.code
        assert code == 2
    assert out.getvalue() == "" and len(err.getvalue().splitlines()) == 1, err.getvalue()
    assert err.getvalue().startswith("attnlab: error: ")


def with_verb(monkeypatch, name: str, func) -> None:
    """Make ``attnlab NAME ...`` call ``func(args)`` instead of the real verb."""
    import attnlab.cli as cli_pkg

    real_build = cli_pkg.build_parser

    def build(*verb):
        parser = real_build(*verb)
        verbs(parser)[name].set_defaults(func=func)
        return parser

    monkeypatch.setattr(cli_pkg, "build_parser", build)


def test_the_choice_is_made_before_the_verb_runs_and_undone_after(monkeypatch):
    import torch

    before, seen = torch.get_num_threads(), []
    target = 1 if before != 1 else 2
    with_verb(monkeypatch, "generate", lambda args: seen.append(
        (torch.get_num_threads(), runtime.thread_choice().why)))  # fmt: skip
    assert main(["generate", "run", "--threads", str(target)]) == 0
    assert seen == [(target, f"--threads {target}")]
    assert torch.get_num_threads() == before


# ---------------------------------------------------------------------------------------------
# Ctrl-C during start-up
# ---------------------------------------------------------------------------------------------


def test_ctrl_c_while_the_parser_is_built_is_one_line_and_130(monkeypatch):
    import attnlab.cli as cli_pkg

    ran, real_build = [], cli_pkg.build_parser

    def build(*verb):  # Ctrl-C lands in the middle of the slow imports
        os.kill(os.getpid(), signal.SIGINT)
        return real_build(*verb)

    monkeypatch.setattr(cli_pkg, "build_parser", build)
    with_verb(monkeypatch, "generate", ran.append)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["generate", "run"]) == 130
    assert err.getvalue() == "attnlab: interrupted\n" and out.getvalue() == "" and ran == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# The child sends itself SIGINT (as a Ctrl-C would) the moment Python starts importing MODULE,
# then runs `python -m attnlab generate ...` as the shell would.
CHILD = textwrap.dedent(
    """
    import os, runpy, signal, sys

    TRIGGER = sys.argv[1]

    class CtrlC:
        fired = False

        def find_spec(self, name, path=None, target=None):
            if name == TRIGGER and not CtrlC.fired:
                CtrlC.fired = True
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, CtrlC())
    sys.argv = ["attnlab", *sys.argv[2:]]
    runpy.run_module("attnlab", run_name="__main__", alter_sys=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["torch", "numpy._core.multiarray", "attnlab.cli.generate"])
def test_ctrl_c_while_importing_is_one_line_and_130(runs, module):
    """Before the fix: Ctrl-C during `import torch` printed a traceback (the package imported
    torch before the CLI could catch it), and Ctrl-C while torch imported numpy was swallowed
    by torch's C code, so generate ran on to its end and exited 0."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, module, "generate", str(runs / "gpt"),
         "--max-new-tokens", "20", "--device", "cpu"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (r.returncode, r.stderr, r.stdout) == (130, "attnlab: interrupted\n", "")
