"""The Python API is the CLI (issue 24 item 18): ``Run.ablate / patch / lens / attribute /
heads`` return what the verbs print, their JSON equal to the verbs' ``--json``, a notebook's
rendering included; ``Run.hooks`` records and edits named activations. Each method's defaults
are the verb's."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from attnlab.cli import build_parser, main, verbs
from attnlab.run import load_run
from look_helpers import make_run

TEXT = "I like to eat apples"

# method call -> the same as a CLI verb
CASES = [
    (("ablate", [TEXT], {"heads": "0.1"}), ["ablate", TEXT, "--head", "0.1"]),
    (("ablate", [TEXT], {"site": "blocks.0.mlp.hidden", "neurons": [1, 2]}),
     ["ablate", TEXT, "--site", "blocks.0.mlp.hidden", "--neurons", "1,2"]),
    (("patch", ["I like to eat apples", "I like to eat pears.", "s"], {"by": "head"}),
     ["patch", "--clean", "I like to eat apples", "--corrupt", "I like to eat pears.", "--target", "s",
      "--by", "head"]),
    (("lens", [TEXT], {}), ["lens", TEXT]),
    (("attribute", [TEXT, "dla", "s"], {}), ["attribute", TEXT, "--method", "dla", "--target", "s"]),
    (("attribute", [TEXT, "rollout"], {}), ["attribute", TEXT, "--method", "rollout"]),
    (("attribute", [TEXT, "ig", "s"], {"steps": 8}),
     ["attribute", TEXT, "--method", "ig", "--target", "s", "--steps", "8"]),
    (("heads", [TEXT], {"importance": True}), ["heads", TEXT, "--importance", "--quiet"]),
    (("heads", [], {"sequences": 2}), ["heads", "--sequences", "2", "--all"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "run"
    make_run(path, steps=10)
    return path


@pytest.mark.parametrize("case", range(len(CASES)))
def test_each_method_returns_the_verbs_json(run, capsys, case):
    (method, args, kw), argv = CASES[case]
    result = getattr(load_run(run), method)(*args, **kw)
    capsys.readouterr()
    assert main([argv[0], str(run), *argv[1:], "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert json.loads(result.to_json()) == cli
    assert list(cli)[0] == "about"
    page = result._repr_html_()
    assert page.startswith("<") and len(page) > 100


def test_each_methods_defaults_are_the_verbs(run):
    """A default changed in one place and not the other would make the two disagree."""
    parsers = verbs(build_parser())
    rename = {"heads": "head", "reference": "reference", "prune": "no_prune"}
    for method in ("ablate", "patch", "attribute", "heads"):
        defaults = {a.dest: a.default for a in parsers[method]._actions}
        for name, p in inspect.signature(getattr(load_run(run), method)).parameters.items():
            dest = rename.get(name, name) if method == "ablate" else name
            if p.default is inspect.Parameter.empty or dest not in defaults or name == "quiet":
                continue
            if name == "prune":
                assert p.default is not defaults["no_prune"]
                continue
            assert p.default == defaults[dest], (method, name)


def test_hooks_records_and_edits_named_activations(run):
    r = load_run(run)
    plain = r.hooks(TEXT, ["blocks.0.attn.weights"])
    w = plain.cache["blocks.0.attn.weights"]  # (1, H, T, T)
    assert w.shape[-1] == w.shape[-2] == len(plain.tokens)
    assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-5)
    zeroed = r.hooks(TEXT, [], edit={"blocks.1.attn.z": lambda x, name: torch.zeros_like(x)})
    assert not torch.allclose(zeroed.logits, plain.logits)
    assert zeroed.to_dict()["edits"]["blocks.1.attn.z"]["changed"] > 0
    everything = r.hooks(TEXT)
    assert "blocks.0.attn.weights" in everything.cache and len(everything.cache) > 5
    assert "<table" in everything._repr_html_() and everything.about["kind"] == "gpt"
    with pytest.raises(ValueError, match="no hook named"):
        r.hooks(TEXT, ["blocks.9.nothing"])
