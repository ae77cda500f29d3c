"""The conformance suite (tests/conformance_helpers.py) in the unit tier: every registered
class declares examples, each example is a kind of its own, the identities on a few
small kinds (UNIT_KINDS: DLA, patching, the lens, cached decoding; every verb on every kind runs
in tests/integration/test_conformance_every_kind.py), and load_run as the one door."""

from __future__ import annotations

import pytest

from attnlab.models.declare import registered
from attnlab.run import load_run
from conformance_helpers import (
    EXAMPLES,
    IDENTITY_VERBS,
    INPUTS,
    UNIT_KINDS,
    build_run,
    conformance,
    tokenizer_for,
    trace_sums_hold,
)


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


@pytest.mark.parametrize("cls, cfg", [p for p in EXAMPLES if p.id in UNIT_KINDS])
def test_the_identities_hold_on_a_small_kind(cls, cfg, tmp_path, capsys):
    out = conformance(capsys, build_run(cls, cfg, tmp_path / "run"), only=IDENTITY_VERBS)
    assert set(out) <= IDENTITY_VERBS and "check" in out


def test_the_unit_kinds_are_declared_examples():
    assert set(UNIT_KINDS) <= {p.id for p in EXAMPLES}


def test_load_run_is_the_one_door_and_reads_config_json_once(tmp_path, monkeypatch):
    from attnlab import rundir
    from attnlab.rundir import read as reader

    cls = registered()["gpt"]
    path = build_run(cls, cls.examples[0], tmp_path / "run")
    reads = []
    real = reader.read_run_config

    def counted(d):
        reads.append(d)
        return real(d)

    for module in (rundir, reader):  # the package's name for it, and the reader's own
        monkeypatch.setattr(module, "read_run_config", counted)
    run = load_run(path)
    model, tokenizer = run  # unpacks as it always did
    run.predict("the bank")
    run.record("the bank")
    run.subject.prepare("the bank")
    assert len(reads) == 1 and model is run.model and tokenizer is run.tokenizer


NORM_PLACEMENTS = EXAMPLES + [  # the other norm placement of the kinds that have both
    pytest.param(cls, {**cfg, "norm_first": not cls.config_class.norm_first}, id=f"{t}-flipped")
    for t, cls, cfg in ((t, c, c.examples[0]) for t, c in sorted(registered().items()))
    if hasattr(cls.config_class, "norm_first")
]  # fmt: skip


def _layers(model) -> dict[str, int]:
    """Each stack's number of layers (its head groups' layers)."""
    out: dict[str, int] = {}
    for g in model.head_groups():
        key = g.path.split(".blocks")[0]
        out[key] = max(out.get(key, 0), g.layer + 1)
    return out or {"": 1}


@pytest.mark.parametrize("cls, cfg", NORM_PLACEMENTS)
def test_every_trace_step_labelled_a_sum_is_that_sum(cls, cfg, tmp_path):
    """Issue 24.8: a post-norm step "residual plus FFN update" omitted the norm, and "embedding
    + position" included the embedding LayerNorm. Checked on the steps' own numbers, at 1e-5,
    on every kind and both norm placements (pre-norm GPT and ViT, post-norm BERT and seq2seq)."""
    from attnlab.inspect import trace

    run = load_run(build_run(cls, cfg, tmp_path / "run"))
    if not run.model.residual:
        pytest.skip("no residual stream: the trace shows no sums")
    for layer in range(2):
        if layer and layer >= min(_layers(run.model).values()):
            break  # a stack with one layer (T5's tiny example): its trace has layer 0 only
        t = trace(run.model, run.tokenizer, INPUTS[run.model.reads][0], layer=layer)
        steps = [{**s.to_dict(), "values": s.value} for s in t.steps]
        assert trace_sums_hold(steps, atol=1e-5) >= 1
