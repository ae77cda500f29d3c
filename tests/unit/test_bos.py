"""A <bos> token (train --bos): the tokenizers that carry one, and the windows that read it.

A model trained with --bos reads <bos> first in every window, and every verb gives it <bos>
first (``encode`` puts it there); the corpus is encoded without it, and <bos> is never a
target. No other id changes, so a run's character ids are those of the same text without it.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import data
from attnlab.tokenizers import (
    BOS_TOKEN,
    CharTokenizer,
    TokenizerError,
    build_tokenizer,
    tokenizer_from_json,
    train_bpe,
    with_bos,
)

TEXT = "First Citizen: before we proceed any further, hear me speak.\n" * 8


@pytest.mark.parametrize("unk", [False, True])
def test_char_bos_comes_after_the_characters_and_reads_first(unk):
    plain = build_tokenizer("char", TEXT, unk=unk)
    tok = build_tokenizer("char", TEXT, unk=unk, bos=True)
    assert tok.bos_id == plain.vocab_size and tok.vocab_size == plain.vocab_size + 1
    ids = tok.encode("hear me")
    assert ids == [tok.bos_id, *plain.encode("hear me")]
    assert tok.encode("hear me", add_special_tokens=False) == plain.encode("hear me")
    assert tok.decode(ids) == "hear me"  # <bos> is not text
    assert tok.tokens("me") == [BOS_TOKEN, "m", "e"]
    assert tok.labels(ids)[0] == BOS_TOKEN
    assert tok.encode("", add_special_tokens=True) == [tok.bos_id]
    again = tokenizer_from_json(tok.to_json())
    assert again.bos_id == tok.bos_id and again.encode("hear me") == ids
    assert "bos" not in plain.to_json()  # a run without it writes the file it always did


def test_typed_bos_is_characters_to_the_char_tokenizer():
    tok = build_tokenizer("char", TEXT + "<bos>", bos=True)
    ids = tok.encode("<bos>", add_special_tokens=False)
    assert len(ids) == 5 and tok.bos_id not in ids


def test_bpe_bos_is_a_special_token_its_template_puts_first():
    plain = train_bpe([TEXT], vocab_size=300)
    before = plain.to_json()
    tok = with_bos(plain)
    assert plain.to_json() == before and plain.bos_id is None  # the cached one is not changed
    assert tok.bos_id == plain.vocab_size and tok.tok.id_to_token(tok.bos_id) == BOS_TOKEN
    bare = plain.encode("hear me speak")
    assert tok.encode("hear me speak") == [tok.bos_id, *bare]
    assert tok.encode("hear me speak", add_special_tokens=False) == bare
    assert tok.decode(tok.encode("hear me speak")) == "hear me speak"
    assert tokenizer_from_json(tok.to_json()).bos_id == tok.bos_id  # read from the template
    assert with_bos(tok) is tok


def test_bos_is_refused_where_it_means_nothing():
    with pytest.raises(TokenizerError, match="char and bpe"):
        build_tokenizer("word", TEXT, bos=True)
    with pytest.raises(TokenizerError, match="char and bpe"):
        with_bos(build_tokenizer("bpe", TEXT, vocab_size=300, encoder=True))  # [CLS] ... [SEP]


def test_windows_read_bos_first_and_never_predict_it():
    tokens = np.arange(100, 160, dtype=np.int64)
    starts = np.array([0, 7, 40])
    x, y = data.windows(tokens, starts, 8, bos=1)
    assert x.shape == y.shape == (3, 8)
    assert (x[:, 0] == 1).all() and not (y == 1).any()
    assert x[1].tolist() == [1, *range(107, 114)] and y[1].tolist() == list(range(107, 115))
    x0, y0 = data.windows(tokens, starts, 8)
    assert (x0[:, 0] != 1).all() and y0[1].tolist() == list(range(108, 116))


def test_eval_windows_with_bos_score_the_same_tokens():
    tokens = np.arange(1000, 1203, dtype=np.int64)
    plain = [y for _, y in data.sequential_batches(tokens, 16, 4)]
    framed = list(data.sequential_batches(tokens, 16, 4, bos=7))
    assert all((x[:, 0] == 7).all() for x, _ in framed)
    assert [y.tolist() for _, y in framed] == [y.tolist() for y in plain]


@pytest.mark.parametrize("source", [data.RandomWindows, data.EpochWindows])
def test_training_windows_start_with_bos(source):
    tokens = np.arange(2, 500, dtype=np.int64)
    x, y = next(source(tokens, 16, 6, seed=3, bos=1))
    assert (x[:, 0] == 1).all() and (x[:, 1:] == y[:, :-1]).all() and not (y == 1).any()


def test_a_char_run_without_bos_reads_no_bos():
    assert CharTokenizer.from_text(TEXT).bos_id is None
