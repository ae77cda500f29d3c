"""Generated seq2seq tasks, TSV corpora, the pair tokenizer and batching."""

from __future__ import annotations

import datetime as dt
import importlib
import random
from pathlib import Path

import pytest
from dateutil import parser as dateparser

from attnlab.data import tasks
from attnlab.data.tasks import (
    DataError,
    collate,
    encode_pairs,
    format_date,
    generate,
    load_tsv,
    ordinal,
    rebuild,
)
from attnlab.tasks.seq2seq import pair_tokenizer
from attnlab.tokenizers import PairTokenizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "phrases_en_es.tsv"
SMALL = "n_train=300,n_val=50,n_test=50"


def test_tasks_module_imports_as_part_of_the_data_package():
    assert importlib.import_module("attnlab.data.tasks") is tasks


@pytest.mark.parametrize("name", tasks.TASKS)
def test_generation_is_deterministic_and_seeded(name):
    a, b = generate(f"{name}:{SMALL}", seed=3), generate(f"{name}:{SMALL}", seed=3)
    assert (a.train, a.val, a.test) == (b.train, b.val, b.test)
    c = generate(f"{name}:{SMALL}", seed=4)
    assert a.test != c.test
    assert (len(a.train), len(a.val), len(a.test)) == (300, 50, 50)


@pytest.mark.parametrize("name", tasks.TASKS)
def test_splits_share_no_source(name):
    d = generate(f"{name}:{SMALL}", seed=random.randrange(10**6))
    train, val, test = ({s for s, _ in split} for split in (d.train, d.val, d.test))
    assert len(train) == len(d.train) and not (train & val or train & test or val & test)
    if name == "dates":  # stricter: no DATE in the test split was seen in training at all
        assert not {t for _, t in d.train} & {t for _, t in d.test}


def test_string_tasks_and_addition_targets_are_right():
    seed = random.randrange(10**6)
    for s, t in generate("copy:min_len=2,max_len=30", seed).train[:2000]:
        assert t == s and 2 <= len(s) <= 30
    for s, t in generate("reverse", seed).test:
        assert t == "".join(reversed(s))
    for s, t in generate("sort:symbols=5", seed).test:
        assert list(t) == sorted(s) and set(s) <= set("abcde")
    for s, t in generate("addition:digits=3", seed).test:
        a, b = s.split("+")
        assert int(t) == int(a) + int(b) and max(len(a), len(b)) <= 3


def test_every_generated_date_parses_back_to_its_target():
    """An independent parser (dateutil) reads each source as the ISO date it is paired with;
    a weekday, when present, is the right one."""
    rng = random.Random()
    d = generate("dates:n_train=2000,n_val=10,n_test=10", seed=rng.randrange(10**6))
    weekdays = [dt.date(2024, 1, 1 + i).strftime("%A").lower() for i in range(7)]  # monday first
    checked_weekdays = 0
    for source, target in d.train:
        dayfirst = "." in source  # dots are day.month.year; slashes month/day/year
        parsed = dateparser.parse(source, fuzzy=True, dayfirst=dayfirst).date()
        assert parsed.isoformat() == target, source
        first = source.lower().replace(",", " ").split()[0]
        named = [i for i, w in enumerate(weekdays) if first in (w, w[:3])]
        if named:
            assert named == [parsed.weekday()], source
            checked_weekdays += 1
    assert checked_weekdays > 200


def test_date_formats_include_the_issue_example():
    date = dt.date(2026, 11, 21)
    seen = {format_date(date, random.Random(i)).lower() for i in range(400)}
    assert "saturday 21 nov 2026" in seen
    assert {"21.11.2026", "11/21/2026", "2026/11/21"} <= seen
    days = (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)
    assert " ".join(map(ordinal, days)) == "1st 2nd 3rd 4th 11th 12th 13th 21st 22nd 23rd 31st"


@pytest.mark.parametrize(
    "spec",
    ["nope", "copy:min_len=0", "copy:size=3", "reverse:max_len=x", "dates:start=2000,end=1999"],
)
def test_bad_specs_are_data_errors(spec):
    with pytest.raises(DataError):
        generate(spec)


def test_too_many_examples_for_the_space_is_a_data_error():
    with pytest.raises(DataError):
        generate("copy:min_len=1,max_len=1,symbols=2,n_train=10")


def test_tsv_split_is_seeded_and_disjoint(tmp_path):
    d = load_tsv(EXAMPLE, seed=7)
    assert ("let's go", "vamos") in d.train + d.val + d.test
    assert load_tsv(EXAMPLE, seed=7).test == d.test and load_tsv(EXAMPLE, seed=8).test != d.test
    train, test = {s for s, _ in d.train}, {s for s, _ in d.test}
    assert not train & test and len(d.train) + len(d.val) + len(d.test) >= 250
    assert rebuild(d.recipe).test == d.test


def test_tsv_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nc\td\nno tab here\ne\tf\n", encoding="utf-8")
    with pytest.raises(DataError, match="bad.tsv:3"):
        load_tsv(bad)
    few = tmp_path / "few.tsv"
    few.write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(DataError):
        load_tsv(few)


def test_rebuild_refuses_a_changed_tsv(tmp_path):
    f = tmp_path / "c.tsv"
    f.write_text("".join(f"s{i}\tt{i}\n" for i in range(30)), encoding="utf-8")
    d = load_tsv(f)
    f.write_text(f.read_text(encoding="utf-8") + "extra\tline\n", encoding="utf-8")
    with pytest.raises(DataError, match="changed"):
        rebuild(d.recipe)


@pytest.mark.parametrize("kinds", [("char", "char"), ("word", "word"), ("word", "bpe")])
def test_pair_tokenizer_round_trips_the_corpus(kinds):
    d = load_tsv(EXAMPLE)
    tok = pair_tokenizer(d, *kinds, vocab_size=300)
    for s, t in d.train[:50]:
        ids = tok.encode_target(t)
        assert min(ids) >= 3 and tok.decode_target([*ids, PairTokenizer.EOS, 7]) == t
        src = tok.encode_source(s)
        assert min(src[:-1]) >= 3 and src[-1] == PairTokenizer.EOS
        assert tok.decode_source(src) == tok.source.decode(tok.source.encode(s))


def test_collate_shifts_the_target_right_behind_bos():
    d = generate(f"reverse:{SMALL}")
    tok = pair_tokenizer(d)
    examples = encode_pairs(tok, d.train[:8])
    src, tgt_in, tgt_out = collate(examples)
    assert src.shape[0] == tgt_in.shape[0] == 8 and tgt_in.shape == tgt_out.shape
    for i, (s, t) in enumerate(examples):
        assert src[i, : len(s)].tolist() == s and set(src[i, len(s) :].tolist()) <= {0}
        assert tgt_out[i, : len(t)].tolist() == t and t[-1] == PairTokenizer.EOS
        assert tgt_in[i, 0] == PairTokenizer.BOS and tgt_in[i, 1 : len(t)].tolist() == t[:-1]
