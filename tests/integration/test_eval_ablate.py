"""``eval RUN --ablate``: ``eval``'s own figures (same split, batches and limits, same words),
intact and with heads ablated, for every task (language model, masked LM, classifier,
Transformer and LSTM encoder-decoders, ViT); ``heads RUN --importance`` on the run's own
held-out split, as its training scored it."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.interventions import Subject, held_out
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


def figures(d: dict) -> dict:
    """eval --json's figures: what is neither its header nor a classifier's tables."""
    skip = {"about", "task", "data", "per_class", "classes", "confusion", "mistakes"}
    return {k: v for k, v in d.items() if k not in skip}


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [t for t in HEADS if t != "lstm-attention"])
def test_ablated_eval_of_every_task_equals_the_head_removed_from_the_weights(
    capsys, trained, task_id
):
    run = trained(task_id)
    d = eval_json(capsys, run, "--ablate", HEADS[task_id])
    assert list(d)[0] == "about" and d["about"]["kind"]
    plain = figures(eval_json(capsys, run))  # the intact column is eval's own figures
    assert d["intact"] == plain
    r = load_run(run)
    zero_head_weights(r.model, HEADS[task_id])
    by_weights = {f.key: f.value for f in r.evaluate().figures}
    assert by_weights.keys() == d["ablated"].keys()
    for k, v in d["ablated"].items():
        assert v == pytest.approx(by_weights[k], abs=1e-5), k
    assert d["ablated"] != d["intact"]
    (edit,) = d["edits"].values()
    assert 0 < edit["changed"] <= edit["values"] // 2  # one head of two (or more) was changed


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["lm", "transformer"])
def test_ablated_eval_prints_evals_words_and_takes_its_options(capsys, trained, task_id):
    """The table's rows are eval's labels and formats (a percentage as eval prints it), and
    --split / --limit / --beam score the same examples as eval with them."""
    run = trained(task_id)
    more = ["--limit", "5"] + (["--split", "val", "--beam", "2"] if task_id != "lm" else [])
    capsys.readouterr()
    code, out, err = run_main(capsys, "eval", run, *more)
    assert code == 0, err
    code, table, err = run_main(capsys, "eval", run, "--ablate", HEADS[task_id], *more)
    assert code == 0, err
    plain = load_run(run).evaluate(limit=5, **({} if task_id == "lm" else {"split": "val",
                                                                          "beam": 2}))  # fmt: skip
    for f in plain.figures:  # eval's words and eval's formatting, on one row
        assert f"{f.label:<{max(len(g.label) for g in plain.figures)}}  {f.text()}" in out
        assert any(f.label in ln and f.text() in ln for ln in table.splitlines()), (f, table)
    assert "val_" not in table


@pytest.mark.slow
def test_ablated_eval_of_an_lstm_changes_its_whole_context_vector(capsys, trained):
    run = trained("lstm-attention")
    d = eval_json(capsys, run, "--ablate", "context", "--mode", "mean")
    assert d["heads"] == ["context"] and d["intact"]["loss"] != d["ablated"]["loss"]
    edit = d["edits"]["decoder.attn.z"]
    assert edit["changed"] == edit["values"] > 0  # one head: the whole context vector
    assert any("mean" in n for n in d["notes"])


def test_ablated_eval_refuses_what_it_cannot_score_in_one_line(capsys, trained, tmp_path):
    lm = trained("lm")
    assert "no head 5" in one_line_error(capsys, "eval", lm, "--ablate", "0.5")
    assert "no layer 3" in one_line_error(capsys, "eval", lm, "--ablate", "3.0")
    s2s = rnn_run(tmp_path / "rnn-dot", attention="dot")  # saved without a task
    assert "held-out" in one_line_error(capsys, "eval", s2s, "--ablate", "context")
    bert = bert_mlm_run(tmp_path / "bert")  # imported
    assert "--data" in one_line_error(capsys, "eval", bert, "--ablate", "0.0")


@pytest.mark.slow
def test_ablated_eval_refuses_heads_the_model_lacks_and_a_png(capsys, trained, tmp_path):
    s2s = trained("transformer")
    assert "cross.LAYER.HEAD" in one_line_error(capsys, "eval", s2s, "--ablate", "0.0")
    png = tmp_path / "c.png"
    assert "--png" in one_line_error(capsys, "eval", s2s, "--ablate", "decoder.0.0", "--png", png)


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
    assert "held-out" in d["source"] and len(d["heads"]) == 2
    h = held_out(load_run(run))
    zero_head_weights(h.model, "0.1")
    lost = h.loss()() - recorded
    assert [x["loss_change"] for x in d["heads"] if x["head"] == "0.1"][0] == pytest.approx(lost)
