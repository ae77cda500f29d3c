"""The conformance suite (tests/conformance_helpers.py) on every declared example: every
inspection and intervention verb on a random run of each kind, and the identities that must
hold (the unit tier checks the identities alone on a few small kinds). A kind added to the
registry is tested here by construction."""

from __future__ import annotations

import pytest

from conformance_helpers import EXAMPLES, build_run, conformance


@pytest.mark.parametrize("cls, cfg", EXAMPLES)
def test_every_verb_runs_on_every_declared_kind_and_its_identities_hold(cls, cfg, tmp_path,
                                                                        capsys):  # fmt: skip
    conformance(capsys, build_run(cls, cfg, tmp_path / "run"))
