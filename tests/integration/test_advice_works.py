"""Every refusal's advice works when followed (issue 24 items 10, 15): each test takes the
command a refusal names, runs it (or plans it, where it would train for long) and checks that
it is accepted.

timeline without snapshots: a run trained here is trained again taking them; a model with no
self-attention heads (an LSTM) is not sent to --snapshot-every; imported weights are sent to a
run of your own. heads --importance: an LSTM to eval --ablate context or eval; an encoder that
predicts nothing to the head scores, before --data or --inputs are looked at. predict and trace
agree on an empty text.
"""

from __future__ import annotations

import os
import re
import shlex

import pytest

from attnlab.cli import build_parser, main
from look_helpers import run_main
from task_helpers import train_args, write_task_data

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = write_task_data(tmp_path_factory.mktemp("data"))
    runs = {}

    def get(name: str):
        if name not in runs:
            out = d / name
            args = train_args("lstm-attention" if name == "lstm" else name, d, out,
                              "--max-iters", "3")  # fmt: skip
            if name == "lstm":
                args[args.index("lstm-attention")] = "lstm"
            assert main(args) == 0, name
            runs[name] = out
        return runs[name]

    return get


def refusal(capsys, *args) -> str:
    capsys.readouterr()
    code, out, err = run_main(capsys, *map(str, args))
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out, err)
    return lines[0]


def advised(line: str, run) -> list[str]:
    """The first `attnlab ...` command a refusal names (in backquotes),
    RUN replaced by the run's path, without the leading `attnlab`."""
    m = re.search(r"`attnlab ([^`]+)`", line)
    assert m, line
    words = shlex.split(m.group(1).replace("RUN", str(run)))
    return words[1:] if words[0] == "attnlab" else words


def test_timeline_of_a_run_without_snapshots_names_a_training_that_takes_them(capsys, trained):
    run = trained("lm")
    line = refusal(capsys, "timeline", run)
    cmd = advised(line, run)
    assert cmd[0] == "train" and "--snapshot-every" in cmd
    assert main(cmd) == 0  # the advised training runs, and takes snapshots
    new = cmd[cmd.index("--out") + 1]
    capsys.readouterr()
    assert main(["timeline", new]) == 0


@pytest.mark.parametrize("name", ["lstm-attention", "lstm"])
def test_timeline_of_an_lstm_does_not_send_it_to_snapshot_every(capsys, trained, name):
    line = refusal(capsys, "timeline", trained(name))
    assert "--snapshot-every" not in line and "self-attention" in line


def test_timeline_of_imported_weights_names_a_run_of_your_own(capsys, tmp_path):
    from intervene_helpers import bert_mlm_run

    pytest.importorskip("transformers")
    run = bert_mlm_run(tmp_path)
    line = refusal(capsys, "timeline", run)
    cmd = advised(line, run)
    assert cmd[:1] == ["train"]
    from attnlab.training import run as training

    ns = build_parser().parse_args([*cmd[:-2], "--out", str(tmp_path / "own")])  # accepted
    given = {k: v for k, v in vars(ns).items() if k not in ("func", "verb")}
    p = training.plan(given)  # plans (checks every option) without training
    assert p.config.snapshot_every > 0  # this task takes snapshots by default


def test_heads_importance_of_an_lstm_names_an_eval_that_works(capsys, trained):
    for name in ("lstm-attention", "lstm"):
        run = trained(name)
        line = refusal(capsys, "heads", run, "--importance", "--quiet")
        cmd = advised(line, run)
        assert cmd[0] == "eval", line
        capsys.readouterr()
        assert main(cmd) == 0, (line, capsys.readouterr().err)


def test_heads_importance_of_an_encoder_that_predicts_nothing_is_refused_first(capsys, tmp_path):
    """all-MiniLM-L6-v2's 'loss' fell as heads were removed: it has no prediction head."""
    transformers = pytest.importorskip("transformers")
    from attnlab.interop.hf import import_hf
    from intervene_helpers import WORDS

    transformers.logging.set_verbosity_error()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)  # fmt: skip
    hf = tmp_path / "hf"
    transformers.BertModel(cfg).save_pretrained(hf)
    (hf / "vocab.txt").write_text("\n".join(vocab) + "\n")
    run = import_hf(hf, tmp_path / "run")
    inputs = tmp_path / "in.txt"
    inputs.write_text("the bank of the river\n")
    for more in ([], ["the bank of the river"], ["--inputs", inputs], ["--data", inputs]):
        line = refusal(capsys, "heads", run, *more, "--importance")
        assert "predicts nothing" in line, line
    cmd = advised(line, run)
    capsys.readouterr()
    assert main([*cmd, "--sequences", "2"]) == 0, capsys.readouterr().err


def test_predict_and_trace_agree_on_an_empty_text(capsys, trained):
    run = trained("lm")
    assert refusal(capsys, "predict", run, "") == refusal(capsys, "trace", run, "")
