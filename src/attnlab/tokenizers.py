"""Tokenizers: text -> token ids -> text.

- ``CharTokenizer``: one id per character seen in the corpus (optionally an ``<unk>``).
- ``WordTokenizer``: regex words and punctuation, ``<unk>``, minimum frequency.
- ``HFTokenizer``: any Hugging Face ``tokenizers`` tokenizer: byte-level BPE trained here
  (``train_bpe``), WordPiece learned here for the encoder tasks, GPT-2's BPE or BERT's
  WordPiece brought in by ``import-hf``.
- ``PairTokenizer``: a source and a target tokenizer for an encoder-decoder.

``build_tokenizer`` is the one way to build a tokenizer from text, for every task. The special
tokens are defined here, once:
    <unk>                            char (optional) and word tokenizers, id 0
    <pad>=0 <bos>=1 <eos>=2          encoder-decoder ids, before each side's own tokens
    [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4   encoder (BERT-style) tokenizers

Every tokenizer built here is a function of its text and settings: the same inputs give a
byte-identical ``tokenizer.json`` in any process, on any number of threads. Char and word
vocabularies are sorted; byte-level BPE ties are broken by ids that follow the sorted alphabet;
WordPiece is learned here (``wordpiece_vocab``), ties broken by the tokens' strings, because the
Hugging Face WordPiece trainer numbers its ``##`` tokens in hash-map order, which differs
between processes (two runs of one command once differed in 59 of 400 ids).

Every tokenizer has ``encode(text) -> list[int]``, ``decode(ids) -> str`` and ``vocab_size``,
and saves to one file, ``tokenizer.json``: the Hugging Face format for HF tokenizers, and a small
JSON object with an ``"attnlab"`` key for char and word.
"""

from __future__ import annotations

import heapq
import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from attnlab.errors import AttnlabError

UNK = "<unk>"
BOS_TOKEN = "<bos>"  # a language model's start-of-text token (train --bos), never typed text
PAD, BOS, EOS = 0, 1, 2  # encoder-decoder ids; a PairTokenizer shifts each side's ids by 3
PAIR_SPECIALS = ("<pad>", "<bos>", "<eos>")
ENCODER_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # at ids 0-4
TOKENIZER_KINDS = ("char", "word", "bpe", "wordpiece")


class TokenizerError(AttnlabError):
    """Text that a tokenizer cannot encode, or a tokenizer file that cannot be read."""


class Tokenizer:
    """``encode(text)`` frames the text as the model was trained on it: with ``<bos>`` first
    when the tokenizer has one (``bos_id``), or BERT's ``[CLS] ... [SEP]``;
    ``encode(text, add_special_tokens=False)`` gives the text's own ids alone (a corpus, a
    target token)."""

    kind = "base"
    special_tokens: dict[str, int] = {}
    bos_id: int | None = None  # the id every sequence starts with (train --bos), if any

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def tokens(self, text: str) -> list[str]:
        """The text split into the strings of its tokens (for labelling plots and tables)."""
        return self.labels(self.encode(text))

    def labels(self, ids: Iterable[int]) -> list[str]:
        """What the model saw at each id, as a label: the vocabulary's token for the id."""
        return [self.decode([i]) for i in ids]

    def to_json(self) -> str:
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


class CharTokenizer(Tokenizer):
    """One token per character; the vocabulary is the sorted set of the corpus's characters.

    ``bos``: a ``<bos>`` id after the characters' (so theirs are unchanged), which ``encode``
    puts first and ``decode`` drops; no text encodes to it, ``"<bos>"`` typed included."""

    kind = "char"

    def __init__(self, chars: Iterable[str], unk: bool = False, bos: bool = False):
        chars = sorted(set(chars) - {UNK})
        self.itos = ([UNK] if unk else []) + chars
        self.stoi = {s: i for i, s in enumerate(self.itos)}  # characters only: never <bos>
        self.unk_id = 0 if unk else None
        if bos:
            self.bos_id = len(self.itos)
            self.itos.append(BOS_TOKEN)

    @classmethod
    def from_text(cls, text: str, unk: bool = False) -> CharTokenizer:
        return cls(set(text), unk=unk)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        stoi = self.stoi
        try:
            ids = [stoi[ch] for ch in text]
        except KeyError:
            if self.unk_id is None:
                missing = sorted({ch for ch in text if ch not in stoi})
                shown = ", ".join(repr(ch) for ch in missing[:10])
                more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
                raise TokenizerError(f"characters not in the vocabulary: {shown}{more}") from None
            ids = [stoi.get(ch, self.unk_id) for ch in text]
        if self.bos_id is not None and add_special_tokens is not False:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        itos, bos = self.itos, self.bos_id
        return "".join(itos[int(i)] for i in ids if int(i) != bos)

    def labels(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]

    def tokens(self, text: str) -> list[str]:
        return [self.itos[i] for i in self.encode(text)]

    def to_json(self) -> str:
        chars = self.itos[:-1] if self.bos_id is not None else self.itos
        body = {"type": "char", "vocab": chars[1:] if self.unk_id is not None else chars}
        body["unk"] = self.unk_id is not None
        if self.bos_id is not None:  # written only when on: older runs' files are unchanged
            body["bos"] = True
        return json.dumps({"attnlab": body}, ensure_ascii=False)


