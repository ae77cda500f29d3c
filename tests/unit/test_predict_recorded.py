"""``Run.predict`` reads one recorded forward pass (the pass the workbench's panels share) and
gives the prediction the task's own pass gives, for every kind of model and example config."""

from __future__ import annotations

import math

import pytest

from attnlab.files import RunError
from attnlab.models.declare import registered
from attnlab.run import load_run
from attnlab.tasks.base import predict_options
from conformance_helpers import build_run

TEXTS = {"rnn": "bad cafe", "seq2seq": "bad cafe", "t5": "bad cafe", "vit": "test:0"}
CASES = [(k, i) for k, cls in registered().items() for i in range(len(cls.examples))]


def _close(a, b) -> bool:
    """Equal, floats within float32 rounding (the two passes batch their matmuls alike but
    may sum in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
    return a == b


@pytest.mark.parametrize("kind,example", CASES, ids=[f"{k}-{i}" for k, i in CASES])
def test_a_recorded_prediction_is_the_tasks_own(kind, example, tmp_path):
    cls = registered()[kind]
    run = load_run(build_run(cls, dict(cls.examples[example]), tmp_path / "run"))
    text = TEXTS.get(kind, "the [MASK] of the river" if kind == "encoder" else "the bank of a")
    try:
        _ = run.task
    except RunError as e:  # an encoder without a head predicts nothing: predict says so alike
        with pytest.raises(RunError, match="no prediction head"):
            run.predict(text)
        assert "no prediction head" in str(e)
        return
    if not run.recorded_predict(text):
        pytest.skip(f"{kind} reads {text!r} with its own pass")
    options = predict_options(None, {})
    own = run.task.predict(run.model, [text], options)[0]
    rec = run.record(text)
    recorded = run.task.predict_recorded(run.model, rec, options)
    if recorded is None:  # this task's recording lacks its answer: predict falls back
        assert run.predict(text) == own
        return
    assert _close(recorded, own), (recorded, own)
    assert run.predict(text, rec=rec) == recorded  # the recording given is the one read


def test_a_recording_of_another_text_is_refused(tmp_path):
    from attnlab.models.declare import InputError

    cls = registered()["gpt"]
    run = load_run(build_run(cls, dict(cls.examples[0]), tmp_path / "run"))
    with pytest.raises(InputError, match="one input predicted"):
        run.predict("the bank", rec=run.record("the river"))
