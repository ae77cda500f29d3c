"""One conformance suite over every declared model kind (``attnlab.models.declare``).

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

from attnlab.checkpoint import save_model
from attnlab.models.declare import registered
from attnlab.run import load_run
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


def conformance(capsys, path: Path, data: Path | None = None) -> dict[str, dict]:
    """Every verb on the run at ``path``; returns the JSON of those that ran. ``data``: a file
    in the run's task format for ``eval``."""
    run = load_run(path)
    model, s = run.model, run.subject
    clean, corrupt = INPUTS[model.reads]
    target = own_target(s, clean)
    groups = model.head_groups()
    residual, heads = model.residual, bool(groups)
    out: dict[str, dict] = {}

    def verb(name: str, applies: bool, *args) -> None:
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
    verb("predict", model.predicts != "nothing", "predict", path, clean, "--json")
    if data is not None:
        verb("eval", True, "eval", path, "--data", data, "--json")
    a, b = s.prepare(clean), s.prepare(corrupt)
    stack = model.output_stack
    same = [i for i, (x, y) in enumerate(zip(a.stack_ids.get(stack, []), b.stack_ids.get(stack, [])))
            if x == y and model.reads != "image"]  # fmt: skip
    _identities(model, out, same)
    return out


def _identities(model, out: dict[str, dict], same: list[int]) -> None:
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


def test_every_registered_class_declares_an_example_to_be_tested_on():
    for model_type, cls in registered().items():
        assert cls.examples, f"{model_type}: declare tiny configs in {cls.__name__}.examples"


def test_every_example_is_a_kind_and_every_kind_word_is_unique_to_one_class():
    kinds = {}
    for cls, cfg in (p.values for p in EXAMPLES):
        tok = tokenizer_for(cls, cfg)
        full = {**cfg, **{f: getattr(tok, a) for f, a, _ in cls.tokenizer_fields if f not in cfg}}
        kind = cls(cls.config_class(**full)).kind
        assert kinds.setdefault(kind, cls) is cls, kind
    assert len(kinds) >= 8  # gpt, mlm, text-classifier, encoder, seq2seq, lstm(-attention), vit


@pytest.mark.parametrize("cls, cfg", EXAMPLES)
def test_every_verb_runs_on_every_declared_kind_and_its_identities_hold(cls, cfg, tmp_path,
                                                                        capsys):  # fmt: skip
    conformance(capsys, build_run(cls, cfg, tmp_path / "run"))


def test_load_run_is_the_one_door_and_reads_config_json_once(tmp_path, monkeypatch):
    from attnlab import checkpoint

    cls = registered()["gpt"]
    path = build_run(cls, cls.examples[0], tmp_path / "run")
    reads = []
    real = checkpoint.read_run_config
    monkeypatch.setattr(checkpoint, "read_run_config", lambda d: reads.append(d) or real(d))
    run = load_run(path)
    model, tokenizer = run  # unpacks as it always did
    run.predict("the bank")
    run.record("the bank")
    run.subject.prepare("the bank")
    assert len(reads) == 1 and model is run.model and tokenizer is run.tokenizer