WORD_RE = re.compile(r"\w+|[^\w\s]")


class WordTokenizer(Tokenizer):
    """Words and punctuation marks by regex; words rarer than ``min_freq`` become ``<unk>``.

    Decoding joins tokens with spaces and closes the space before punctuation, so it restores
    ordinary prose but not every original spacing.
    """

    kind = "word"

    def __init__(self, vocab: list[str]):
        self.itos = [UNK] + [w for w in vocab if w != UNK]
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.unk_id = 0

    @classmethod
    def from_text(cls, text: str, min_freq: int = 1, max_size: int | None = None) -> WordTokenizer:
        counts = Counter(WORD_RE.findall(text))
        words = [w for w, n in counts.most_common(max_size) if n >= min_freq]
        return cls(sorted(words))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        return [self.stoi.get(w, 0) for w in WORD_RE.findall(text)]

    def decode(self, ids: Iterable[int]) -> str:
        text = " ".join(self.itos[int(i)] for i in ids)
        return re.sub(r" ([^\w\s<])", r"\1", text)

    def tokens(self, text: str) -> list[str]:
        return [self.itos[i] for i in self.encode(text)]

    def to_json(self) -> str:
        return json.dumps({"attnlab": {"type": "word", "vocab": self.itos}}, ensure_ascii=False)


def _byte_level_alphabet() -> dict[str, int]:
    """The printable character byte-level BPE writes for each byte, inverted: bytes that are
    printable (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves, the other 68
    (space, controls, ...) are written as chr(256 + k), k counting them in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + shift)] = b
            shift += 1
    return table


_UNICODE_TO_BYTE = _byte_level_alphabet()


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers.Tokenizer`` (byte-level BPE, WordPiece, ...)."""

    kind = "hf"

    def __init__(self, tok):
        self.tok = tok
        vocab = tok.get_vocab()
        self.special_tokens = {t: vocab[t] for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]",
                                                      "<|endoftext|>") if t in vocab}  # fmt: skip
        # A tokenizer whose post-processor adds tokens (BERT's [CLS] ... [SEP]) adds them by
        # default, because the model was trained on inputs framed that way; GPT-2's adds none.
        post = tok.post_processor
        self.add_special_tokens = post is not None and post.num_special_tokens_to_add(False) > 0
        if self.add_special_tokens:  # a template that puts one token first and none after
            framed, bare = (tok.encode("a", add_special_tokens=f).ids for f in (True, False))
            if len(framed) == len(bare) + 1 and framed[1:] == bare:
                self.bos_id = framed[0]  # train --bos's <bos>, Llama's <s>

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def _special(self, add_special_tokens: bool | None) -> bool:
        return self.add_special_tokens if add_special_tokens is None else add_special_tokens

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        return self.tok.encode(text, add_special_tokens=self._special(add_special_tokens)).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool | None = None):
        special = self._special(add_special_tokens)
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=special)]

    def decode(self, ids: Iterable[int]) -> str:
        bos = self.bos_id
        return self.tok.decode([int(i) for i in ids if int(i) != bos], skip_special_tokens=False)

    def tokens(self, text: str, add_special_tokens: bool | None = None) -> list[str]:
        return self.labels(self.encode(text, add_special_tokens))

    def labels(self, ids: Iterable[int]) -> list[str]:
        """The vocabulary's token for each id, not the text it came from (an emoji a WordPiece
        vocabulary lacks is ``[UNK]``; ``##ing`` continues a word). Byte-level tokens (GPT-2's
        ``Ġthe``, ``Ã©``) are shown as the text their bytes spell (`` the``, ``é``); bytes that
        are part of a character split across tokens are shown as ``\\xNN``; a SentencePiece
        ``▁`` is a space."""
        from tokenizers import decoders

        byte_level = isinstance(self.tok.decoder, decoders.ByteLevel)
        out = []
        for i in ids:
            t = self.tok.id_to_token(int(i))
            if t is None:
                out.append(f"<{int(i)}>")
            elif byte_level and all(ch in _UNICODE_TO_BYTE for ch in t):
                raw = bytes(_UNICODE_TO_BYTE[ch] for ch in t)
                out.append(raw.decode("utf-8", errors="backslashreplace"))
            else:
                out.append(t.replace("\u2581", " "))
        return out

    def to_json(self) -> str:
        return self.tok.to_str()


