"""Cutting text into pieces whose encodings, put end to end, are the encoding of the whole text,
and encoding those pieces into arrays of token ids quickly.

A tokenizer that splits text into words before anything else (char, word and byte-level BPE
all do) cannot join characters that lie in different words. So a cut is *safe* where no
pre-token of the whole text can straddle it, and then

    encode(text) == encode(text[:cut]) + encode(text[cut:])

Two kinds of cut are safe for attnlab's char, word and byte-level BPE tokenizers (whose BPE
pre-tokenizer is GPT-2's regex, ``'s|...| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``):

- just after a line break that has a non-space character on each side (``...x\\n|Y...``):
  ``\\n`` alone is a whole pre-token there, with or without what follows it. A run of two
  blank characters is not safe: ``\\s+(?!\\S)`` splits ``"\\n\\n"`` differently at the end of a
  string than before a letter.
- just before a single space between two non-space characters (``...x| Y...``): the space
  starts the next word's pre-token (``" Y"``) in both cases.

Text with neither kind of cut for ``MAX_PIECE_CHARS`` characters (a single enormous line with
no single spaces) is cut there anyway; only at such a forced cut can the pieces' tokens differ
from the whole text's. ``tests/integration/test_shards.py`` checks the equality on random text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from attnlab.tokenizers import CharTokenizer, HFTokenizer, Tokenizer, TokenizerError, WordTokenizer

# Python's \s (str.isspace) holds every character Rust's regex calls \s, and a few more
# (\x1c-\x1f), so "non-space" below is never looser than the tokenizers' own rule.
_AFTER_LINE_BREAK = re.compile(r"\S\n(?=\S)")  # cut = match.end(): just after the "\n"
_BEFORE_SPACE = re.compile(r"\S(?= \S)")  # cut = match.end(): just before the " "
PIECE_CHARS = 16 << 10  # the size of piece a tokenizer is given (HF encodes 16 KiB fastest)
SEARCH_CHARS = 64 << 10  # how far past the target size a cut is first looked for
MAX_PIECE_CHARS = 4 << 20  # a forced (possibly inexact) cut after this much uncuttable text


def next_safe_cut(text: str, start: int, limit: int | None = None) -> int | None:
    """The first safe cut at or after ``start`` and at most ``limit`` (default: the end of
    ``text``), or None if there is none.

    A cut needs the character after it, so the end of ``text`` is never one."""
    end = len(text) if limit is None else min(limit, len(text))
    best = None
    for pattern, back in ((_AFTER_LINE_BREAK, 2), (_BEFORE_SPACE, 1)):
        # a match ends at its cut, ``back`` characters after it starts, and looks one past it
        m = pattern.search(text, max(start - back, 0), end + 1)
        if m is not None and (best is None or m.end() < best):
            best = m.end()
    return best if best is not None and best <= end else None


def split_pieces(text: str, piece_chars: int = PIECE_CHARS) -> tuple[list[str], str]:
    """``text`` cut at safe cuts into pieces of about ``piece_chars``, and the uncut rest.

    The rest (the text after the last cut) is kept back because the text that will follow it
    decides whether its end can be cut; put it in front of the next text, or encode it as the
    last piece. ``"".join(pieces) + rest == text``.
    """
    pieces, pos = [], 0
    while len(text) - pos > piece_chars:
        target = pos + piece_chars
        cut = next_safe_cut(text, target, target + SEARCH_CHARS)
        if cut is None:  # rare: look further, up to the largest piece allowed
            cut = next_safe_cut(text, target + SEARCH_CHARS, pos + MAX_PIECE_CHARS)
        if cut is None:
            if len(text) - pos <= MAX_PIECE_CHARS:
                break  # the text still to come may hold a cut
            cut = pos + MAX_PIECE_CHARS  # none anywhere: force one
        pieces.append(text[pos:cut])
        pos = cut
    return pieces, text[pos:]


ArrayEncoder = Callable[[list[str]], np.ndarray]


def array_encoder(tokenizer: Tokenizer, dtype: np.dtype) -> ArrayEncoder:
    """A function pieces -> the concatenation of their token ids, as one array of ``dtype``.

    Each tokenizer gets its fastest route: HF tokenizers encode the whole batch in Rust
    (``encode_batch_fast``, which skips character offsets); the char tokenizer looks code points
    up in a table with numpy; the word tokenizer runs its regex. Framing tokens (BERT's
    ``[CLS] ... [SEP]``) are never added: the pieces are parts of one text.
    """
    if isinstance(tokenizer, HFTokenizer):
        return _hf_encoder(tokenizer, dtype)
    if isinstance(tokenizer, CharTokenizer):
        return _char_encoder(tokenizer, dtype)
    if isinstance(tokenizer, WordTokenizer):
        return _word_encoder(tokenizer, dtype)

    def generic(pieces: list[str]) -> np.ndarray:
        ids = [i for p in pieces for i in tokenizer.encode(p, add_special_tokens=False)]
        return np.asarray(ids, dtype=dtype)

    return generic


def _hf_encoder(tokenizer: HFTokenizer, dtype: np.dtype) -> ArrayEncoder:
    tok = tokenizer.tok
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)  # tokenizers >= 0.21

    def encode(pieces: list[str]) -> np.ndarray:
        if not pieces:
            return np.zeros(0, dtype=dtype)
        parts = [
            np.array(e.ids, dtype=dtype) for e in encode_batch(pieces, add_special_tokens=False)
        ]
        return np.concatenate(parts)

    return encode


def _char_encoder(tokenizer: CharTokenizer, dtype: np.dtype) -> ArrayEncoder:
    # table[code point] = id, or -1 for a character outside the vocabulary
    points = np.array([ord(c) for c in tokenizer.itos if len(c) == 1], dtype=np.int64)
    ids = np.array([tokenizer.stoi[c] for c in tokenizer.itos if len(c) == 1], dtype=np.int64)
    table = np.full(int(points.max(initial=0)) + 1, -1, dtype=np.int64)
    table[points] = ids
    unk = tokenizer.unk_id

    def encode(pieces: list[str]) -> np.ndarray:
        text = "".join(pieces)
        cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)  # (N,)
        out = np.full(cp.shape, -1, dtype=np.int64)
        inside = cp < len(table)
        out[inside] = table[cp[inside]]
        if (out < 0).any():
            if unk is None:
                tokenizer.encode(text)  # raises the TokenizerError that names the characters
                raise TokenizerError("characters not in the vocabulary")  # not reached
            out[out < 0] = unk
        return out.astype(dtype)

    return encode


def _word_encoder(tokenizer: WordTokenizer, dtype: np.dtype) -> ArrayEncoder:
    from attnlab.tokenizers import WORD_RE

    get, unk = tokenizer.stoi.get, tokenizer.unk_id

    def encode(pieces: list[str]) -> np.ndarray:
        words = [w for p in pieces for w in WORD_RE.findall(p)]
        return np.fromiter((get(w, unk) for w in words), dtype=dtype, count=len(words))

    return encode
