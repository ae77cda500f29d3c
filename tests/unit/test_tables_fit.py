"""Every terminal table fits the terminal it is printed to (issue 24, "Tables that fit").

Each verb that prints a table is run in this process (``attnlab.cli.main``, stdout captured,
``COLUMNS`` set) on a tiny random run of every kind it applies to, with a short text and a long
one (40-odd tokens, long words), at 60, 80 and 120 columns. In every output: no line is wider
than the terminal, nothing is cut to an ellipsis, every query token of the attention matrix
labels a row in full, and the cells of that row are numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.cells import cell_len

from attnlab.render.display import console, matrix_table, show_token
from attnlab.render.tables import FitTable, number
from attnlab.rundir import save_model
from intervene_helpers import perturb, rnn_run, seq2seq_run, vit_run
from look_helpers import make_run

WIDTHS = (60, 80, 120)
LONG_WORDS = ["internationalisation", "counterrevolutionaries", "incomprehensibilities", "the",
              "bank", "of", "the", "river", "is", "green", "and", "deep", "water", "went", "by",
              "us"]  # fmt: skip


def _word_text(n: int) -> str:
    return " ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(n))


# ---------------------------------------------------------------------------------------------
# tiny runs of every kind, built once
# ---------------------------------------------------------------------------------------------


def _word_gpt(path: Path) -> Path:
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.tokenizers import WordTokenizer

    tok = WordTokenizer.from_text(" ".join(LONG_WORDS))
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, d_model=16, block_size=64)
    save_model(path, perturb(GPT(cfg).eval()), tok)
    return path


def _classifier(path: Path) -> Path:
    from attnlab.models.encoder import Encoder, EncoderConfig
    from attnlab.tokenizers import WordTokenizer

    tok = WordTokenizer.from_text(" ".join(LONG_WORDS))
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, d_model=16, num_labels=3,
                        pooler=True, dropout=0.0, block_size=64)  # fmt: skip
    # "data" as training records it (with none, a cwd holding image folders reads as images)
    save_model(path, perturb(Encoder(cfg).eval(), 0.3), tok,
               {"labels": ["neg", "neu", "pos"], "task": "classify",
                "task_options": {"data": "labels.tsv"}})  # fmt: skip
    return path


def _mlm(path: Path) -> Path:
    pytest.importorskip("transformers")
    from intervene_helpers import bert_mlm_run

    return bert_mlm_run(path)


CHARS = "I like to eat apples. You like to eat pears. The bank of the river is green."
BERT = "the bank of the river is green deep water went to the money a i we sat by"
PAIRS = "abcdefghijklmnopqrstuvwxyz 0123456789-"
# kind -> (how to build it, short text, long text)
KINDS = {
    "gpt": (lambda p: make_run(p, steps=5)[0], "I like to eat apples", CHARS[:46]),
    "gpt-words": (_word_gpt, "the bank of the river", _word_text(40)),
    "mlm": (_mlm, "the [MASK] of the river", " ".join((BERT.split() * 2)[:29])),
    "classifier": (_classifier, "the river is green", _word_text(40)),
    "seq2seq": (seq2seq_run, "abcd", (PAIRS * 2)[:44]),
    "lstm-attention": (rnn_run, "abcd", (PAIRS * 2)[:44]),
    "vit": (vit_run, "test:0", "test:1"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = {}
    for kind, (build, _, _) in KINDS.items():
        if kind == "vit":
            pytest.importorskip("sklearn")
        out[kind] = build(tmp_path_factory.mktemp(kind) / "run")
        if isinstance(out[kind], tuple):
            out[kind] = out[kind][0]
    return out


def attnlab(capsys, monkeypatch, width: int, *args) -> tuple[int, str, str]:
    from attnlab.cli import main

    monkeypatch.setenv("COLUMNS", str(width))
    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


class _Printed:
    """What a verb printed through ``display.console()``, to lay out again at any width: the
    verb runs once, its tables are rendered at 60, 80 and 120 columns."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        return self

    def print(self, *objects, **kwargs):
        self.calls.append((objects, kwargs))

    def at(self, width: int) -> str:
        import io

        buf = io.StringIO()
        out = console(buf, width=width, plain=True)
        for objects, kwargs in self.calls:
            out.print(*objects, **kwargs)
        return buf.getvalue()


def attnlab_at_widths(capsys, monkeypatch, *args) -> tuple[int, dict[int, str], str]:
    """Run a verb once; its output laid out at each width of WIDTHS (``print``ed lines, which
    are not tables, as they came)."""
    printed = _Printed()
    monkeypatch.setattr("attnlab.render.display.console", printed)
    try:
        code, out, err = attnlab(capsys, monkeypatch, 100, *args)
    finally:
        monkeypatch.undo()
    return code, {w: out + printed.at(w) for w in WIDTHS}, err


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def assert_fits(out: str, width: int, what: str) -> None:
    assert "…" not in out, f"{what}: an ellipsis\n{out}"
    for line in out.splitlines():
        assert cell_len(line) <= width, f"{what}: {cell_len(line)} > {width}: {line!r}"


