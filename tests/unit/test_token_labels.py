"""Token labels are what the model saw, read from the ids, never the raw text (issue 24.12):
on a WordPiece vocabulary without emoji, an emoji is ``[UNK]``; byte-level BPE tokens read as
the text their bytes spell."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.rundir import save_model
from attnlab.tokenizers import train_bpe
from intervene_helpers import bert_mlm_run
from look_helpers import run_main

ACCENTED = "the café is naïve, the café is déjà vu. "


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    pytest.importorskip("transformers")
    return bert_mlm_run(tmp_path_factory.mktemp("labels"))


@pytest.fixture(scope="module")
def bpe_gpt(tmp_path_factory):
    """A GPT reading a byte-level BPE vocabulary that has learned the accented words."""
    tok = train_bpe([ACCENTED * 20], vocab_size=300)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16,
                          block_size=32, dropout=0.0)).eval()  # fmt: skip
    path = tmp_path_factory.mktemp("labels") / "bpe"
    save_model(path, model, tok)
    return path, tok


@pytest.mark.parametrize("verb", ["trace", "attention"])
def test_an_emoji_outside_a_wordpiece_vocabulary_is_labelled_unk(bert, capsys, verb):
    rc, out, err = run_main(capsys, verb, bert, "the 🙂 bank", "--json")
    assert rc == 0, err
    d = json.loads(out)
    seen = ["[CLS]", "the", "[UNK]", "bank", "[SEP]"]  # id 1 is [UNK] in this vocabulary
    for key in ("tokens", "queries", "keys"):
        assert d.get(key, seen) == seen, (key, d.get(key))
    rc, out, err = run_main(capsys, verb, bert, "the 🙂 bank")  # the terminal table too
    assert rc == 0 and "[UNK]" in out and "🙂" not in out.split("\n", 1)[1], out


def test_byte_level_labels_spell_the_accented_text_they_encode(bpe_gpt, capsys):
    path, tok = bpe_gpt
    text = "the café is déjà vu"
    labels = tok.tokens(text)
    assert "".join(labels) == text  # whole characters: no Ġ, no Ã©
    assert any("é" in t for t in labels) and not any("Ġ" in t or "Ã" in t for t in labels)
    rc, out, err = run_main(capsys, "trace", path, text, "--json")
    assert rc == 0, err
    assert json.loads(out)["tokens"] == labels


def test_a_character_split_across_byte_tokens_shows_its_bytes():
    tok = train_bpe(["abc "], vocab_size=260)  # no merge can make é: two byte tokens
    ids = tok.encode("é")
    assert len(ids) == 2 and tok.labels(ids) == ["\\xc3", "\\xa9"]


def test_every_character_shows_as_something_printable_and_distinct():
    """A byte-level token can be any byte (GPT-2, Llama 3 and Qwen vocabularies hold \\x00 to
    \\x1f as tokens): each shows as printable text, never as a control character a terminal
    cannot draw, and no two look the same."""
    from attnlab.render.display import show_token

    shown = {c: show_token(c) for c in map(chr, range(0x3000))}
    assert all(s.isprintable() and s for s in shown.values())
    controls = [shown[chr(i)] for i in (*range(0x20), 0x7F, 0x85, 0x200B)]
    assert len(set(controls)) == len(controls)
    assert shown[" "] == "␣" and shown["\n"] == "↵" and shown["\x10"] == "\\x10"


def test_the_plots_font_draws_every_control_token_label():
    """The heatmaps label their rows and columns with tokens: the labels of control tokens
    must be glyphs the plotting font has (its control pictures, such as ␐, it lacks)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from attnlab.render.plots import heatmap

    tokens = [chr(i) for i in (*range(0x20), 0x7F, 0x200B)]
    fig, ax = plt.subplots()
    try:
        heatmap(ax, np.eye(len(tokens)), tokens, tokens)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.canvas.draw()
    finally:
        plt.close(fig)
    missing = [str(w.message) for w in caught if "missing from font" in str(w.message)]
    assert not missing, missing[:3]
