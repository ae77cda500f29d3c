"""Every ``--json`` starts with ``about``: what the model is (kind, model_type, description).

The verbs are read from the parser, so a verb that gains ``--json`` and is missing here fails
the first test until it is added to ``ARGS``, where the second runs it on a small run.
"""

from __future__ import annotations

import json

import pytest

from attnlab.cli import build_parser, main, verbs
from task_helpers import train_args, write_task_data

# verb -> (run, arguments after the run); "{lm}" etc. name the runs of the fixture below
ARGS = {
    "train": None,  # run by the fixture itself (its --json is checked there)
    # trains its own models for a minute or more: its JSON's about names the experiment
    # (tests/acceptance of the experiments run it)
    "experiment": None,
    "predict": ("lm", ["First"]),
    "eval": ("lm", []),
    "generate": ("lm", ["First", "--max-new-tokens", "3"]),
    "trace": ("lm", ["First"]),
    "attention": ("lm", ["First", "--layer", "0", "--head", "0"]),
    "similarity": ("lm", ["First"]),
    "influence": ("lm", ["First"]),
    "check": ("lm", ["--length", "8", "--batch", "2"]),
    "translate": ("s2s", ["abc"]),
    "classify": ("classify", ["the day was good"]),
    "ablate": ("lm", ["First", "--head", "0.0"]),
    "patch": ("lm", ["--clean", "First", "--corrupt", "Forst", "--target", "t"]),
    "lens": ("lm", ["First"]),
    "attribute": ("lm", ["First", "--method", "rollout"]),
    "heads": ("lm", ["--sequences", "2"]),
    "timeline": ("lm", []),
    "what-if": ("lm", ["First"]),
    "align": ("s2s", ["abc"]),  # one run: its about first (each of several: in "models")
    "circuit": ("lm", ["--clean", "First", "--corrupt", "Forst", "--target", "t"]),
    "why": ("lm", ["First", "--head", "blocks.0.attn.head0", "--query", "2", "--key", "1"]),
    "paths": (
        "lm",
        [
            "--clean",
            "First",
            "--corrupt",
            "Forst",
            "--target",
            "t",
            "--sender",
            "blocks.0.attn.head0",
            "--receiver",
            "readout",
        ],
    ),
    "weights": ("lm", []),
    # runs no model: its JSON is the matrices' own (tests/integration/test_cli_notes.py)
    "walk": None,
}
# more forms of a verb whose JSON is built elsewhere in its code
MORE = [
    ("eval", "lm", ["--ablate", "0.0"]),
    ("heads", "lm", ["First", "--importance", "--no-prune", "--quiet"]),
    ("heads", "lm", ["--importance", "--no-prune", "--quiet"]),
    ("attribute", "lm", ["First", "--method", "dla", "--target", "t"]),
    ("attribute", "lm", ["First", "--method", "grad", "--target", "t"]),
]


def json_verbs() -> set[str]:
    return {v for v, p in verbs(build_parser()).items()
            if any("--json" in a.option_strings for a in p._actions)}  # fmt: skip


def test_every_verb_with_json_is_walked_here():
    assert json_verbs() == set(ARGS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = write_task_data(tmp_path_factory.mktemp("data"))
    out = {}
    for name, task_id, more in [("lm", "lm", ["--snapshot-every", "3"]), ("s2s", "transformer", []),
                                ("classify", "classify", [])]:  # fmt: skip
        out[name] = d / name
        assert main(train_args(task_id, d, out[name], "--max-iters", "3", *more)) == 0, name
    return out


def starts_with_about(text: str, kind: str) -> dict:
    d = json.loads(text)
    assert isinstance(d, dict) and list(d)[0] == "about", text[:200]
    about = d["about"]
    assert set(about) == {"kind", "model_type", "description"}
    assert about["kind"] == kind and about["model_type"] and about["description"]
    return d


KINDS = {"lm": "gpt", "s2s": "seq2seq-transformer", "classify": "text-classifier"}


@pytest.mark.slow
@pytest.mark.parametrize("verb,run,more", [(v, *a) for v, a in ARGS.items() if a] + MORE)
def test_json_starts_with_about(verb, run, more, runs, capsys):
    capsys.readouterr()
    code = main([verb, str(runs[run]), *more, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    starts_with_about(out, KINDS[run])


@pytest.mark.slow
def test_train_json_starts_with_about(tmp_path, capsys):
    d = write_task_data(tmp_path)
    capsys.readouterr()
    assert main(train_args("lm", d, tmp_path / "r", "--max-iters", "2", "--json")) == 0
    starts_with_about(capsys.readouterr().out, "gpt")