def assert_rows(out: str, labels: list[str], what: str) -> None:
    """Every label starts a line whose other cells are all numbers (a row of a matrix)."""
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 2 and all(_is_number(x) for x in f[1:]):
            rows.setdefault(f[0], 0)
            rows[f[0]] += 1
    missing = [lab for lab in map(show_token, labels) if lab not in rows]
    assert not missing, f"{what}: rows {missing} not labelled in full\n{out}"


# the verbs, as (name, arguments after RUN) for a text; the kinds each applies to
def commands(kind: str, text: str) -> list[tuple[str, list]]:
    lstm = kind == "lstm-attention"
    head = ["--layer", 0, "--head", 0] if lstm else ["--layer", 1, "--head", 1]
    return [
        ("trace", ["trace", text]),
        ("attention", ["attention", text, *head]),
        ("attention --start", ["attention", text, "--start", 3]),
        ("similarity", ["similarity", text]),
        ("influence", ["influence", text]),
        ("lens", ["lens", text]),
        ("attribute rollout", ["attribute", text, "--method", "rollout"]),
        ("attribute flow", ["attribute", text, "--method", "flow"]),
        ("ablate", ["ablate", text, *(["--context"] if lstm else ["--head", "0.0"])]),
        ("predict", ["predict", text]),
    ]


