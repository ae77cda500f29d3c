"""``evaluating(model)``: eval mode inside the block, every training flag as it was after."""

from __future__ import annotations

import pytest
from torch import nn

from attnlab.modes import evaluating


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.Sequential(nn.Dropout(0.1)))


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_is_eval_mode_inside_and_restores_the_mode_after(training):
    model = _model().train(training)
    with evaluating(model) as m:
        assert m is model
        assert not any(x.training for x in model.modules())
    assert all(x.training == training for x in model.modules())


def test_evaluating_restores_the_mode_when_the_block_raises():
    model = _model().train()
    with pytest.raises(RuntimeError, match="boom"), evaluating(model):
        raise RuntimeError("boom")
    assert all(x.training for x in model.modules())


def test_evaluating_keeps_a_part_frozen_in_eval_mode_frozen():
    model = _model().train()
    model[1].eval()  # a part its owner keeps in eval mode while the rest trains
    with evaluating(model):
        pass
    assert [x.training for x in model.modules()] == [True, True, False, True, True]


def test_evaluating_nests():
    model = _model().train()
    with evaluating(model):
        with evaluating(model):
            assert not model.training
        assert not model.training
    assert model.training
