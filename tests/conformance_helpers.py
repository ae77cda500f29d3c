"""The conformance suite's machinery, shared by the unit tier (a few small kinds) and the
integration tier (every other declared kind): build a random run of a declared class, run
every inspection and intervention verb on it in process, and check the identities.

For each class in the registry and each tiny config it declares (``examples``), a random run is
built from the declarations alone (the tokenizer its ``reads`` calls for, vocabulary sizes from
its ``tokenizer_fields``), and every inspection and intervention verb runs on it through the
CLI: a verb the declaration says applies must succeed, one it rules out (the lens on an LSTM)
must be refused in one line (exit 2), never crash. The identities that must hold are checked
on the JSON: DLA's parts sum to the logit, patching the final residual recovers exactly 1 and
an unchanged input position exactly 0, the lens at the last layer equals the logits, and
cached decoding equals a full pass (``attnlab check``). A kind added to the registry is tested
by construction; ``conformance`` is what test_toy_kind runs on a kind defined in a test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.models.declare import registered
from attnlab.run import load_run
from attnlab.rundir import save_model
from attnlab.tokenizers import CharTokenizer, build_tokenizer
from intervene_helpers import PAIRS_TEXT, perturb
from look_helpers import CORPUS, run_main

# (clean, corrupt) inputs of the same length, by what the model reads
INPUTS = {"text": ("the bank of the river", "the bank of the green"),
          "source": ("bad cafe", "bad cage"), "image": ("test:0", "test:1")}  # fmt: skip


def tokenizer_for(cls, cfg: dict):
    """The tokenizer a model that ``reads`` text, a source text or images is given."""
    if cls.reads == "text":  # an encoder's frames its text: [CLS] ... [SEP], and has [MASK]
        return build_tokenizer("char", CORPUS, encoder=True) if not cls.causal else (
            CharTokenizer.from_text(CORPUS))  # fmt: skip
    if cls.reads == "source":  # the kind's own (T5's ids are its tokenizer's)
        return cls.example_tokenizer(PAIRS_TEXT)
    from attnlab.data.images import ImageTokenizer

    classes = [str(i) for i in range(cfg["n_classes"])]
    return ImageTokenizer("digits", classes, cfg["image_size"], cfg["channels"], 0, 0.1)


def build_run(cls, overrides: dict, path: Path, extra: dict | None = None) -> Path:
    """A random run of ``cls`` with the config ``overrides`` (biases and norms perturbed, so
    that every part of a decomposition counts)."""
    tok = tokenizer_for(cls, overrides)
    cfg = dict(overrides)
    for field, attr, _ in cls.tokenizer_fields:
        cfg.setdefault(field, getattr(tok, attr))
    torch.manual_seed(0)
    model = perturb(cls(cls.config_class(**cfg)).eval(), 0.3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)  # far from uniform: clean and corrupt inputs give different logits
    save_model(path, model, tok, extra)
    return path


def own_target(subject, text: str) -> str:
    """The output the model ranks highest at the default position, among those that read
    back as one token (or class)."""
    p = subject.prepare(text)
    logits = subject.logits(p)[0, p.position]
    for i in logits.argsort(descending=True).tolist():
        name = subject.decode(i)
        try:
            if subject.token_id(name) == i:
                return name
        except ValueError:
            continue
    raise AssertionError("no output reads back as itself")


def conformance(capsys, path: Path, data: Path | None = None, only=None,
                inputs: tuple[str, str] | None = None) -> dict[str, dict]:  # fmt: skip
    """Every verb on the run at ``path``; returns the JSON of those that ran. ``data``: a file
    in the run's task format for ``eval``; ``only``: the names of the verbs to run (all when
    None; IDENTITY_VERBS: those whose identities are checked); ``inputs``: (clean, corrupt)
    instead of INPUTS (an imported image model has no test:N images of its own)."""
    run = load_run(path)
    model, s = run.model, run.subject
    clean, corrupt = inputs or INPUTS[model.reads]
    target = own_target(s, clean)
    groups = model.head_groups()
    residual, heads = model.residual, bool(groups)
    out: dict[str, dict] = {}

    def verb(name: str, applies: bool, *args) -> None:
        if only is not None and name not in only:
            return
        rc, stdout, err = run_main(capsys, *args)
        if applies:
            assert rc == 0, f"{name} on a {model.kind}: exit {rc}: {err}"
            if "--json" in args:
                out[name] = json.loads(stdout)
        else:
            assert rc == 2 and len(err.strip().splitlines()) == 1, (name, rc, err)

    verb("trace", True, "trace", path, clean, "--json")
    verb("attention", heads, "attention", path, clean, "--json")
    verb("explore", heads, "explore", path, clean, "--html", path / "e.html", "--interventions")
    verb("lens", residual, "lens", path, clean, "--json")
    verb("dla", residual, "attribute", path, clean, "--method", "dla", "--target", target,
         "--json")  # fmt: skip
    verb("rollout", bool(model.stacks), "attribute", path, clean, "--method", "rollout", "--json")
    verb("ig", True, "attribute", path, clean, "--method", "ig", "--steps", "4", "--target",
         target, "--json")  # fmt: skip
    verb("patch", residual or heads, "patch", path, "--clean", clean, "--corrupt", corrupt,
         "--target", target, "--json")  # fmt: skip
    if residual:
        verb("ablate", heads, "ablate", path, clean, "--head", groups[0].label(0), "--json")
    else:
        verb("ablate", heads, "ablate", path, clean, "--context", "--json")
    verb("importance", residual and heads and model.predicts != "nothing", "heads", path, clean,
         "--importance", "--json")  # fmt: skip
    verb("check", True, "check", path, "--json")
    for name in ("similarity", "influence"):  # before/after each layer: where there are layers
        verb(name, residual, name, path, clean, "--json")
        if not residual:  # the one-line refusal names verbs that work here (issue 24.14)
            _, _, err = run_main(capsys, name, path, clean)
            assert "try `trace`" in err and ("`attention`" in err) == heads, err
    verb("predict", model.predicts != "nothing", "predict", path, clean, "--json")
    if data is not None:
        verb("eval", True, "eval", path, "--data", data, "--json")
    a, b = s.prepare(clean), s.prepare(corrupt)
    stack = model.output_stack
    same = [i for i, (x, y) in enumerate(zip(a.stack_ids.get(stack, []), b.stack_ids.get(stack, [])))
            if x == y and model.reads != "image"]  # fmt: skip
    _identities(model, out, same)
    return out


def trace_sums_hold(steps: list[dict], atol: float) -> int:
    """Every trace step whose title reads as a sum ("a + b") names the steps it adds
    (``sum_of``), and its numbers are their elementwise sum; returns how many sums it checked."""
    import re

    import numpy as np

    by_name = {s["name"]: s for s in steps}
    checked = 0
    for s in steps:
        title = s["title"].replace("(+ bias)", "")
        parts = s.get("sum_of")
        if s["name"].rsplit(".", 1)[-1] in ("resid_mid", "resid", "block_output"):
            # a residual stream point is a sum, the norm of one, or (no FFN) the point before
            assert parts or "layer norm" in title or "no feed-forward" in s["meaning"], s
        assert bool(parts) == bool(re.search(r"\S \+ \S", title)), (s["name"], s["title"])
        if not parts:
            continue
        total = sum(np.asarray(by_name[p]["values"], dtype=np.float64) for p in parts)
        np.testing.assert_allclose(np.asarray(s["values"], dtype=np.float64), total, atol=atol,
                                   err_msg=f"{s['name']} != {' + '.join(parts)}")  # fmt: skip
        checked += 1
    return checked


def _identities(model, out: dict[str, dict], same: list[int]) -> None:
    if "trace" in out and model.residual:  # JSON values carry 5 decimals: 3 roundings at most
        assert trace_sums_hold(out["trace"]["steps"], atol=1e-5 + 3 * 5e-6) >= 1
    if "dla" in out:
        d = out["dla"]
        assert abs(d["sum"] - d["logit"]) < 1e-6, d["error"]
        assert abs(d["logit"] - d["logit_float32"]) < 1e-3
    if "patch" in out:
        p = out["patch"]
        stack = model.output_stack
        rows = [r for r in p["results"] if r.get("stack", "") == stack]
        if model.residual:
            last = max(r["layer"] for r in rows)
            final = [r for r in rows if r["layer"] == last and r["position"] == p["position"]]
            assert len(final) == 1 and final[0]["recovered"] == pytest.approx(1.0, abs=1e-6)
            shared = [r for r in rows if r["layer"] == 0 and r["position"] in same]
            assert len(shared) == len(same)  # the embedding of a token both inputs share
            assert all(r["recovered"] == 0.0 for r in shared)
    if "lens" in out:
        assert out["lens"]["last_vs_model"] < 1e-4
    if "check" in out:  # cached decoding == a full pass, padding, causality: what applies
        failed = [c for c in out["check"]["checks"] if c["passed"] is False]
        assert not failed, failed


EXAMPLES = [pytest.param(cls, cfg, id=f"{model_type}-{i}")
            for model_type, cls in sorted(registered().items())
            for i, cfg in enumerate(cls.examples)]  # fmt: skip


# The unit tier checks the identities (IDENTITY_VERBS) on a few small kinds (UNIT_KINDS); the
# integration tier (tests/integration/test_conformance_every_kind.py) runs every verb on every
# declared example, these included.
UNIT_KINDS = ("gpt-0", "encoder-0")
IDENTITY_VERBS = frozenset({"lens", "dla", "patch", "check"})
