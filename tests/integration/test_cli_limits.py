"""Bad sizes through the real command (issue 24): every numeric option of every verb refuses a
huge, zero, negative, NaN or infinite value it cannot use in one line naming the option and its
bound, exit 2, in under 5 s, with nothing written; a run or a generation too big for the
machine is refused before anything is built or printed, naming its estimate.

The options are found by walking the parsers (attnlab.cli.limits.numeric_options), so an option
added later is tested too. Each call is a real process (``forked_cli``). Which values each
option accepts on purpose (--seed 0, --position -1, ...) is the unit test's
(tests/unit/test_limits.py), which also tries every value on every option in-process.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import pytest

from attnlab.cli import build_parser, verbs
from attnlab.cli.limits import INDEX_MAX, bound_for, numeric_options
from lm_helpers import TEXT

SECONDS = 5.0
BAD = ("nan", str(10**30), "inf", "-1", "0", "1e30", "-inf")

# the words before the option: a run that need not exist (the value is refused first)
BASE = {
    "train": ["train", "--data", "corpus.txt", "--out", "out"],
    "generate": ["generate", "run", "All"],
    "translate": ["translate", "run", "All"],
    "predict": ["predict", "run", "All"],
    "classify": ["classify", "run", "All"],
    "eval": ["eval", "run"],
    "trace": ["trace", "run", "All"],
    "attention": ["attention", "run", "All"],
    "similarity": ["similarity", "run", "All"],
    "influence": ["influence", "run", "All"],
    "explore": ["explore", "run", "All"],
    "check": ["check", "run"],
    "embed": ["embed", "run", "All"],
    "ablate": ["ablate", "run", "All", "--head", "0.0"],
    "patch": ["patch", "run", "--clean", "All", "--corrupt", "Alk", "--target", "l"],
    "lens": ["lens", "run", "All"],
    "attribute": ["attribute", "run", "All", "--method", "dla", "--target", "l"],
    "heads": ["heads", "run"],
    "timeline": ["timeline", "run"],
    "experiment": ["experiment", "pruning", "--out", "out"],
    "walk": ["walk"],
    "what-if": ["what-if", "run", "All"],
    "align": ["align", "run", "All"],
    "serve": ["serve", "run"],
    "circuit": ["circuit", "run", "--induction", "8"],
    "why": ["why", "run", "All", "--head", "blocks.0.attn.head0", "--query", "1", "--key", "0"],
    "paths": [
        "paths",
        "run",
        "--clean",
        "All",
        "--corrupt",
        "Alk",
        "--target",
        "l",
        "--sender",
        "blocks.0.attn.head0",
        "--receiver",
        "logits",
    ],
    "weights": ["weights", "run"],
}


def _refused_values(verb: str, dest: str) -> list[str]:
    import argparse

    bound = bound_for(verb, dest)
    out = []
    for text in BAD:
        try:
            bound.convert(text)
        except argparse.ArgumentTypeError:
            out.append(text)
    return out


# Numeric options, each with one of the values it refuses, in turn. The unit test
# (tests/unit/test_limits.py) tries every value on every option through the verb's own parser;
# here every verb, and every kind of value, reaches it through a real process: each verb's first
# option (the quick tier) and every fourth of the rest (slow). The other three in four add no
# path the process takes that these do not, at ~0.2 s a call (230-odd calls were 40 s a run).
SAMPLE = 4
CASES, seen = [], set()
for n, (verb, option, dest, _) in enumerate(numeric_options(verbs(build_parser()))):
    values = _refused_values(verb, dest)
    if verb in seen and n % SAMPLE:
        continue
    marks = [pytest.mark.slow] if verb in seen else []
    seen.add(verb)
    CASES.append(pytest.param(verb, option, values[n % len(values)], marks=marks))


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def refused(cli, cwd: Path, *args) -> str:
    """``attnlab ARGS`` in ``cwd``: exit 2, one line, no traceback, nothing on stdout, nothing
    written under ``cwd``, in under SECONDS. Returns the line."""
    before = snapshot(cwd)
    t = time.monotonic()
    r = cli(*args, cwd=cwd)
    took = time.monotonic() - t
    lines = r.stderr.splitlines()
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), (args, r.stderr)
    assert r.stdout == "" and snapshot(cwd) == before, args
    assert took < SECONDS, (args, took)
    print(f"{took:4.2f} s  attnlab {' '.join(map(str, args))}\n    {lines[0]}")
    return lines[0]


@pytest.fixture
def work(tmp_path) -> Path:
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("verb, option, value", CASES)
def test_a_bad_size_is_refused_in_one_line_naming_the_option(cli, work, verb, option, value):
    line = refused(cli, work, *BASE[verb], f"{option}={value}")
    assert line.startswith(f"attnlab: error: {option} must be ") and f"got {value}" in line


def test_threads_past_the_cores_are_refused_before_torch_starts_them(cli, work):
    """Issue 24 item 3 (``--threads 100000`` exhausted the process table, then segfaulted):
    refused while the options are read, so torch.set_num_threads never sees it."""
    import os

    most = 4 * len(os.sched_getaffinity(0))
    line = refused(cli, work, "predict", "run", "RO", "--threads", "100000")
    assert f"--threads must be at most {most} (4 per core this process may use)" in line


@pytest.mark.parametrize(
    "sizes",
    [["--n-layer", "100000", "--max-iters", "1"], ["--d-model", "65536"],
     ["--block-size", "1000000"], ["--task", "mlm", "--d-model", "65536"],
     ["--task", "seq2seq", "--data", "dates", "--d-model", "65536"]],
    ids=["n-layer", "d-model", "block-size", "mlm", "seq2seq"],
)  # fmt: skip
def test_a_run_too_big_for_memory_is_refused_with_its_estimate(cli, work, sizes):
    """Issue 24 item 4: refused from the options, before the data is read or the model built,
    naming the estimate and the bound."""
    line = refused(cli, work, *BASE["train"], *sizes)
    assert "this run needs about" in line and "GiB it may use" in line and "--force" in line
    assert not (work / "out").exists()


def test_gauss_legendre_steps_past_what_its_nodes_can_be_found_in_are_refused(cli, work):
    line = refused(cli, work, "attribute", "run", "All", "--method", "ig", "--target", "l",
                   "--steps", "1024")  # fmt: skip
    assert "--steps must be at most 256 with --rule gauss-legendre" in line


@pytest.fixture
def case(work, tiny_trained_run) -> Path:
    shutil.copytree(tiny_trained_run, work / "run")
    return work


# Values inside the table's bounds that the model or the machine cannot do: each refused once
# the run is open, still before anything is printed.
MODEL_CASES = {
    "generate --max-new-tokens 1e12 (issue 24 item 2)": (
        ["generate", "run", "All", "--max-new-tokens", "1000000000000"],
        "new tokens fit (--max-new-tokens)",
    ),
    "generate past the memory in samples": (
        ["generate", "run", "All", "--num-samples", "65536", "--max-new-tokens", "1000000"],
        "GiB this machine may use",
    ),
    "generate --beam past the memory": (
        ["generate", "run", "All", "--beam", "1024", "--max-new-tokens", "100000000"],
        "GiB this machine may use",
    ),
    "generate --sinks past the block": (
        ["generate", "run", "All", "--window", "sinks", "--sinks", str(2**20)],
        "the sinks window",
    ),
    "trace --layer": (["trace", "run", "All", "--layer", str(INDEX_MAX)], "no layer 2147483647"),
    "trace --head": (["trace", "run", "All", "--head", str(INDEX_MAX)], "no head 2147483647"),
    "attention --layer": (
        ["attention", "run", "All", "--layer", str(INDEX_MAX)],
        "no layer 2147483647",
    ),
    "similarity --layer": (
        ["similarity", "run", "All", "--layer", str(INDEX_MAX)],
        "no layer 2147483647",
    ),
    "ablate --position": (
        ["ablate", "run", "All", "--head", "0.0", "--position", str(INDEX_MAX)],
        "position",
    ),
    "patch --position": (
        BASE["patch"] + ["--position", str(-INDEX_MAX)],
        "position",
    ),
    "attribute --position": (BASE["attribute"] + ["--position", str(INDEX_MAX)], "position"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_CASES)
def test_a_size_the_model_or_machine_cannot_do_is_refused_once_the_run_is_open(cli, case, name):
    args, needle = MODEL_CASES[name]
    line = refused(cli, case, *args)
    assert needle in line, line
