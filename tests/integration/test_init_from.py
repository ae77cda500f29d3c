"""``attnlab train --init-from RUN``: fine-tune any run (issue 22, item 6).

Tiny random Hugging Face models are built in the test, saved and imported (no network): a
Llama and a GPT-2 continue training on a text, and their first step's loss is the imported
model's loss on that same batch (so are a BERT's masked LM, a T5's and an attnlab seq2seq
run's pairs, and an attnlab ViT's images); an imported BERT trains a classifier and an
imported ViT classifies new images read its way; a run trained by attnlab continues on new
text; --resume, Ctrl-C and torchrun of a fine-tuned run hold; and every refusal is one line,
exit 2, with nothing written.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers.logging.set_verbosity_error()

from test_family_import import TEXT, save_family  # noqa: E402

from attnlab.cli import main  # noqa: E402
from attnlab.interop.hf import import_hf  # noqa: E402
from attnlab.run import load_run  # noqa: E402
from attnlab.training import run as training  # noqa: E402
from attnlab.training.faults import Faults  # noqa: E402
from intervene_helpers import WORDS, bert_mlm_run  # noqa: E402

STEPS = ["--batch-size", "2", "--eval-iters", "1", "--log-interval", "1", "--quiet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    (d / "text.txt").write_text(TEXT * 3, encoding="utf-8")
    return d / "text.txt"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    save_family(d / "hf")
    return import_hf(d / "hf", d / "run")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from test_family_import import byte_level_bpe

    d = tmp_path_factory.mktemp("gpt2")
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=48,
                                  attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d / "hf")
    byte_level_bpe().save(str(d / "hf" / "tokenizer.json"))
    return import_hf(d / "hf", d / "run")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return bert_mlm_run(tmp_path_factory.mktemp("bert"))


class FirstLoss:
    """A Trainer callback keeping the loss of the first micro-batch it trains on."""

    def __init__(self):
        self.loss = None

    def on_loss(self, trainer, loss):
        if self.loss is None:
            self.loss = float(loss.detach())
        return loss


def fine_tune(source, data, out, callbacks=(), **options) -> training.TrainOutcome:
    """``attnlab train --data DATA --init-from SOURCE --out OUT`` for 3 steps, as a library
    call (``options`` as the command's, e.g. block_size=16), with Trainer ``callbacks``."""
    given = {"data": str(data), "init_from": str(source), "out": str(out), "max_iters": 3,
             "batch_size": 2, "eval_iters": 1, "log_interval": 1, "quiet": True, **options}  # fmt: skip
    return training.train(training.plan(given), callbacks=callbacks)


def first_batch_loss(outcome, source) -> float:
    """The source run's own loss (as imported, in eval mode) on the first batch the fine-tune
    trained on: the same task's batches, drawn with the same seed."""
    task, c = outcome.task, training.plan({"data": "x", "out": "y"}).config
    batches = task.train_batches(2, c.seed)
    model = load_run(source).model
    with torch.no_grad():
        return float(task.loss(model, next(batches)))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_imported_decoder_continues_from_its_own_loss(family, request, corpus, tmp_path):
    source = request.getfixturevalue(family)
    first = FirstLoss()
    outcome = fine_tune(source, corpus, tmp_path / "ft", [first], block_size=16, dropout=0.0)
    assert outcome.result.step == 3
    want = first_batch_loss(outcome, source)
    assert abs(first.loss - want) < 1e-5, (first.loss, want)
    cfg = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert cfg["init_from"]["path"] == str(source.resolve())
    assert cfg["init_from"]["source"]["format"] == "huggingface"
    assert cfg["config"]["block_size"] == 16  # shrunk; every other size the source's
    assert "preset" not in cfg["task_options"] and "tokenizer" not in cfg["task_options"]
    src = json.loads((source / "config.json").read_text())["config"]
    assert {k: v for k, v in cfg["config"].items() if k not in ("block_size", "dropout")} == {
        k: v for k, v in src.items() if k not in ("block_size", "dropout")
    }
    run = load_run(tmp_path / "ft")  # the tokenizer is the source's, byte for byte
    assert (tmp_path / "ft" / "tokenizer.json").read_text() == (
        source / "tokenizer.json"
    ).read_text()
    assert run.predict("the cat")["next"]
    assert run.evaluate()["loss"] > 0  # its own held-out split, read in its tokenizer


def test_a_run_trained_by_attnlab_continues_on_new_text(tiny_trained_run, tmp_path):
    from lm_helpers import TEXT as SHAKESPEARE

    (tmp_path / "more.txt").write_text(SHAKESPEARE[::-1], encoding="utf-8")  # the same characters
    first = FirstLoss()
    outcome = fine_tune(tiny_trained_run, tmp_path / "more.txt", tmp_path / "ft", [first])
    assert outcome.result.step == 3
    assert abs(first.loss - first_batch_loss(outcome, tiny_trained_run)) < 1e-5
    a = load_run(tiny_trained_run).config["config"]
    b = load_run(tmp_path / "ft").config["config"]
    assert a == b  # the same architecture, its block size included


def test_an_imported_bert_trains_a_classifier(bert, tmp_path, capsys):
    lines = [
        f"{'wet' if i % 2 else 'dry'}\t{' '.join(WORDS[i % 7 : i % 7 + 5])}" for i in range(40)
    ]
    (tmp_path / "labels.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "clf"
    code = main(["train", "--task", "classify", "--data", str(tmp_path / "labels.tsv"),
                 "--init-from", str(bert), "--out", str(out), "--max-iters", "4",
                 "--batch-size", "4", "--eval-interval", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "new: pooler.weight, pooler.bias, classifier.weight, classifier.bias" in err
    run = load_run(out)
    assert run.kind == "text-classifier" and run.config["labels"] == ["dry", "wet"]
    assert run.model.mlm is None and run.model.config.num_labels == 2
    src = load_run(bert).model
    assert torch.equal(run.model.tok_embed.weight, src.tok_embed.weight) is False  # trained on
    assert {c["label"] for c in run.predict("the bank of the river")["classes"]} == {"dry", "wet"}
    assert 0 <= run.evaluate()["accuracy"] <= 1


def test_an_encoder_continues_its_masked_lm(bert, tmp_path):
    (tmp_path / "words.txt").write_text(
        "\n".join(" ".join(WORDS[i % 9 : i % 9 + 6]) for i in range(60)) + "\n", encoding="utf-8"
    )
    first = FirstLoss()
    outcome = fine_tune(bert, tmp_path / "words.txt", tmp_path / "mlm", [first], dropout=0.0)
    assert outcome.task.name == "mlm" and outcome.result.step == 3
    assert abs(first.loss - first_batch_loss(outcome, bert)) < 1e-5


def _same_weights(a, b) -> bool:
    x, y = load_run(a).model.state_dict(), load_run(b).model.state_dict()
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_fine_tuned_run_resumes_and_survives_ctrl_c_exactly(llama, corpus, tmp_path, capsys):
    base = ["train", "--data", str(corpus), "--init-from", str(llama), "--block-size", "16",
            *STEPS, "--warmup-iters", "1", "--eval-interval", "3", "--lr-decay-iters", "6"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "whole"), "--max-iters", "6"]) == 0
    assert main([*base, "--out", str(tmp_path / "half"), "--max-iters", "3"]) == 0
    resume = ["train", "--out", str(tmp_path / "half"), "--resume", "--max-iters", "6", "--quiet"]
    assert main(resume) == 0
    assert _same_weights(tmp_path / "whole", tmp_path / "half")
    # Ctrl-C at step 2 saves it; the command it prints continues the run exactly
    given = {"data": str(corpus), "init_from": str(llama), "block_size": 16, "batch_size": 2,
             "eval_iters": 1, "log_interval": 1, "quiet": True, "warmup_iters": 1,
             "eval_interval": 3, "lr_decay_iters": 6, "max_iters": 6,
             "out": str(tmp_path / "stopped")}  # fmt: skip
    outcome = training.train(training.plan(given), callbacks=[Faults("sigint-at:2")])
    assert outcome.result.interrupted == "SIGINT" and outcome.result.step == 2
    again = ["train", "--out", str(tmp_path / "stopped"), "--resume", "--quiet",
             "--init-from", str(llama)]  # the same --init-from may be typed again  # fmt: skip
    assert main(again) == 0
    assert _same_weights(tmp_path / "whole", tmp_path / "stopped")
    capsys.readouterr()
    other = ["train", "--out", str(tmp_path / "stopped"), "--resume", "--init-from", str(corpus)]
    assert main(other) == 2
    assert "--init-from cannot change on --resume" in capsys.readouterr().err
    again = ["train", "--out", str(tmp_path / "stopped"), "--resume", "--tokenizer", "bpe"]
    assert main(again) == 2
    assert "--tokenizer would change the model of a fine-tuned run" in capsys.readouterr().err


def refused(capsys, tmp_path, *args) -> str:
    capsys.readouterr()
    out = tmp_path / "never"
    code = main(["train", *map(str, args), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert not out.exists()  # nothing written
    return err[0]


@pytest.mark.parametrize("option", [["--n-layer", "3"], ["--d-model", "64"], ["--n-head", "2"],
                                    ["--arch", "llama"], ["--tokenizer", "bpe"],
                                    ["--vocab-size", "100"], ["--preset", "small"],
                                    ["--kv-heads", "1"]])  # fmt: skip
def test_options_that_change_the_architecture_are_refused(option, llama, corpus, tmp_path, capsys):
    err = refused(capsys, tmp_path, "--data", corpus, "--init-from", llama, *option)
    assert err.startswith(f"attnlab: error: {option[0]} would change the model --init-from"), err


def test_a_longer_block_size_is_refused(llama, corpus, tmp_path, capsys):
    err = refused(capsys, tmp_path, "--data", corpus, "--init-from", llama, "--block-size", "65")
    assert "--block-size 65 is longer than the 64 positions" in err


def test_a_bad_run_is_refused_in_one_line(corpus, tiny_trained_run, tmp_path, capsys):
    import shutil

    shutil.copytree(tiny_trained_run, tmp_path / "cut")
    weights = tmp_path / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a download that stopped early
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"")
    for bad, says in ((tmp_path / "missing", "no such run directory"),
                      (tmp_path / "empty", "not an attnlab run directory"),
                      (tmp_path / "broken", "not valid JSON"),
                      (corpus, "expected a run directory"),
                      (tmp_path / "cut", "not a valid safetensors file")):  # fmt: skip
        err = refused(capsys, tmp_path, "--data", corpus, "--init-from", bad)
        assert err.startswith("attnlab: error: --init-from ") and says in err, err


def test_a_task_that_cannot_train_the_run_names_one_that_can(llama, bert, corpus, tmp_path, capsys):
    err = refused(capsys, tmp_path, "--task", "classify", "--data", corpus, "--init-from", llama)
    assert "--task classify cannot train: fine-tune it with --task lm" in err, err
    err = refused(capsys, tmp_path, "--task", "lm", "--data", corpus, "--init-from", bert)
    assert "--task lm cannot train: fine-tune it with --task mlm or --task classify" in err, err


def test_a_kind_that_cannot_be_fine_tuned_yet_says_what_works(tmp_path, capsys):
    from intervene_helpers import rnn_run

    run = rnn_run(tmp_path / "rnn")
    err = refused(capsys, tmp_path, "--task", "seq2seq", "--data", "dates", "--init-from", run)
    assert "cannot train: train a new model instead (without --init-from)" in err, err


def test_a_vit_trained_by_attnlab_continues_with_its_classifier(tmp_path):
    pytest.importorskip("sklearn")
    args = ["train", "--task", "classify", "--data", "digits", "--arch", "vit", "--max-iters",
            "2", "--batch-size", "8", "--eval-interval", "2", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "vit")]) == 0
    first = FirstLoss()
    outcome = fine_tune(tmp_path / "vit", "digits", tmp_path / "ft", [first], task="classify")
    assert outcome.task.name == "vision" and outcome.result.step == 3
    # the same labels: the classifier is kept, so the first loss is the source's own
    assert abs(first.loss - first_batch_loss(outcome, tmp_path / "vit")) < 1e-5


def test_an_imported_vit_classifies_new_images_read_its_way(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from test_t5_vit_parity import build_vit

    _, hf = build_vit(tmp_path, "ViTForImageClassification")  # 12x12 RGB, 5 classes
    source = import_hf(hf, tmp_path / "run")
    code = main(["train", "--task", "classify", "--data", "digits", "--init-from", str(source),
                 "--out", str(tmp_path / "ft"), "--max-iters", "2", "--batch-size", "8",
                 "--eval-interval", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "new: head.weight, head.bias" in err  # 8x8 gray digits resized and normalised
    run = load_run(tmp_path / "ft")
    assert run.model.config.n_classes == 10 and run.model.config.image_size == 12
    assert run.predict("test:0")["truth"] in [str(i) for i in range(10)]


T5_PAIRS = ["the cat sat\ta cat sat", "a dog ran\tthe dog ran", "the cat ran\ta cat ran",
            "a dog sat on the mat\tthe dog sat on a mat"] * 8  # fmt: skip


@pytest.mark.parametrize("shape", ["t5", "t5-v1.1"])
def test_an_imported_t5_continues_on_pairs(shape, tmp_path):
    from test_t5_vit_parity import build_t5

    _, hf = build_t5(tmp_path, shape)
    source = import_hf(hf, tmp_path / "run")
    (tmp_path / "pairs.tsv").write_text("\n".join(T5_PAIRS) + "\n", encoding="utf-8")
    first = FirstLoss()
    outcome = fine_tune(source, tmp_path / "pairs.tsv", tmp_path / "ft", [first], dropout=0.0)
    assert outcome.task.name == "seq2seq" and outcome.result.step == 3
    assert abs(first.loss - first_batch_loss(outcome, source)) < 1e-5
    run = load_run(tmp_path / "ft")
    assert (
        run.kind == "t5"
        and run.config["config"]["n_encoder_layers"]
        == (load_run(source).config["config"]["n_encoder_layers"])
    )
    assert isinstance(run.predict("the cat sat")["output"], str)


def test_an_attnlab_seq2seq_run_continues(tmp_path):
    from intervene_helpers import PAIRS_TEXT, seq2seq_run

    source = seq2seq_run(tmp_path / "s2s")
    lines = [f"{PAIRS_TEXT[i : i + 5]}\t{PAIRS_TEXT[i : i + 5][::-1]}" for i in range(30)]
    (tmp_path / "rev.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    first = FirstLoss()
    outcome = fine_tune(source, tmp_path / "rev.tsv", tmp_path / "ft", [first], dropout=0.0)
    assert outcome.task.name == "seq2seq"
    assert abs(first.loss - first_batch_loss(outcome, source)) < 1e-5


@pytest.mark.slow
def test_torchrun_fine_tunes_with_every_process_starting_from_the_run(llama, corpus, tmp_path):
    """Two processes through torchrun: each copies the run's weights in, so the evaluation at
    step 0 (before any update) is the one a single process makes; the run resumes."""
    import socket
    import subprocess
    import sys

    from attnlab.rundir import read_trainer_state
    from cli_helpers import SRC
    from lm_helpers import metrics

    args = ["train", "--data", str(corpus), "--init-from", str(llama), "--block-size", "16",
            "--dropout", "0", *STEPS, "--eval-interval", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(port), "-m", "attnlab", *args, "--out", str(tmp_path / "ddp"),
           "--max-iters", "2"]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_trainer_state(tmp_path / "ddp")["world_size"] == 2
    assert main([*args, "--out", str(tmp_path / "one"), "--max-iters", "2"]) == 0

    def first_eval(run):
        return next(row["val_loss"] for row in metrics(run) if row.get("step") == 0)

    assert abs(first_eval(tmp_path / "ddp") - first_eval(tmp_path / "one")) < 1e-6


def test_a_run_gone_between_plan_and_train_leaves_nothing(tiny_trained_run, tmp_path):
    import shutil

    from attnlab.files import RunError
    from lm_helpers import TEXT as SHAKESPEARE

    source = shutil.copytree(tiny_trained_run, tmp_path / "source")
    (tmp_path / "more.txt").write_text(SHAKESPEARE, encoding="utf-8")
    p = training.plan({"data": str(tmp_path / "more.txt"), "init_from": str(source),
                       "out": str(tmp_path / "new"), "quiet": True})  # fmt: skip
    (source / "model.safetensors").unlink()
    with pytest.raises(RunError, match="no model.safetensors"):
        training.train(p)
    assert not (tmp_path / "new").exists()


def test_text_outside_a_char_runs_vocabulary_is_one_line(
    tiny_trained_run, corpus, tmp_path, capsys
):
    err = refused(capsys, tmp_path, "--data", corpus, "--init-from", tiny_trained_run)
    assert "characters not in the vocabulary" in err, err


def test_a_long_context_run_trains_on_windows_of_at_most_1024_unless_asked(tmp_path):
    """An imported Qwen has 32,768 positions: its fine-tune's windows default to 1024."""
    from attnlab.rundir import save_model
    from attnlab.tokenizers import CharTokenizer
    from lm_helpers import TEXT as SHAKESPEARE
    from lm_helpers import tiny_gpt

    tok = CharTokenizer(SHAKESPEARE)
    save_model(tmp_path / "long", tiny_gpt(tok, block_size=4096, pos="rotary"), tok)
    given = {"data": str(tmp_path / "x.txt"), "init_from": str(tmp_path / "long")}
    assert training.plan(given).options.block_size == training.INIT_BLOCK_SIZE == 1024
    assert training.plan({**given, "block_size": 4096}).options.block_size == 4096


def test_a_bfloat16_import_fine_tunes_in_float32(corpus, tmp_path):
    """import-hf keeps a bfloat16 decoder in bfloat16 (its size on disk and in memory); a
    fine-tune of it trains and saves float32 weights, as every training run does."""
    from safetensors import safe_open

    save_family(tmp_path / "hf", dtype=torch.bfloat16)
    source = import_hf(tmp_path / "hf", tmp_path / "run")
    assert json.loads((source / "config.json").read_text())["dtype"] == "bfloat16"
    outcome = fine_tune(source, corpus, tmp_path / "ft", block_size=16)
    assert outcome.result.step == 3
    assert json.loads((tmp_path / "ft" / "config.json").read_text()).get("dtype") in (
        None, "float32")  # fmt: skip
    with safe_open(str(tmp_path / "ft" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}  # noqa: SIM118
    assert next(load_run(tmp_path / "ft").model.parameters()).dtype == torch.float32
