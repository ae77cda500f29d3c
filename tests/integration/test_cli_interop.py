"""End to end: import-hf, export-hf, embed, train --task mlm|classify, and their errors."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnlab.cli import main  # noqa: E402
from attnlab.models.encoder import Encoder  # noqa: E402
from attnlab.models.gpt import GPT, GPTConfig  # noqa: E402
from attnlab.run import load_run  # noqa: E402
from attnlab.rundir import save_model  # noqa: E402
from attnlab.tokenizers import CharTokenizer  # noqa: E402

TINY = [
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--d-model",
    "32",
    "--block-size",
    "32",
    "--quiet",
    "--warmup-iters",
    "10",
    "--log-interval",
    "1000",
]


def attnlab(capsys, *args) -> tuple[int, str, str]:
    """Run the CLI in this process (fast); returns (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(result):
    code, out, err = result
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error:"), err
    assert "Traceback" not in err
    return lines[0]


def test_export_then_import_round_trips_a_gpt_run(capsys, tmp_path):
    tok = CharTokenizer.from_text("abc de")
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, d_model=16, block_size=24)
    )
    save_model(tmp_path / "run", model.eval(), tok)
    code, out, err = attnlab(capsys, "export-hf", tmp_path / "run", tmp_path / "hf")
    assert code == 0 and out.strip() == str(tmp_path / "hf"), err
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["n_positions"] == 24
    code, _, err = attnlab(capsys, "import-hf", tmp_path / "hf", "--out", tmp_path / "back")
    assert code == 0, err
    back, _ = load_run(tmp_path / "back")
    sd, sd2 = model.state_dict(), back.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    source = json.loads((tmp_path / "back" / "config.json").read_text())["source"]
    assert source["hf_model_type"] == "gpt2" and source["attnlab"]["model_type"] == "gpt"
    _, tok = load_run(tmp_path / "back")  # a char tokenizer travels beside the HF files
    assert tok.encode("bad") == [2, 1, 4]
    before = (tmp_path / "back" / "model.safetensors").read_bytes()
    line = one_error_line(attnlab(capsys, "import-hf", tmp_path / "hf", "--out", tmp_path / "back"))
    assert "import-hf will not overwrite it" in line  # the verb the user typed, not export-hf
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == before


def test_bad_inputs_exit_2_with_one_line(capsys, cli, tmp_path):
    r = cli("embed", tmp_path / "nope", "x")  # once through a real subprocess
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no such run" in r.stderr
    pk = tmp_path / "pk"
    pk.mkdir()
    (pk / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (pk / "pytorch_model.bin").write_bytes(b"\x80\x04 a pickle would run code")
    assert "never unpickles" in one_error_line(
        attnlab(capsys, "import-hf", pk, "--out", tmp_path / "x")
    )
    assert not (tmp_path / "x").exists()
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

    s2s = Seq2SeqTransformer(
        Seq2SeqConfig(src_vocab_size=8, tgt_vocab_size=8, n_head=2, d_model=16)
    )
    save_model(tmp_path / "s2s", s2s)
    line = one_error_line(attnlab(capsys, "export-hf", tmp_path / "s2s", tmp_path / "hf"))
    assert "GPT runs (as GPT-2) and encoder runs (as BERT)" in line
    assert not (tmp_path / "hf").exists()
    gpt = tmp_path / "gpt"
    save_model(gpt, GPT(GPTConfig(vocab_size=20, n_layer=1, d_model=16)))
    assert "encoder run" in one_error_line(attnlab(capsys, "embed", gpt, "x"))
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("pos\tfine\nno tab here\n")
    line = one_error_line(
        attnlab(capsys, "train", "--task", "classify", "--data", tsv, "--out", tmp_path / "c")
    )
    assert "bad.tsv:2" in line


def _tiny_encoder() -> Encoder:
    from attnlab.models.encoder import EncoderConfig

    return Encoder(EncoderConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, block_size=16))


def _sentiment(path, n=240, seed=0):
    rng = random.Random(seed)
    good, bad = ["good", "great", "lovely", "fine"], ["bad", "awful", "sad", "poor"]
    things = ["movie", "food", "day", "book", "song", "game"]
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        word = rng.choice(good if label == "pos" else bad)
        rows.append(f"{label}\tthe {rng.choice(things)} was {word} and {rng.choice(things)} too")
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.slow
def test_train_classify_reaches_high_held_out_accuracy_and_embeds(cli, tmp_path):
    data = tmp_path / "labels.tsv"
    _sentiment(data)
    out = tmp_path / "cls"
    r = cli(
        "train",
        "--task",
        "classify",
        "--data",
        data,
        "--tokenizer",
        "word",
        "--out",
        out,
        "--max-iters",
        "150",
        "--batch-size",
        "32",
        "--eval-interval",
        "150",
        *TINY,
    )
    assert r.returncode == 0, r.stderr
    assert "held-out accuracy" in r.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["labels"] == ["neg", "pos"] and cfg["metrics"]["val_examples"] == 24
    assert cfg["metrics"]["val_accuracy"] >= 0.9
    model, tok = load_run(out)
    assert model.config.num_labels == 2 and model.config.pooler
    ids = torch.tensor(
        [tok.encode("the food was great and day too"), tok.encode("the food was awful and day too")]
    )
    assert model.classify(ids).argmax(-1).tolist() == [1, 0]
    r = cli("embed", out, "the food was great", "--pool", "cls")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 32


@pytest.mark.slow
def test_train_mlm_lowers_the_held_out_loss(cli, tmp_path):
    rng = random.Random(1)
    data = tmp_path / "text.txt"
    words = ["river", "bank", "water", "money", "the", "of", "flows", "holds"]
    data.write_text("\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(300)))
    out = tmp_path / "mlm"
    r = cli(
        "train",
        "--task",
        "mlm",
        "--data",
        data,
        "--tokenizer",
        "wordpiece",
        "--vocab-size",
        "60",
        "--out",
        out,
        "--max-iters",
        "80",
        "--eval-interval",
        "40",
        "--eval-iters",
        "4",
        *TINY,
    )
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["task"] == "mlm" and cfg["config"]["mlm_head"]
    # uniform guessing over the vocabulary costs ln(V); training must do clearly better
    assert cfg["metrics"]["val_loss"] < 0.8 * torch.log(torch.tensor(60.0)).item()
    model, tok = load_run(out)
    assert isinstance(model, Encoder) and model.mlm.decoder.weight is model.tok_embed.weight
    assert tok.tokens("the river")[0] == "[CLS]"