MUST = {  # what has to print a table on each kind (the rest may refuse, in one line)
    "trace": set(KINDS),
    "attention": set(KINDS),
    "similarity": set(KINDS) - {"lstm-attention"},
    "lens": {"gpt", "gpt-words", "mlm", "classifier"},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_table_fits_at_60_80_and_120_columns(kind, runs, capsys, monkeypatch):
    run = runs[kind]
    printed = set()
    for text in KINDS[kind][1:]:
        code, out, _ = attnlab(capsys, monkeypatch, 80, "attention", run, text, "--json")
        assert code == 0, out
        queries = json.loads(out)["queries"]
        for name, args in commands(kind, text):
            code, outs, err = attnlab_at_widths(capsys, monkeypatch, args[0], run, *args[1:])
            if code != 0:
                assert code == 2 and len(err.strip().splitlines()) == 1, (kind, name, text, err)
                continue
            printed.add(name)
            for width, out in outs.items():
                what = f"{kind} {name} {text[:20]!r} at {width}"
                if name == "predict":  # an answer in lines of text, not a table: whole
                    assert "…" not in out, (what, out)
                    continue
                assert_fits(out, width, what)
                matrix = name in ("attention", "similarity") or (name == "trace" and "Q K^T" in out)
                # an encoder-decoder's trace and similarity also show the decoder's tokens
                if matrix and (kind not in ("seq2seq", "lstm-attention") or name == "attention"):
                    # trace prints the first 32 queries of each matrix (--json has all)
                    assert_rows(out, queries[:32] if name == "trace" else queries, what)
    for name, kinds in MUST.items():
        assert kind not in kinds or name in printed, f"{name} printed nothing on {kind}"


def test_check_heads_and_patch_fit(runs, capsys, monkeypatch):
    calls = [(kind, [verb, runs[kind]]) for kind in ("gpt", "mlm", "classifier", "seq2seq", "vit")
             for verb in ("check", "heads")]  # fmt: skip
    calls.append(("gpt", ["patch", runs["gpt"], "--clean", CHARS[:40], "--corrupt",
                          CHARS[1:41], "--target", "e"]))  # fmt: skip
    calls.append(("gpt", ["patch", runs["gpt"], "--clean", CHARS[:40], "--corrupt",
                          CHARS[1:41], "--target", "e", "--by", "head"]))  # fmt: skip
    shown = 0
    for kind, args in calls:
        code, outs, err = attnlab_at_widths(capsys, monkeypatch, *args)
        if code == 2:  # refused, in one line (heads of a model it cannot probe)
            assert len(err.strip().splitlines()) == 1, err
            continue
        shown += 1
        for width, out in outs.items():
            assert_fits(out, width, f"{kind} {args[0]} at {width}")
    assert shown >= 8


# ---------------------------------------------------------------------------------------------
# the layout itself
# ---------------------------------------------------------------------------------------------


def _render(renderable, width: int) -> str:
    import io

    buf = io.StringIO()
    console(buf, width=width, plain=True).print(renderable)
    return buf.getvalue()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", [3, 20, 45])
def test_a_matrix_pages_its_columns_and_keeps_every_label_and_number_whole(width, n):
    rng = np.random.default_rng(n)
    labels = [LONG_WORDS[i % len(LONG_WORDS)] for i in range(n)]
    m = rng.normal(size=(n, n)) * 3
    m[0, 1] = -np.inf
    out = _render(matrix_table(m, labels, labels, "scores", max_lines=10_000), width)
    assert_fits(out, width, f"{n} at {width}")
    assert_rows(out, labels, f"{n} at {width}")
    shown = [float(x) for line in out.splitlines() for x in line.split()[1:]
             if len(line.split()) > 1 and all(_is_number(y) for y in line.split()[1:])]  # fmt: skip
    assert len(shown) == n * n  # every value, once, on some page


def test_a_matrix_past_its_budget_names_the_option_that_shows_the_rest():
    m = np.zeros((40, 40))
    labels = [f"t{i}" for i in range(40)]
    out = _render(matrix_table(m, labels, labels, more="--start {next} shows more",
                               col_name="keys", row_name="queries"), 80)  # fmt: skip
    last = out.strip().splitlines()[-1]
    assert last.startswith("keys 0..") and "of 40 shown" in last and "queries" not in last, last
    k = int(last.split("keys 0..")[1].split()[0])
    assert k < 39 and f"--start {k + 1} shows more" in last
    shifted = _render(matrix_table(m, labels, labels, start=k + 1), 80)
    assert shifted.splitlines()[0] == f"columns {k + 1}..39"  # the page says where it starts
    assert shifted.splitlines()[1].split()[0] == f"t{k + 1}"  # the first key column shown
    rows = _render(matrix_table(m[:, :3], labels, labels[:3], limit=32, row_name="queries"), 80)
    assert rows.strip().splitlines()[-1] == (
        "columns 0..2 of 3, queries 0..31 of 40 shown; --json has every value"
    )


def test_a_table_wraps_free_text_and_pages_the_rest():
    t = FitTable(title="a long title " * 8)
    t.add_column("name")
    for i in range(12):
        t.add_column(f"score {i}", justify="right")
    t.add_column("detail", wrap=True)
    t.add_row("counterrevolutionaries", *[f"{i / 7:.4f}" for i in range(12)], "word " * 30)
    for width in WIDTHS:
        out = _render(t, width)
        assert_fits(out, width, f"table at {width}")
        assert out.count("counterrevolutionaries") >= 2 if width < 120 else True
        for i in range(12):
            assert f"{i / 7:.4f}" in out


def test_numbers_drop_only_their_leading_zero():
    assert number(0.421, 2) == "0.42" and number(0.421, 2, compact=True) == ".42"
    assert number(-0.07, 2, compact=True) == "-.07" and number(-0.001, 2) == "0.00"
    assert number(12.5, 1, compact=True) == "12.5" and number(0.5, 3, sign=True) == "+0.500"
    assert number(float("-inf"), 2) == "-inf" and float(number(0.5, 2, True, True)) == 0.5


def test_not_a_terminal_is_100_columns_unless_columns_says(monkeypatch):
    import io

    monkeypatch.delenv("COLUMNS", raising=False)
    assert console(io.StringIO()).width == 100
    monkeypatch.setenv("COLUMNS", "72")
    assert console(io.StringIO()).width == 72


@pytest.mark.parametrize("n", [3, 12])
def test_evals_confusion_matrix_fits(n):
    from attnlab.evaluation import Evaluation, Figure
    from attnlab.metrics import classification_report

    rng = np.random.default_rng(n)
    classes = [f"class{i}" if i % 3 else f"a_long_class_name_{i}" for i in range(n)]
    confusion = rng.integers(0, 1500, size=(n, n))
    report = classification_report(confusion, classes)
    ev = Evaluation("classify", "a test file", [Figure("accuracy", "accuracy", 0.5, "%")], report)
    for width in WIDTHS:
        out = _render(ev, width)
        assert_fits(out, width, f"eval of {n} classes at {width}")
        assert "confusion matrix (row = true class, column = predicted)" in out
        assert_rows(out, classes, f"eval of {n} classes at {width}")
        counts = [int(x) for line in out.splitlines() for x in line.split()[1:]
                  if line.split()[:1] and line.split()[0] in classes
                  and all(y.isdigit() for y in line.split()[1:])]  # fmt: skip
        assert sorted(counts) == sorted(confusion.ravel().tolist())  # every count, once


def test_timelines_table_fits():
    from attnlab.inspect.timeline import FIGURE_SCORES, Timeline

    steps = [0, 500, 1000, 150000]
    heads = [{"name": f"decoder layer {i // 4}.{i % 4}", "layer": i // 4, "head": i % 4, "map": "m",
              "scores": {s: [0.1, 0.2, 0.5, 0.9 - i / 100] for s in FIGURE_SCORES},
              "fastest_rise": {s: {"step": 150000, "from": 0.1, "to": 0.9}
                               for s in FIGURE_SCORES}}
             for i in range(12)]  # fmt: skip
    tl = Timeline("runs/a-long-run-name", steps, 500, heads, {}, [], [])
    for width in WIDTHS:
        out = _render(tl, width)
        assert_fits(out, width, f"timeline at {width}")
        for h in heads:
            assert out.count(h["name"]) >= 1
        assert out.count("150000") >= 12 * len(FIGURE_SCORES)  # every "rose at" cell, whole