def train_bpe(
    texts: Iterable[str], vocab_size: int = 512, special_tokens: list[str] | None = None
) -> HFTokenizer:
    """Byte-level BPE trained on ``texts``: decode(encode(t)) == t for any text."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens or ["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(tok)


class SharedPairTokenizer:
    """One tokenizer for both sides of an encoder-decoder whose model ids are the tokenizer's
    own (T5's SentencePiece vocabulary), with that model's reserved ids: ``PAD``, ``BOS`` the
    decoder's start (T5: <pad>, 0) and ``EOS`` the end (T5: </s>, 1). It speaks
    ``PairTokenizer``'s methods, so translation and the look-inside verbs read it the same way.
    Saved as tokenizer.json: {"attnlab": {"type": "shared-pair", ids, "tokenizer": the
    Hugging Face tokenizer.json}}."""

    kind = "shared-pair"

    def __init__(self, tok: HFTokenizer, pad: int = 0, start: int = 0, end: int = 1):
        self.tok, self.PAD, self.BOS, self.EOS = tok, pad, start, end
        self.special_tokens = dict(tok.special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    src_vocab_size = tgt_vocab_size = vocab_size

    def encode_source(self, text: str) -> list[int]:
        """Source ids, ending with the end id (T5's tokenizer appends </s> itself)."""
        ids = self.tok.encode(text)
        return ids if ids and ids[-1] == self.EOS else [*ids, self.EOS]

    def encode_target(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    encode = encode_source

    def _strip(self, ids: Iterable[int]) -> list[int]:
        out = []
        for i in map(int, ids):
            if i == self.EOS:
                break
            if i not in (self.PAD, self.BOS):
                out.append(i)
        return out

    def decode_target(self, ids: Iterable[int]) -> str:
        """Model ids -> text, stopping at the end id and dropping <pad> and the start id."""
        return self.tok.decode(self._strip(ids))

    decode_source = decode = decode_target

    def source_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.tok.tok.id_to_token(int(i)) or str(int(i)) for i in ids]

    target_tokens = source_tokens

    def tokens(self, text: str) -> list[str]:
        return self.tok.tokens(text)

    def to_json(self) -> str:
        body = {"type": "shared-pair", "pad": self.PAD, "start": self.BOS, "end": self.EOS,
                "tokenizer": json.loads(self.tok.to_json())}  # fmt: skip
        return json.dumps({"attnlab": body}, ensure_ascii=False)


def tokenizer_from_json(text: str, readers: dict | None = None) -> Tokenizer:
    """The tokenizer a tokenizer.json holds: attnlab's own kinds (char, word, shared-pair) or a
    Hugging Face tokenizer; ``readers`` maps the other kinds attnlab writes to what reads them
    (``{"image": ImageTokenizer.from_dict}``: a ViT run's, which ``attnlab.data.images``
    defines, above this module). A TokenizerError (one line) for anything else."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"tokenizer.json is not valid JSON ({e})") from None
    if isinstance(data, dict) and "attnlab" in data:
        body = data["attnlab"]
        if body.get("type") == "char":
            return CharTokenizer(body["vocab"], unk=body.get("unk", False),
                                 bos=body.get("bos", False))  # fmt: skip
        if body.get("type") == "word":
            return WordTokenizer(body["vocab"])
        if body.get("type") == "shared-pair":  # a T5 run's: one vocabulary, the model's ids
            inner = tokenizer_from_json(json.dumps(body.get("tokenizer")), readers)
            if not isinstance(inner, HFTokenizer):
                raise TokenizerError("tokenizer.json: a shared-pair tokenizer wraps a Hugging "
                                     "Face tokenizer")  # fmt: skip
            ids = {k: body.get(k) for k in ("pad", "start", "end")}
            if not all(isinstance(v, int) for v in ids.values()):
                raise TokenizerError("tokenizer.json: a shared-pair tokenizer needs pad, start "
                                     "and end ids")  # fmt: skip
            return SharedPairTokenizer(inner, **ids)
        kind = body.get("type")
        if kind in (readers or {}):  # a kind read above this module (a ViT run's "image")
            try:
                return readers[kind](body)
            except TypeError as e:
                raise TokenizerError(f"tokenizer.json: not an {kind} tokenizer ({e})") from None
        raise TokenizerError(f"unknown tokenizer type {kind!r}")
    from tokenizers import Tokenizer as HFTok

    try:
        return HFTokenizer(HFTok.from_str(text))
    except Exception as e:  # the Rust side raises its own exception type
        raise TokenizerError(f"tokenizer.json could not be read ({e})") from None


def load_tokenizer(path: str | Path, readers: dict | None = None) -> Tokenizer:
    """The tokenizer saved at ``path`` (``readers``: as ``tokenizer_from_json``'s); a missing
    or unreadable file is a TokenizerError that names it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    try:
        return tokenizer_from_json(text, readers)
    except TokenizerError as e:
        message = str(e).removeprefix("tokenizer.json ").removeprefix("tokenizer.json: ")
        raise TokenizerError(f"{path}: {message}") from None


def build_tokenizer(
    kind: str,
    texts: str | Iterable[str],
    vocab_size: int = 512,
    min_freq: int = 1,
    *,
    unk: bool = False,
    encoder: bool = False,
    bos: bool = False,
) -> Tokenizer:
    """The one tokenizer builder: a ``char``, ``word``, ``bpe`` or ``wordpiece`` tokenizer
    learned from ``texts`` (one string, or an iterable of pieces read in a stream, such as a
    corpus's chunks: each piece is read once).

    ``unk``: char tokenizers map unseen characters to ``<unk>`` (word tokenizers always do).
    ``encoder``: a BERT-style tokenizer with [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4 that
    frames every text as ``[CLS] text [SEP]`` (any kind; wordpiece is for encoders only).
    ``bos``: every text starts with ``<bos>`` (``with_bos``; char and bpe).
    """
    if kind not in TOKENIZER_KINDS:
        raise TokenizerError(f"unknown tokenizer {kind!r}; choose {', '.join(TOKENIZER_KINDS)}")
    if bos:
        return with_bos(build_tokenizer(kind, texts, vocab_size, min_freq, unk=unk,
                                        encoder=encoder))  # fmt: skip
    pieces = _pieces(texts)
    if encoder:
        return _encoder_tokenizer(kind, pieces, vocab_size)
    if kind == "char":
        chars: set[str] = set()
        for piece in pieces:
            chars.update(piece)
        return CharTokenizer(chars, unk=unk)
    if kind == "word":
        counts: Counter[str] = Counter()
        for piece in pieces:
            counts.update(WORD_RE.findall(piece))
        return WordTokenizer(sorted(w for w, n in counts.items() if n >= min_freq))
    if kind == "bpe":
        return train_bpe(pieces, vocab_size=vocab_size)
    raise TokenizerError("the wordpiece tokenizer is for encoder tasks (--task mlm or classify)")


def put_bos_first(tok, bos_id: int):
    """A Hugging Face ``tokenizers.Tokenizer`` whose vocabulary holds ``<bos>`` at ``bos_id``,
    given the template that puts it before every text (``<bos> $A``) and returned."""
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    return tok


def with_bos(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` with a ``<bos>`` id after its others (so theirs are unchanged) that
    ``encode`` puts first: a char tokenizer, or a byte-level BPE (``<bos>`` a special token of
    its vocabulary, put first by its template). A TokenizerError for any other kind; the
    tokenizer itself if it has a BOS already."""
    if tokenizer.bos_id is not None:
        return tokenizer
    if isinstance(tokenizer, CharTokenizer):
        chars = tokenizer.itos[1:] if tokenizer.unk_id is not None else tokenizer.itos
        return CharTokenizer(chars, unk=tokenizer.unk_id is not None, bos=True)
    if isinstance(tokenizer, HFTokenizer) and not tokenizer.add_special_tokens:
        from tokenizers import Tokenizer as HFTok

        tok = HFTok.from_str(tokenizer.to_json())  # a copy: the cached one stays as it was
        if tok.token_to_id(BOS_TOKEN) is None:
            tok.add_special_tokens([BOS_TOKEN])
        return HFTokenizer(put_bos_first(tok, tok.token_to_id(BOS_TOKEN)))
    raise TokenizerError(f"a <bos> token is for the char and bpe tokenizers, not {tokenizer.kind}")


def _pieces(texts: str | Iterable[str]) -> Iterable[str]:
    """One long string in pieces of ~1 MiB (the BPE trainer reads an iterator of strings)."""
    if not isinstance(texts, str):
        return texts
    step = 1 << 20
    return (texts[i : i + step] for i in range(0, max(len(texts), 1), step))


def _encoder_tokenizer(kind: str, texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """An HF tokenizer with ENCODER_SPECIALS at ids 0-4 and ``[CLS] $A [SEP]`` framing."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = list(ENCODER_SPECIALS)
    if kind == "char":  # BPE with no merges splits text into single characters
        seen: set[str] = set()
        for piece in texts:
            seen.update(piece)
        chars = sorted((seen | {"\n"}) - set(specials))
        vocab = {t: i for i, t in enumerate(specials + chars)}
        tok = HFTok(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
        tok.decoder = decoders.Fuse()
    elif kind == "word":
        tok = HFTok(models.WordLevel(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+ | [^\w\s]+
        trainer = trainers.WordLevelTrainer(special_tokens=specials, show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
    elif kind == "bpe":
        tok = HFTok(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(texts, trainer=trainer)
    else:  # wordpiece, trained here: the library's trainer breaks ties in no fixed order
        normalizer = normalizers.BertNormalizer(lowercase=False)
        pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        counts = _word_counts(texts, normalizer, pre_tokenizer)
        vocab = wordpiece_vocab(counts, vocab_size, specials)
        tok = HFTok(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        tok.normalizer = normalizer
        tok.pre_tokenizer = pre_tokenizer
        tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(specials)
    ids = {t: tok.token_to_id(t) for t in specials}
    assert [ids[t] for t in specials] == list(range(len(specials))), ids
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return HFTokenizer(tok)


def _word_counts(texts: Iterable[str], normalizer, pre_tokenizer) -> Counter[str]:
    """How often each word occurs, as ``normalizer`` and ``pre_tokenizer`` (the tokenizer's
    own) split the texts. Both break at spaces and newlines, so the texts are cut there first
    and each distinct piece is split once (a word of ASCII letters and digits is its own)."""
    pieces: Counter[str] = Counter()
    for text in texts:
        pieces.update(text.replace("\n", " ").split(" "))
    counts: Counter[str] = Counter()
    for piece, n in pieces.items():
        if piece.isascii() and piece.isalnum():
            counts[piece] += n
        elif piece:
            for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(piece)):
                counts[word] += n
    return counts


def wordpiece_vocab(
    counts: dict[str, int], vocab_size: int, specials: Iterable[str] = (), prefix: str = "##"
) -> list[str]:
    """A WordPiece vocabulary learned from word counts, as a list whose index is the id.

    The vocabulary starts as ``specials``, then every character that starts a word, then
    ``prefix`` + every character that continues one, each group sorted. Then, until it holds
    ``vocab_size`` tokens, the most frequent pair of adjacent tokens (summed over words,
    weighted by each word's count) is merged into one token (``th`` + ``##e`` -> ``the``), as
    BPE does. Ties go to the pair whose two token strings sort first, so the vocabulary is a
    function of the counts alone: no hash order, no thread count (the Hugging Face trainer
    breaks ties by ids it assigns in hash-map order, which differs between processes).
    """
    counts = {w: n for w, n in counts.items() if w and n > 0}
    words = [[w[0]] + [prefix + c for c in w[1:]] for w in counts]
    freq = list(counts.values())
    vocab = list(dict.fromkeys(specials))
    vocab += sorted({w[0] for w in words} - set(vocab))
    vocab += sorted({t for w in words for t in w[1:]} - set(vocab))
    known = set(vocab)
    pairs: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, w in enumerate(words):
        for pair in zip(w, w[1:]):
            pairs[pair] += freq[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-n, a, b) for (a, b), n in pairs.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        n, a, b = heapq.heappop(heap)
        if pairs.get((a, b)) != -n:  # a stale entry: the pair's count has changed since
            continue
        merged = a + b.removeprefix(prefix)
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
        delta: dict[tuple[str, str], int] = {}  # how each pair's count changes
        for i in where.pop((a, b)):
            w = words[i]
            out = _merge(w, a, b, merged)
            if len(out) == len(w):  # the pair has left this word since it was indexed
                continue
            f = freq[i]
            for pair in zip(w, w[1:]):
                delta[pair] = delta.get(pair, 0) - f
            for pair in zip(out, out[1:]):
                delta[pair] = delta.get(pair, 0) + f
                if merged in pair:  # a new pair in this word; the others were indexed before
                    where.setdefault(pair, set()).add(i)
            words[i] = out
        for pair, d in delta.items():
            if d == 0:
                continue
            count = pairs[pair] + d
            if count > 0:
                pairs[pair] = count
                heapq.heappush(heap, (-count, *pair))  # the older entry is now stale
            else:
                del pairs[pair]
    return vocab


def _merge(word: list[str], a: str, b: str, merged: str) -> list[str]:
    """``word`` with every ``a b`` replaced by ``merged``, left to right (``a a a`` -> ``aa a``)."""
    out: list[str] = []
    j, n = 0, len(word)
    while True:
        try:
            k = word.index(a, j)
        except ValueError:
            break
        if k + 1 < n and word[k + 1] == b:
            out += word[j:k]
            out.append(merged)
            j = k + 2
        else:
            out += word[j : k + 1]
            j = k + 1
    out += word[j:]
    return out


def special_id(tokenizer: Tokenizer, name: str) -> int:
    """The id of special token ``name`` (e.g. ``[MASK]``); a TokenizerError if it has none."""
    ids = getattr(tokenizer, "special_tokens", {})
    if name not in ids:
        raise TokenizerError(
            f"the tokenizer has no {name} token (encoder tasks need {' '.join(ENCODER_SPECIALS)})"
        )
    return ids[name]


class PairTokenizer:
    """A source and a target tokenizer for an encoder-decoder, plus three reserved ids.

    Model ids 0, 1, 2 are ``<pad>``, ``<bos>`` (starts the decoder) and ``<eos>`` (ends a
    source and a target); a tokenizer's id i becomes model id i + 3. Saved as two files: ``tokenizer.json``
    (source) and ``target_tokenizer.json`` (target). ``encode``/``tokens``/``vocab_size`` are the
    source side's, so a tool written for one tokenizer still reads the input text sensibly.
    """

    kind = "pair"
    PAD, BOS, EOS = PAD, BOS, EOS
    SPECIALS = PAIR_SPECIALS
    files = ("tokenizer.json", "target_tokenizer.json")

    def __init__(self, source: Tokenizer, target: Tokenizer):
        self.source, self.target = source, target
        self.special_tokens = dict(zip(self.SPECIALS, range(3)))

    @property
    def src_vocab_size(self) -> int:
        return self.source.vocab_size + 3

    @property
    def tgt_vocab_size(self) -> int:
        return self.target.vocab_size + 3

    vocab_size = src_vocab_size

    def encode_source(self, text: str) -> list[int]:
        """Source ids, ending with ``<eos>``: the marker tells the encoder where the source ends
        (a Transformer has no other way to find its last token, e.g. to reverse it)."""
        return [i + 3 for i in self.source.encode(text)] + [self.EOS]

    def encode_target(self, text: str) -> list[int]:
        """Target ids without ``<bos>``/``<eos>``: the caller frames them."""
        return [i + 3 for i in self.target.encode(text)]

    encode = encode_source

    def _strip(self, ids: Iterable[int]) -> list[int]:
        out = []
        for i in ids:
            i = int(i)
            if i == self.EOS:
                break
            if i >= 3:
                out.append(i - 3)
        return out

    def decode_target(self, ids: Iterable[int]) -> str:
        """Model ids -> text, stopping at ``<eos>`` and dropping ``<pad>``/``<bos>``."""
        return self.target.decode(self._strip(ids))

    def decode_source(self, ids: Iterable[int]) -> str:
        return self.source.decode(self._strip(ids))

    decode = decode_source

    def _token_strings(self, tok: Tokenizer, ids: Iterable[int]) -> list[str]:
        return [self.SPECIALS[i] if i < 3 else tok.labels([i - 3])[0] for i in map(int, ids)]

    def source_tokens(self, ids: Iterable[int]) -> list[str]:
        return self._token_strings(self.source, ids)

    def target_tokens(self, ids: Iterable[int]) -> list[str]:
        return self._token_strings(self.target, ids)

    def tokens(self, text: str) -> list[str]:
        return self.source.tokens(text)

    def to_json_files(self) -> dict[str, str]:
        return {
            "tokenizer.json": self.source.to_json(),
            "target_tokenizer.json": self.target.to_json(),
        }
