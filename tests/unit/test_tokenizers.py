"""Tokenizers: round trips on arbitrary text, clear errors, one saved format."""

from __future__ import annotations

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
