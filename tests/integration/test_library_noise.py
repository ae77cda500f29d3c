"""No library warning reaches the user unless it is attnlab's own, and attnlab's own is said
once (issue 32, item 7). Before: the dates run printed ~30 lines of torch._dynamo graph-break
warnings with a traceback into attention.py, and patch printed its own warning twice (in the
result on stdout, and again on stderr)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from attnlab.cli import main
from lm_helpers import TEXT, TINY_TRAIN


def test_compiling_says_nothing_of_torchs_graph_breaks(tmp_path, monkeypatch, capfd):
    """A compiled encoder-decoder breaks its graph where attention checks for empty rows;
    torch logs each break as a warning, with a traceback. (The eager backend: the same
    tracing, no C++ to build.)"""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real(m, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    code = main(["train", "--task", "seq2seq", "--data",
                 "copy:n_train=60,n_val=8,n_test=8,min_len=3,max_len=6,symbols=5",
                 "--out", str(tmp_path / "r"), "--d-model", "16", "--n-layer", "1",
                 "--n-head", "2", "--batch-size", "4", "--max-iters", "2", "--eval-interval",
                 "2", "--compile", "--threads", "1"])  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "compiling" in err or "torch.compile" in err or "step 2/2" in err
    noise = [line for line in err.splitlines()
             if "_dynamo" in line or "Graph break" in line or "Traceback" in line
             or "site-packages" in line]  # fmt: skip
    assert noise == [], noise[:5]


def test_a_library_warning_is_quiet_and_attnlabs_own_is_said(monkeypatch):
    import attnlab.cli as cli_pkg
    from attnlab.cli import verbs

    real_build = cli_pkg.build_parser

    def speak(args):
        exec("import warnings\nwarnings.warn('a library talking', UserWarning)",
             {"__name__": "torch.some_library"})  # fmt: skip
        exec("import warnings\nwarnings.warn('attnlab saying so', UserWarning)",
             {"__name__": "attnlab.some_module"})  # fmt: skip
        return 0

    def build(*verb):
        parser = real_build(*verb)
        verbs(parser)["check"].set_defaults(func=speak)
        return parser

    monkeypatch.setattr(cli_pkg, "build_parser", build)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        assert main(["check", "run"]) == 0
    said = [str(w.message) for w in said]
    assert "a library talking" not in said and "attnlab saying so" in said


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("noise")
    (d / "corpus.txt").write_text(TEXT, encoding="utf-8")
    assert main(["train", "--data", str(d / "corpus.txt"), "--out", str(d / "run"), *TINY_TRAIN,
                 "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1"]) == 0  # fmt: skip
    return d / "run"


def test_patchs_warning_is_said_once(tiny, monkeypatch, capsys):
    from attnlab.interventions import patching

    monkeypatch.setattr(patching, "SMALL_SPAN", 1e9)  # every clean - corrupt counts as small
    args = ["patch", str(tiny), "--clean", "First", "--corrupt", "Firsu", "--target", "e"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    said = " ".join((out + err).split())  # lines folded to 80 columns, joined
    assert said.count("divides by noise") == 1 and "warning:" in out
    assert main([*args, "--json"]) == 0  # stdout is JSON: the warning is on stderr too
    out, err = capsys.readouterr()
    assert json.loads(out)["warning"] and err.count("attnlab: warning: ") == 1
