"""The notes' pieces on every declared kind (the conformance suite's random runs): `what-if`
recomputes any head that records its Q, K and V and reproduces its weights exactly first, or
refuses in one line; `align` reads every encoder-decoder with attention over its source, and
refuses every other kind in one line; `similarity --measure dot` works wherever similarity
does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conformance_helpers import EXAMPLES, INPUTS, build_run
from look_helpers import run_main


@pytest.mark.parametrize("cls, cfg", EXAMPLES)
def test_what_if_align_and_dot_similarity_on_every_kind(cls, cfg, tmp_path, capsys):
    path = build_run(cls, cfg, tmp_path / "run")
    from attnlab.run import load_run

    model = load_run(path).model
    text = INPUTS[model.reads][0]
    heads = bool(model.head_groups())
    attends = model.residual and heads  # a dot product of queries and keys it records
    rc, out, err = run_main(capsys, "what-if", path, text, "--json")
    if attends:
        assert rc == 0, err
        d = json.loads(out)
        for c in d["changes"]:
            np.testing.assert_allclose(np.asarray(c["after"]).sum(-1), 1.0, atol=1e-4)
        rc, out, err = run_main(capsys, "attention", path, text, "--head", "0", "--json")
        np.testing.assert_allclose(d["before"], json.loads(out)["weights"], atol=2e-4)
    else:
        assert rc == 2 and len(err.strip().splitlines()) == 1, (rc, err)
    rc, out, err = run_main(capsys, "align", path, text, "--json")
    if model.reads == "source" and heads:
        assert rc == 0, err
        (m,) = json.loads(out)["models"]
        for s in m["steps"]:
            assert sum(s["weights"]) == pytest.approx(1.0, abs=1e-4)
    else:
        assert rc == 2 and len(err.strip().splitlines()) == 1, (rc, err)
    rc, out, err = run_main(capsys, "similarity", path, text, "--measure", "dot", "--json")
    assert (rc == 0) == model.residual, err
