"""``eval RUN --ablate``, ``heads RUN --importance`` on the run's own held-out split: through
the Task interface, so every task (language model, masked LM, classifier, Transformer and LSTM
encoder-decoders, ViT) is scored with heads ablated the way its training scored it."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.interventions import Subject, held_out, task_figures
from attnlab.run import load_run
from intervene_helpers import bert_mlm_run, rnn_run
from look_helpers import run_main
from task_helpers import train_args, write_task_data

pytest.importorskip("sklearn")  # the ViT's digits

# task id -> a head of it (an encoder-decoder names its stack; an LSTM has its context vector)
HEADS = {"lm": "0.1", "mlm": "0.0", "classify": "0.1", "transformer": "decoder.0.1",
         "lstm-attention": "context", "vit": "0.1"}  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """task id -> a run of 6 steps (trained once per module)."""
    data = write_task_data(tmp_path_factory.mktemp("data"))
    runs = {}

    def get(task_id: str):
        if task_id not in runs:
            out = tmp_path_factory.mktemp("runs") / task_id
            assert main(train_args(task_id, data, out, "--max-iters", "6", "--eval-interval",
                                   "6", "--dropout", "0")) == 0  # fmt: skip
            runs[task_id] = out
        return runs[task_id]

    return get


def eval_json(capsys, *args) -> dict:
    capsys.readouterr()  # what training printed, when the run was trained for this test
    code, out, err = run_main(capsys, "eval", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def one_line_error(capsys, *args) -> str:
    capsys.readouterr()
    code, out, err = run_main(capsys, *args)
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), err
    return lines[0]


def zero_head_weights(model: torch.nn.Module, spec: str) -> None:
    """Head ``spec`` removed from the weights: its columns of the output projection W_O are
    zero, which is what a zero ablation of its output z does, computed another way."""
    (ref,) = Subject(model).parse_heads(spec)
    attn = model.get_submodule(ref.group.path)
    d = attn.d_v
    with torch.no_grad():
        attn.out_proj.weight[:, ref.head * d : (ref.head + 1) * d] = 0.0


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [t for t in HEADS if t != "lstm-attention"])
def test_ablated_eval_of_every_task_equals_the_head_removed_from_the_weights(
    capsys, trained, task_id
):
    run = trained(task_id)
    d = eval_json(capsys, run, "--ablate", HEADS[task_id])
    recorded = json.loads((run / "config.json").read_text())["metrics"]
    for k, v in d["intact"].items():  # intact: what training logged for this model
        assert v == pytest.approx(recorded[k], abs=1e-5), k
    h = held_out(load_run(run))
    zero_head_weights(h.model, HEADS[task_id])
    by_weights = task_figures(h.task, h.model, h.batch_size, h.eval_iters)
    assert by_weights.keys() == d["ablated"].keys()
    for k, v in d["ablated"].items():
        assert v == pytest.approx(by_weights[k], abs=1e-5), k
    assert d["ablated"]["val_loss"] != d["intact"]["val_loss"]
    (edit,) = d["edits"].values()
    assert 0 < edit["changed"] <= edit["values"] // 2  # one head of two (or more) was changed


@pytest.mark.slow
def test_ablated_eval_of_an_lstm_changes_its_whole_context_vector(capsys, trained):
    run = trained("lstm-attention")
    d = eval_json(capsys, run, "--ablate", "context", "--mode", "mean")
    assert d["heads"] == ["context"] and d["intact"]["val_loss"] != d["ablated"]["val_loss"]
    edit = d["edits"]["decoder.attn.z"]
    assert edit["changed"] == edit["values"] > 0  # one head: the whole context vector
    assert any("mean" in n for n in d["notes"])


def test_ablated_eval_refuses_what_it_cannot_score_in_one_line(capsys, trained, tmp_path):
    lm = trained("lm")
    assert "no head 5" in one_line_error(capsys, "eval", lm, "--ablate", "0.5")
    assert "no layer 3" in one_line_error(capsys, "eval", lm, "--ablate", "3.0")
    s2s = rnn_run(tmp_path / "rnn-none", attention="none")  # saved without a task
    assert "no held-out data" in one_line_error(capsys, "eval", s2s, "--ablate", "context")
    bert = bert_mlm_run(tmp_path / "bert")  # imported
    assert "no held-out data" in one_line_error(capsys, "eval", bert, "--ablate", "0.0")


@pytest.mark.slow
def test_ablated_eval_refuses_options_of_other_scorings(capsys, trained, tmp_path):
    s2s = trained("transformer")
    assert "--beam" in one_line_error(capsys, "eval", s2s, "--ablate", "decoder.0.0", "--beam", "2")
    assert "cross.LAYER.HEAD" in one_line_error(capsys, "eval", s2s, "--ablate", "0.0")
    text = tmp_path / "t.txt"
    text.write_text("some text\n" * 50)
    assert "GPT" in one_line_error(capsys, "eval", s2s, "--ablate", "decoder.0.0", "--data", text)


@pytest.mark.slow
def test_an_lstm_without_attention_has_no_heads_to_ablate(capsys, tmp_path):
    data = write_task_data(tmp_path)
    out = tmp_path / "lstm"
    args = train_args("lstm-attention", data, out, "--max-iters", "2")
    args[args.index("lstm-attention")] = "lstm"
    assert main(args) == 0
    assert "no attention" in one_line_error(capsys, "eval", out, "--ablate", "context")


def test_head_importance_without_an_input_uses_the_held_out_split(capsys, trained):
    run = trained("lm")
    capsys.readouterr()
    code, out, err = run_main(capsys, "heads", run, "--importance", "--quiet", "--json")
    assert code == 0, err
    d = json.loads(out)
    recorded = json.loads((run / "config.json").read_text())["metrics"]["val_loss"]
    assert d["baseline"] == pytest.approx(recorded, abs=1e-5)
    assert "held-out split" in d["source"] and len(d["heads"]) == 2
    h = held_out(load_run(run))
    zero_head_weights(h.model, "0.1")
    lost = h.loss()() - recorded
    assert [x["loss_change"] for x in d["heads"] if x["head"] == "0.1"][0] == pytest.approx(lost)
