"""Devices through the real command line: a device this machine lacks is one line and exit 2,
on every verb that takes --device."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab import runtime
from forked_cli import ForkedCLI
from lm_helpers import TEXT, TINY_TRAIN

COPY = "copy:n_train=40,n_val=8,n_test=8,min_len=3,max_len=5,symbols=4"
ONE_STEP = ["--max-iters", "1", "--eval-interval", "1", "--eval-iters", "1"]


@pytest.fixture(scope="module")
def cli():
    server = ForkedCLI()
    yield server
    server.close()


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
