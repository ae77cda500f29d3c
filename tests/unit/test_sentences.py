"""The built-in corpus ``sentences`` (attnlab.data.sentences): the shipped file is the
generator's text, it holds the notes' sentences, and the word tokenizer reads "I like to eat
apples" as the five words a person counts."""

from __future__ import annotations

from attnlab.data import open_corpus, sentences
from attnlab.tokenizers import build_tokenizer


def test_the_shipped_file_is_the_grammars_text():
    assert sentences.PATH.read_text(encoding="utf-8") == sentences.generate()


def test_it_holds_the_notes_sentences_and_its_grammar_agrees():
    text = open_corpus("sentences").read()
    lines = text.splitlines()
    assert len(lines) == sentences.N_SENTENCES
    for fixed in sentences.FIXED:
        assert fixed in lines
    for line in lines:  # a subject and its verb agree: "she likes", "they like"
        words = line.split()
        if words[0] in ("she", "he") and words[1] not in ("does",):
            assert words[1].endswith("s"), line
        if words[0] in ("I", "we", "they") and words[1] != "do":
            assert not words[1].endswith("s") or words[1] == "is", line


def test_the_word_tokenizer_reads_the_notes_sentence_as_five_known_words():
    tok = build_tokenizer("word", open_corpus("sentences").chunks())
    ids = tok.encode("I like to eat apples")
    assert tok.tokens("I like to eat apples") == ["I", "like", "to", "eat", "apples"]
    assert tok.unk_id not in ids and tok.vocab_size < 200
