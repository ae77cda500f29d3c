"""The notes, by hand (issue 29, item 5), through the real CLI: the word-level toy model, the
walk on hand-sized matrices, the what-ifs, similarity as dot products, and each decoder step's
attention over the source for an LSTM and a Transformer side by side.

Budgets are tiny: these check the mechanisms (the shapes, the identities, the refusals), not
the figures (docs/interpretability.md gives those with their commands)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
PHRASES = ROOT / "examples" / "phrases_en_es.tsv"
NOTES = ["--tokens", "Life is short, eat dessert first", "--m", "16", "--d-k", "24", "--d-v",
         "28", "--seed", "123"]  # fmt: skip
SEQ2SEQ = ["--task", "seq2seq", "--data", PHRASES, "--tokenizer", "word", "--batch-size", "8",
           "--max-iters", "4", "--eval-interval", "4", "--d-model", "16", "--quiet"]  # fmt: skip


def one_error_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), r.stderr
    return lines[0]


def fits_80(text: str) -> None:
    """What a pipe at 80 columns shows: no line past 80, none ending in a space."""
    for line in text.splitlines():
        assert len(line) <= 80, line
        assert line == line.rstrip(), repr(line)


@pytest.fixture(scope="module")
def words(cli, tmp_path_factory) -> Path:
    """A word-level toy GPT on the built-in sentences, trained 3 steps."""
    out = tmp_path_factory.mktemp("words") / "run"
    r = cli("train", "--data", "sentences", "--tokenizer", "word", "--preset", "toy",
            "--max-iters", "3", "--eval-iters", "1", "--quiet", "--out", out)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def pair(cli, tmp_path_factory) -> tuple[Path, Path]:
    """The phrase book: an LSTM with scaled-dot attention kept off <eos>, and a Transformer."""
    d = tmp_path_factory.mktemp("phrases")
    r = cli("train", *SEQ2SEQ, "--arch", "lstm-attention", "--score", "scaled-dot",
            "--no-attend-eos", "--out", d / "lstm")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = cli("train", *SEQ2SEQ, "--arch", "transformer", "--n-layer", "1", "--out", d / "tf")
    assert r.returncode == 0, r.stderr
    return d / "lstm", d / "tf"


# -- the word-level toy ---------------------------------------------------------------------------


def test_the_toy_reads_the_notes_sentence_as_five_words(cli, words):
    r = cli("attention", words, "I like to eat apples", "--layer", "1", "--head", "3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["queries"] == d["keys"] == ["I", "like", "to", "eat", "apples"]
    w = np.asarray(d["weights"])
    assert w.shape == (5, 5) and np.triu(w, 1).max() == 0.0
    cfg = json.loads((words / "config.json").read_text())
    assert cfg["config"]["n_layer"] == 2 and cfg["config"]["d_model"] == 64


# -- the walk -------------------------------------------------------------------------------------


def test_the_notes_six_by_sixteen_walk(cli):
    r = cli("walk", *NOTES, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    shape = {s["name"]: s["shape"] for s in d["steps"]}
    assert shape["X"] == [6, 16] and shape["Q"] == shape["K"] == [6, 24] and shape["V"] == [6, 28]
    assert shape["weights"] == [6, 6] and shape["z"] == [6, 28]
    assert d["tokens"] == ["Life", "is", "short,", "eat", "dessert", "first"]
    step = {s["name"]: s for s in d["steps"]}
    np.testing.assert_allclose(np.asarray(step["weights"]["values"]).sum(-1), 1.0, atol=1e-5)


def test_typed_and_pasted_matrices_and_a_file_back(cli, tmp_path):
    x = "I 1 0 1\nlike 0 2 0\napples 1 1 1\n"
    (tmp_path / "x.txt").write_text(x)
    r = cli("walk", "--x", tmp_path / "x.txt", "--wq", "1 0; 0 1; 1 1", "--wk", "[[1,0],[0,1],[1,0]]",
            "--wv", "1; 2; 3", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["inputs"]["tokens"] == ["I", "like", "apples"] and d["inputs"]["source"] == "given"
    step = {s["name"]: s for s in d["steps"]}
    np.testing.assert_allclose(step["Q"]["values"], [[2, 1], [0, 2], [2, 2]])
    assert step["z"]["shape"] == [3, 1]  # d_v = 1, d_k = 2
    (tmp_path / "m.json").write_text(r.stdout)
    again = cli("walk", "--matrices", tmp_path / "m.json", "--no-causal", "--json")
    assert json.loads(again.stdout)["inputs"]["X"] == d["inputs"]["X"]
    stdin = run_cli("walk", "--x", "-", "--json", input="1 2\n3 4\n")
    assert json.loads(stdin.stdout)["inputs"]["X"] == [[1, 2], [3, 4]]


@pytest.mark.parametrize("args, says", [
    (["--x", "1 2 3; 4 5 6", "--wq", "1 0; 0 1"], "X is 2 x 3 but W_Q is 2 x 2"),
    (["--x", "1 2; 3 4", "--wq", "1 0 1; 0 1 1", "--wk", "1 0; 0 1"],
     "W_Q is 2 x 3 and W_K is 2 x 2: Q K^T needs d_q = d_k"),
    (["--x", "1 2; 3"], "row 2 has 1 number, row 1 has 2"),
    (["--tokens", "a b", "--n", "3"], "--n 3, but --tokens gives 2 tokens"),
    (["--n", "300"], "--n must be at most 256"),
    (["--n", "2", "--temperature", "0"], "--temperature must be positive"),
    (["--x", "nofile.csv"], "no such file"),
    ([], "give X (--x)"),
])  # fmt: skip
def test_walk_refuses_in_one_line(cli, args, says):
    assert says in one_error_line(cli("walk", *args))


def test_walk_and_its_what_ifs_fit_80_columns(cli):
    for args in ([*NOTES], [*NOTES, "--what-if"], ["--tokens", "I like to eat apples", "--pad",
                                                    "2", "--no-causal", "--no-padding-mask"]):  # fmt: skip
        r = cli("walk", *args, env={"COLUMNS": "80"})
        assert r.returncode == 0, r.stderr
        fits_80(r.stdout)


def test_walk_what_if_json_names_each_change(cli):
    d = json.loads(cli("walk", "--tokens", "I like to eat apples", "--what-if", "--json").stdout)
    names = [c["name"] for c in d["changes"]]
    assert names == ["no_scale", "no_causal_mask", "temperature_flatter", "temperature_sharper",
                     "padding"]  # fmt: skip
    pad = d["changes"][-1]
    assert pad["cols"][:2] == ["<pad>", "<pad>"] and pad["weight_on_pads"] > 0


def test_the_workbench_walks_what_the_verb_walks(cli):
    """serve's by-hand panel and `attnlab walk` both call Run.walk: the same JSON for the same
    matrices; a size the typed W_Q already gives is not read (the page's cleared field is 0)."""
    from attnlab.serve import views

    params = {"hand_wq": "1 0; 0 1; 1 1", "hand_m": 0, "hand_seed": 5, "hand_causal": False}
    served = json.loads(views.walk(None, params, {}, "I like apples"))
    r = cli("walk", "--tokens", "I like apples", "--wq", "1 0; 0 1; 1 1", "--seed", "5",
            "--no-causal", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert served == json.loads(r.stdout)
    assert served["inputs"]["source"].startswith("X, W_K, W_V random")


# -- what-if on a run -----------------------------------------------------------------------------


def test_what_if_starts_from_the_heads_own_weights(cli, words):
    a = json.loads(cli("attention", words, "I like to eat apples", "--layer", "1", "--head", "2",
                       "--json").stdout)  # fmt: skip
    r = cli("what-if", words, "I like to eat apples", "--layer", "1", "--head", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    np.testing.assert_allclose(d["before"], a["weights"], atol=2e-4)  # both rounded
    assert d["about"]["kind"] == "gpt" and d["baseline"].endswith("causal mask")
    longer = json.loads(cli("what-if", words, "I like to eat apples", "--pad-text",
                            "I like to eat apples every day", "--json").stdout)  # fmt: skip
    assert longer["changes"][-1]["cols"][:2] == ["<pad>", "<pad>"]
    from attnlab.run import load_run

    py = load_run(words).what_if("I like to eat apples", layer=1, head=2).to_dict()
    assert py["before"] == d["before"] and py["changes"] == d["changes"]
    fits_80(cli("what-if", words, "I like to eat apples", env={"COLUMNS": "80"}).stdout)


def test_what_if_refuses_in_one_line(cli, words, pair):
    assert "records none" in one_error_line(cli("what-if", pair[0], "let's go"))
    assert "must be longer" in one_error_line(cli("what-if", words, "I like to eat apples",
                                                  "--pad-text", "I like"))  # fmt: skip
    assert "no head 9" in one_error_line(cli("what-if", words, "I like", "--head", "9"))
    assert "--temperature must be positive" in one_error_line(
        cli("what-if", words, "I like", "--temperature", "0"))  # fmt: skip


# -- similarity as dot products -------------------------------------------------------------------


def test_similarity_as_dot_products_and_cosines(cli, words):
    r = cli("similarity", words, "I like to eat apples", "--json")
    assert r.returncode == 0, r.stderr
    for ly in json.loads(r.stdout)["layers"]:
        for when in ("before", "after"):
            dot, cos = np.asarray(ly[f"dot_{when}"]), np.asarray(ly[when])
            norms = np.sqrt(np.diag(dot))
            np.testing.assert_allclose(dot / np.outer(norms, norms), cos, atol=2e-4)
    shown = cli("similarity", words, "I like to eat apples", "--measure", "dot",
                env={"COLUMNS": "80"})  # fmt: skip
    assert "mean dot product between different tokens" in shown.stdout
    fits_80(shown.stdout.split("mean dot product", 1)[1])  # the tables (the verb's own line
    # about the model is look.py's, shared by every look verb)


# -- the notes' "let's go" -> "vamos", LSTM and Transformer side by side --------------------------


def test_align_puts_the_lstm_and_the_transformer_side_by_side(cli, pair, tmp_path):
    lstm, tf = pair
    png = tmp_path / "align.png"
    r = cli("align", lstm, tf, "let's go", "--words", "--png", png, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    a, b = d["models"]
    assert a["about"]["kind"] == "lstm-attention" and b["about"]["kind"] == "seq2seq-transformer"
    for m in (a, b):
        assert m["source"] == ["let's", "go", "<eos>"] and m["tokens"] == ["let", "'", "s", "go",
                                                                           "<eos>"]  # fmt: skip
        assert m["steps"][0]["fed"] == "<bos>"
        for s in m["steps"]:
            assert sum(s["weights"]) == pytest.approx(1.0, abs=1e-4)
    # the mechanism: attention kept off <eos> falls on the words, every step
    assert all(s["weights"][2] == 0.0 for s in a["steps"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    fits_80(cli("align", lstm, tf, "let's go", env={"COLUMNS": "80"}).stdout)


def test_align_and_the_lstm_options_refuse_in_one_line(cli, words, pair, tmp_path):
    assert "no attention over a source" in one_error_line(cli("align", words, "I like"))
    assert "at most 8" in one_error_line(cli("align", *[pair[0]] * 9, "let's go"))
    assert "no layer 3 reads the source" in one_error_line(
        cli("align", pair[1], "let's go", "--layer", "3"))  # fmt: skip
    line = one_error_line(cli("train", *SEQ2SEQ, "--arch", "transformer", "--no-attend-eos",
                              "--out", tmp_path / "x"))  # fmt: skip
    assert "--arch lstm-attention only" in line
    assert not (tmp_path / "x").exists()


def test_the_workbench_aligns_what_the_verb_aligns(cli, pair):
    """serve's align panel and `attnlab align` both call Run.align: the same JSON."""
    from attnlab.run import load_run
    from attnlab.serve import views

    served = json.loads(views.align(load_run(pair[1]), {"align_words": True}, {}, "let's go"))
    r = cli("align", pair[1], "let's go", "--words", "--json")
    assert r.returncode == 0, r.stderr
    assert served == json.loads(r.stdout)
