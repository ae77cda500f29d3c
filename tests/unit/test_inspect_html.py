"""What a notebook shows (``_repr_html_``): heatmap tables labelled with the tokens, escaped, with
spaces made visible, and never an ANSI escape code. Checked by parsing the HTML."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.inspect import (
    attention,
    attention_grid,
    check,
    influence,
    record,
    similarity,
    trace,
)
from attnlab.render.display import show_token
from attnlab.tokenizers import CharTokenizer
from html_helpers import ANSI, Page, texts
from look_helpers import CORPUS as TRAINING_TEXT
from look_helpers import tiny_gpt, train_briefly

# characters HTML must escape, a space and a tab: each a token of its own
CORPUS = "a <b> & 'c' \"d\" e\tf. " * 4
ALLOWED_TAGS = {"div", "b", "i", "table", "tr", "th", "td", "code", "pre", "img", "h4", "p", "br"}


def check_heatmap(table, rows, cols, values: np.ndarray, digits=2, col_tokens=True):
    """The table is cols as a header, then one row per label with its values, to ``digits``."""
    assert texts(table[0]) == ["", *[show_token(c) if col_tokens else c for c in cols]]
    assert len(table) == len(rows) + 1
    for i, tr in enumerate(table[1:]):
        assert tr[0]["tag"] == "th" and tr[0]["text"] == show_token(rows[i])
        cells = [c for c in tr[1:] if c["tag"] == "td"]
        assert len(cells) == len(cols)
        got = np.array([float(c["text"]) for c in cells])
        np.testing.assert_allclose(got, values[i], atol=0.51 * 10**-digits)


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    tok = CharTokenizer.from_text(CORPUS + TRAINING_TEXT)
    return train_briefly(tiny_gpt(tok, block_size=32), tok, steps=30), tok


def random_text(seed: int, n: int = 12) -> str:
    rng = np.random.default_rng(seed)
    chars = sorted(set(CORPUS))
    return "".join(rng.choice(chars, n))


@pytest.mark.parametrize("seed", range(4))
def test_an_attention_map_is_a_heatmap_table_of_escaped_visible_tokens(gpt, seed):
    model, tok = gpt
    text = random_text(seed) + " <&"  # a space and the characters HTML must escape, at least
    rec = record(model, tok, text)
    layer, head = seed % 2, (seed // 2) % 2
    m = attention(rec, layer=layer, head=head)
    page = Page(m._repr_html_())
    assert set(page.tags) <= ALLOWED_TAGS  # "<b>" in the text is text, not a tag
    assert len(page.tables) == 1
    check_heatmap(page.tables[0], list(text), list(text), m.weights)
    header = texts(page.tables[0][0])
    assert "␣" in header and "<" in header and "&" in header and " " not in "".join(header)


def test_a_recording_shows_its_tokens_and_its_maps(gpt):
    model, tok = gpt
    text = "a <b> & e"
    rec = record(model, tok, text)
    page = Page(rec._repr_html_())
    tokens, maps = page.tables
    assert texts(tokens[0]) == ["", *map(str, range(len(text)))]
    assert texts(tokens[1]) == ["tokens", *[show_token(c) for c in text]]
    assert [r[0]["text"] for r in maps[1:]] == rec.map_names()
    assert all(texts(r)[2:] == ["2", f"{len(text)} x {len(text)}"] for r in maps[1:])


def test_a_trace_shows_its_token_by_token_steps_as_labelled_heatmaps(gpt):
    model, tok = gpt
    text = "a <b> &"
    t = trace(model, tok, text)
    page = Page(t._repr_html_())
    square = [tb for tb in page.tables if len(tb) == len(text) + 1]
    weights = t.step("weights").value
    assert any(
        texts(tb[0])[1:] == [show_token(c) for c in text]
        and np.allclose([float(x) for x in texts(tb[1])[1:2]], weights[0, :1], atol=0.006)
        for tb in square
    )


def test_similarity_shows_before_and_after_each_block(gpt):
    model, tok = gpt
    text = "e & d"
    s = similarity(record(model, tok, text))
    page = Page(s._repr_html_())
    assert len(page.tables) == 2 * len(s.layers)
    for k, ly in enumerate(s.layers):
        check_heatmap(page.tables[2 * k], list(text), list(text), ly.before)
        check_heatmap(page.tables[2 * k + 1], list(text), list(text), ly.after)


def test_influence_shows_the_change_heatmap_and_the_ranked_table(gpt):
    model, tok = gpt
    text = "a <b> & e"
    inf = influence(model, record(model, tok, text), top=5)
    heat, ranked = Page(inf._repr_html_()).tables
    assert texts(heat[0]) == ["", *inf.layers]  # layer labels as they are, not as tokens
    check_heatmap(heat, list(text), inf.layers, inf.matrix().T, digits=3, col_tokens=False)
    header = texts(ranked[0])
    assert header[:5] == ["layer", "pos", "token", "context", "rel change"]
    assert len(ranked) == 1 + 5
    for tr, r in zip(ranked[1:], inf.rows):
        layer, pos, token, moved, rel = texts(tr)[:5]
        assert (layer, int(pos), token) == (r.layer, r.position, show_token(r.token))
        assert float(moved) == pytest.approx(r.context, abs=5e-4)
        assert float(rel) == pytest.approx(r.rel_change, abs=5e-4)


def test_the_check_report_is_a_table_of_results(gpt):
    model, _ = gpt
    report = check(model)
    (table,) = Page(report._repr_html_()).tables
    assert texts(table[0]) == ["check", "result", "difference", "tolerance", "detail"]
    assert [(r[0]["text"], r[1]["text"]) for r in table[1:]] == [
        (r.name, r.status) for r in report.results
    ]


def test_a_run_shows_its_path_kind_and_size(tmp_path):
    from attnlab.run import load_run
    from look_helpers import make_run

    make_run(tmp_path / "r", steps=2)
    run = load_run(tmp_path / "r")
    (table,) = Page(run._repr_html_()).tables
    rows = {r[0]["text"]: r[1]["text"] for r in table[1:]}
    assert rows["path"] == str(tmp_path / "r") and rows["kind"] == "gpt"
    assert int(rows["parameters"].replace(",", "")) == sum(
        p.numel() for p in run.model.parameters()
    )


def test_cross_attention_is_labelled_by_output_rows_and_source_columns():
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
    from attnlab.tokenizers import PairTokenizer

    torch.manual_seed(0)
    tok = PairTokenizer(CharTokenizer("abc <>&"), CharTokenizer("0123"))
    model = Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=tok.src_vocab_size,
                                             tgt_vocab_size=tok.tgt_vocab_size, max_len=16,
                                             d_model=16, n_head=2, dropout=0.0)).eval()  # fmt: skip
    rec = record(model, tok, "a <b>")
    m = attention(rec, name="cross", head=1)
    (table,) = Page(m._repr_html_()).tables
    check_heatmap(table, rec.tokens["decoder"], rec.tokens["encoder"], m.weights)


def test_no_ansi_codes_even_when_the_environment_forces_colour(gpt, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    model, tok = gpt
    text = "a <b> & e"
    rec = record(model, tok, text)
    results = [attention(rec), trace(model, tok, text, rec=rec), similarity(rec),
               influence(model, rec), check(model), attention_grid(rec)]  # fmt: skip
    for r in results:
        assert ANSI not in r._repr_html_(), type(r).__name__
        assert ANSI not in str(r), type(r).__name__
    assert ANSI not in rec._repr_html_()
