"""Tokenizers: round trips on arbitrary text, clear errors, one saved format."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import (
    UNK,
    CharTokenizer,
    TokenizerError,
    WordTokenizer,
    build_tokenizer,
    tokenizer_from_json,
    train_bpe,
    wordpiece_vocab,
)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1))
def test_char_round_trip_on_any_unicode(text):
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text
    again = tokenizer_from_json(tok.to_json())
    assert again.encode(text) == tok.encode(text)


BPE = train_bpe(["The quick brown fox jumps over the lazy dog. " * 20], vocab_size=300)


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_byte_level_bpe_round_trip_on_any_unicode(text):
    assert BPE.decode(BPE.encode(text)) == text


def test_bpe_survives_its_json_format():
    text = "the lazy dog \u00e9\u6f22\U0001f600"
    again = tokenizer_from_json(BPE.to_json())
    assert again.encode(text) == BPE.encode(text) and again.decode(again.encode(text)) == text


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet="abc", min_size=1), st.text(alphabet="xyz\u00e9", min_size=1))
def test_unknown_characters_are_named(known, unknown):
    tok = CharTokenizer.from_text(known)
    with pytest.raises(TokenizerError) as err:
        tok.encode(known + unknown)
    for ch in set(unknown):
        assert repr(ch) in str(err.value)


def test_unknown_characters_map_to_unk_when_built_with_one():
    tok = CharTokenizer.from_text("abc", unk=True)
    ids = tok.encode("abz")
    assert ids[-1] == tok.unk_id and tok.decode(ids) == "ab" + UNK


def test_word_tokenizer_min_freq_and_unk():
    tok = WordTokenizer.from_text("the cat and the dog, the end.", min_freq=2)
    assert tok.decode(tok.encode("the cat")) == f"the {UNK}"
    assert build_tokenizer("word", "a b a").vocab_size == 3  # <unk>, a, b


# -- reproducible vocabularies ----------------------------------------------------------------

SRC = Path(__file__).resolve().parents[2] / "src"
# Every three-letter word over seven letters, once each (and capitalised, with punctuation):
# every pair of adjacent letters is equally frequent, so every merge is a tie.
TIES = " ".join(a + b + c for a in "abcdefg" for b in "abcdefg" for c in "abcdefg")
TIES = f"{TIES}\n{TIES.title()}, {TIES.upper()}!\n"
BUILD_ALL = """
import json, sys
from attnlab.tokenizers import build_tokenizer
text, out = sys.stdin.read(), {}
for kind in ("char", "word", "bpe", "wordpiece"):
    for encoder in (False, True) if kind != "wordpiece" else (True,):
        for size in (60, 120, 300):
            tok = build_tokenizer(kind, text, size, encoder=encoder)
            out[f"{kind} encoder={encoder} vocab={size}"] = tok.to_json()
print(json.dumps(out))
"""


def built_in_a_new_process(text: str, threads: int) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "RAYON_NUM_THREADS": str(threads),
           "PYTHONHASHSEED": str(threads)}  # fmt: skip
    r = subprocess.run([sys.executable, "-c", BUILD_ALL], input=text, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_tokenizer_kind_is_byte_identical_across_processes_and_thread_counts():
    """The same text and settings give the same tokenizer.json, whatever the process's hash
    seeds and the tokenizer library's thread count: with all merges tied, the library's
    WordPiece trainer gave a different vocabulary in every process."""
    one, two = built_in_a_new_process(TIES, 1), built_in_a_new_process(TIES, 2)
    assert len(one) == 21 and one.keys() == two.keys()
    differ = [name for name in one if one[name] != two[name]]
    assert not differ, f"built differently in two processes: {differ}"


def test_wordpiece_vocab_grows_by_the_most_frequent_pair_and_breaks_ties_by_its_strings():
    vocab = wordpiece_vocab({"xy": 2, "ab": 2, "abe": 3}, 20, ["[UNK]"])
    # specials, first letters, continuing letters (each sorted), then one token per merge:
    # a ##b (5 times), then ab ##e (3; ##b ##e was 3 too, but ab took its ##b), then x ##y (2)
    assert vocab == ["[UNK]", "a", "x", "##b", "##e", "##y", "ab", "abe", "xy"]
    assert wordpiece_vocab({"xy": 2, "ab": 2, "abe": 3}, 7, ["[UNK]"])[-1] == "ab"  # the size
    # a tie goes to the pair whose strings sort first, whatever the order of the words
    assert wordpiece_vocab({"xy": 1, "ab": 1}, 20)[-2:] == ["ab", "xy"]
    assert wordpiece_vocab({"ab": 1, "xy": 1}, 20)[-2:] == ["ab", "xy"]


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(alphabet="abcA#", min_size=1, max_size=6),
                       st.integers(1, 3), min_size=1, max_size=30),  # fmt: skip
       st.integers(5, 40), st.randoms())  # fmt: skip
def test_wordpiece_vocab_is_a_function_of_the_counts_not_their_order(counts, size, rng):
    words = list(counts)
    rng.shuffle(words)
    shuffled = {w: counts[w] for w in words}
    vocab = wordpiece_vocab(counts, size, ["[PAD]", "[UNK]"])
    assert vocab == wordpiece_vocab(shuffled, size, ["[PAD]", "[UNK]"])
    assert len(vocab) == len(set(vocab))


def wordpiece_by_the_definition(counts: dict[str, int], size: int) -> list[str]:
    """wordpiece_vocab the slow way: every pair counted again before each merge."""
    words = {w: [w[0]] + ["##" + c for c in w[1:]] for w in counts}
    vocab = sorted({w[0] for w in counts})
    vocab += sorted({t for s in words.values() for t in s[1:]})
    while len(vocab) < size:
        pairs: dict[tuple[str, str], int] = {}
        for w, symbols in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] = pairs.get(pair, 0) + counts[w]
        if not pairs:
            break
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        merged = a + b.removeprefix("##")
        vocab += [] if merged in vocab else [merged]
        for w, symbols in words.items():
            out, j = [], 0
            while j < len(symbols):
                if symbols[j : j + 2] == [a, b]:
                    out, j = [*out, merged], j + 2
                else:
                    out, j = [*out, symbols[j]], j + 1
            words[w] = out
    return vocab


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(alphabet="aab", min_size=1, max_size=8),
                       st.integers(1, 4), min_size=1, max_size=25),  # fmt: skip
       st.integers(2, 30))  # fmt: skip
def test_wordpiece_vocab_merges_as_its_definition_says(counts, size):
    """The counts kept up to date merge by merge give the vocabulary that counting every pair
    again before each merge gives (repeated letters: a a a -> aa a, one token by two paths)."""
    assert wordpiece_vocab(counts, size) == wordpiece_by_the_definition(counts, size)


def test_wordpiece_tokenizer_encodes_with_the_vocabulary_it_learned():
    rng = random.Random(0)
    text = " ".join(rng.choice(["the", "then", "there", "other", "these"]) for _ in range(200))
    tok = build_tokenizer("wordpiece", text, 30, encoder=True)
    assert tok.tok.encode("the other", add_special_tokens=False).tokens == ["the", "other"]
    assert tok.decode(tok.encode("there then")) == "[CLS] there then [SEP]"


def test_char_and_word_ids_are_their_sorted_strings():
    """The ids of char and word tokenizers (and so of every char run made before) are fixed."""
    assert build_tokenizer("char", "cab\n").itos == ["\n", "a", "b", "c"]
    assert build_tokenizer("word", "b a, b").itos == [UNK, ",", "a", "b"]
