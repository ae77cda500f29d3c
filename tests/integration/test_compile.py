"""torch.compile with its default backend (inductor, which generates and compiles C++: about a
minute on a CPU even for a tiny model, so once here; tests/acceptance/test_tasks_training.py compiles
every task with the aot_eager backend)."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.run import load_run
from lm_helpers import train_losses
from task_helpers import train_args, write_task_data


@pytest.mark.slow
def test_inductor_trains_a_gpt_with_the_losses_of_the_eager_run(tmp_path):
    d = write_task_data(tmp_path)
    args = ("--max-iters", "2", "--eval-interval", "2", "--dropout", "0")
    assert main(train_args("lm", d, tmp_path / "eager", *args)) == 0
    assert main(train_args("lm", d, tmp_path / "compiled", *args, "--compile")) == 0
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert eager.keys() == compiled.keys() == {1, 2}
    assert all(abs(eager[s] - compiled[s]) < 1e-4 for s in eager)
    model, _ = load_run(tmp_path / "compiled")  # saved from the unwrapped model
    assert not any("_orig_mod" in k for k in model.state_dict())
