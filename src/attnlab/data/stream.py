"""A language-model corpus of any size, ready to train on: a tokenizer, token shards, a
held-out split and a source of batches, built once and reused.

    corpus --sample--> tokenizer --shards (parallel)--> tokens --split--> train | val --> batches

Two ways, chosen by the corpus size (``STREAM_BYTES``) or by naming a cache directory:

- **small** (the default below 32 MiB): the tokenizer is built on the whole text, the shards
  live in the run directory (``RUN/tokens/``), and training windows are drawn at random with
  replacement (``RandomWindows``, as nanoGPT does), so runs compare with nanoGPT's.
- **streamed** (32 MiB or more, or ``cache=`` given): the tokenizer is trained on a bounded
  sample (``sample_chunks``), tokenizer and shards are cached under ``cache/`` keyed by the
  files' names, sizes and mtimes (and the tokenizer's hash), so a second run on the same data
  reuses both; training reads the windows in epochs (``EpochWindows``), resumable mid-epoch.

Nothing here holds the corpus or its tokens in memory: text is read 1 MiB at a time, tokens
are read a batch at a time.

The held-out split is the last ``val_fraction`` of every shard (a shard is ~4 MiB of text), so
it samples the whole corpus rather than its last files, and it is the same on every run over
the same files. With one shard (a corpus under 4 MiB) it is the last ``val_fraction`` of the
text, as ``split_tokens`` makes it.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.data.corpus import Corpus, DataError
from attnlab.data.epochs import EpochWindows
from attnlab.data.shards import (
    SHARD_BYTES,
    BuildStats,
    ShardedTokens,
    ShardError,
    byte_splittable,
    content_key,
    corpus_fingerprint,
    locked,
    open_shards,
    shards_for,
    shards_key,
    tokenizer_sha256,
)
from attnlab.data.tokens import RandomWindows
from attnlab.heartbeat import beating
from attnlab.tokenizers import (
    Tokenizer,
    TokenizerError,
    build_tokenizer,
    load_tokenizer,
    with_bos,
)

STREAM_BYTES = 32 << 20  # corpora this large or larger stream from the cache by default
SAMPLE_BYTES = 16 << 20  # a tokenizer trains on at most this much text (BPE: ~10 s on 2 cores)
SAMPLE_PIECES = 128  # ... taken as this many evenly spaced pieces
CACHE_ENV = "ATTNLAB_CACHE"
TOKENS_DIR = "tokens"  # a small corpus's shards: RUN/tokens/

Log = Callable[[str], None] | None


def default_cache_dir() -> Path:
    """``$ATTNLAB_CACHE``, else ``$XDG_CACHE_HOME/attnlab``, else ``~/.cache/attnlab``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnlab"


def corpus_bytes(corpus: Corpus) -> int:
    return sum(p.stat().st_size for p in corpus.files)


def streams(corpus: Corpus, cache: str | Path | None = None) -> bool:
    """Whether ``prepare_lm_tokens`` streams this corpus from a cache: a cache is named, or the
    corpus is ``STREAM_BYTES`` or more."""
    return cache is not None or corpus_bytes(corpus) >= STREAM_BYTES


# ---------------------------------------------------------------------------------------------
# The tokenizer's sample
# ---------------------------------------------------------------------------------------------


def sample_chunks(
    corpus: Corpus, max_bytes: int = SAMPLE_BYTES, pieces: int = SAMPLE_PIECES
) -> Iterator[str]:
    """The text a tokenizer is trained on: all of it when the corpus is at most ``max_bytes``;
    otherwise ``pieces`` pieces of ``max_bytes / pieces`` bytes each, centred on evenly spaced
    points of the corpus (its files end to end), each trimmed to whole lines. Deterministic: it
    depends only on the files. (An encoding that cannot be cut at a byte, UTF-16 say, gives the
    first ``max_bytes`` of text instead.)"""
    sizes = [p.stat().st_size for p in corpus.files]
    total = sum(sizes)
    if total <= max_bytes or not byte_splittable(corpus.encoding):
        taken = 0
        for chunk in corpus.chunks():
            if taken >= max_bytes:
                return
            taken += len(chunk)
            yield chunk
        return
    piece = max_bytes // pieces
    encoding = "utf-8" if codecs.lookup(corpus.encoding).name == "utf-8-sig" else corpus.encoding
    for k in range(pieces):
        start = min(max((2 * k + 1) * total // (2 * pieces) - piece // 2, 0), total - piece)
        f = 0
        while start >= sizes[f]:  # global offset -> (file, offset in it)
            start -= sizes[f]
            f += 1
        with open(corpus.files[f], "rb") as fh:
            fh.seek(start)
            raw = fh.read(piece)
        if start > 0 and b"\n" in raw:
            raw = raw[raw.index(b"\n") + 1 :]  # begin at the start of a line
        if b"\n" in raw:
            raw = raw[: raw.rindex(b"\n") + 1]  # end at the end of a line
        text = raw.decode(encoding, errors="ignore")  # only a cut character can be dropped
        if text:
            yield text


def build_tokenizer_from_sample(
    kind: str,
    corpus: Corpus,
    vocab_size: int = 512,
    min_freq: int = 1,
    sample_bytes: int = SAMPLE_BYTES,
) -> Tokenizer:
    """``bpe`` and ``word`` are built on ``sample_chunks``; ``char`` reads the whole corpus (one
    cheap pass) so that no character of the text is left out of its vocabulary."""
    texts = corpus.chunks() if kind == "char" else sample_chunks(corpus, sample_bytes)
    try:
        return build_tokenizer(kind, texts, vocab_size, min_freq)
    except TokenizerError as e:
        raise DataError(str(e)) from None


def cached_tokenizer(
    kind: str,
    corpus: Corpus,
    cache: Path,
    vocab_size: int = 512,
    min_freq: int = 1,
    sample_bytes: int = SAMPLE_BYTES,
    log: Log = None,
) -> tuple[Tokenizer, bool]:
    """The tokenizer ``build_tokenizer_from_sample`` makes for this corpus, from
    ``cache/tokenizers/`` when an earlier run built it on the same files; (tokenizer, reused).

    Cached because BPE training is not deterministic from run to run (ties between merges), and
    the shards are keyed by the tokenizer: the same data must get the same tokenizer."""
    from attnlab.files import atomic_write_text

    options = [kind, vocab_size if kind == "bpe" else None, min_freq if kind == "word" else None]
    key = content_key("tokenizer", options, sample_bytes, SAMPLE_PIECES, corpus_fingerprint(corpus))
    path = cache / "tokenizers" / f"{corpus.name}-{kind}-{key[:24]}.json"
    with locked(path):
        if path.is_file():
            if log is not None:
                log(f"reusing the {kind} tokenizer cached in {path}")
            return load_tokenizer(path), True
        if log is not None:
            size = min(sample_bytes, corpus_bytes(corpus))
            what = "the whole text" if kind == "char" else f"a {size / 1e6:,.1f} MB sample"
            log(f"building the {kind} tokenizer on {what} of {corpus.name} ...")
        with beating(f"building the {kind} tokenizer", log):
            tokenizer = build_tokenizer_from_sample(kind, corpus, vocab_size, min_freq,
                                                    sample_bytes)  # fmt: skip
        atomic_write_text(path, tokenizer.to_json())
        return tokenizer, False


# ---------------------------------------------------------------------------------------------
# The prepared data
# ---------------------------------------------------------------------------------------------


@dataclass
class LMTokens:
    """A corpus prepared for language modelling: its tokenizer and its token stream."""

    tokenizer: Tokenizer
    tokens: ShardedTokens  # the whole token stream
    n_chars: int  # characters of text it came from (for bits per character)
    dest: Path  # the shard directory
    sampler: str  # how training reads it: "random" (RandomWindows) or "epochs" (EpochWindows)
    reused: bool = False  # the shards were already there
    tokenizer_reused: bool = False
    stats: BuildStats | None = None  # how long encoding took, when it happened
    record: dict = field(default_factory=dict)  # for the run's config.json: how to reopen it

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def chars_per_token(self) -> float:
        return self.n_chars / max(self.n_tokens, 1)

    def split(self, val_fraction: float, block_size: int) -> tuple[ShardedTokens, ShardedTokens]:
        """(train, val), see ``split_held_out``."""
        return split_held_out(self.tokens, val_fraction, block_size)


def split_held_out(
    tokens: ShardedTokens, val_fraction: float, block_size: int
) -> tuple[ShardedTokens, ShardedTokens]:
    """(train, val): the last ``val_fraction`` of every shard held out (see the module).

    Both parts must hold at least one window (block_size + 1 tokens); val is train when
    ``val_fraction`` is 0."""
    n, need = len(tokens), block_size + 1
    if n < need:
        raise DataError(
            f"the text is only {n} tokens, shorter than block_size + 1 = {need}; "
            "give more text or a smaller --block-size"
        )
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    train, val = tokens.split_tails(val_fraction)
    if val_fraction > 0 and len(val) < need:
        raise DataError(
            f"the validation part ({val_fraction:.0%} of {n} tokens = {len(val)}) is "
            f"shorter than block_size + 1 = {need}; give more text, a smaller "
            "--block-size or a larger --val-fraction"
        )
    if len(train) < need:
        raise DataError(
            f"the training part ({len(train)} tokens) is shorter than block_size + 1 = "
            f"{need}; give more text or a smaller --val-fraction"
        )
    return train, (val if val_fraction > 0 else train)


def _data_key(corpus: Corpus) -> str:
    return content_key("data", corpus_fingerprint(corpus))[:24]


def prepare_lm_tokens(
    corpus: Corpus,
    kind: str,
    run_dir: str | Path | None,
    vocab_size: int = 512,
    min_freq: int = 1,
    cache: str | Path | None = None,
    tokenizer: Tokenizer | None = None,
    workers: int | None = None,
    sample_bytes: int = SAMPLE_BYTES,
    log: Log = None,
    bos: bool = False,
) -> LMTokens:
    """Tokenizer and shards for a new run (see the module for the small and streamed ways).

    ``cache``: a cache directory (streams whatever the size); None streams corpora of
    ``STREAM_BYTES`` or more into ``default_cache_dir()``. ``run_dir`` receives the small way's
    shards (``RUN/tokens``; None: only a streamed corpus can be prepared); nothing else is
    written there. ``tokenizer``: use this one instead of building a ``kind`` tokenizer (e.g.
    the one another rank built). ``workers``: encoding processes (0: this process; default one
    per core). ``log`` receives progress lines. ``bos``: the tokenizer built gets a ``<bos>``
    (``with_bos``: no other id changes, so a cached tokenizer serves runs with and without).
    """
    streamed = streams(corpus, cache)
    tok_reused = tokenizer is not None
    if streamed:
        cache = Path(cache).expanduser() if cache is not None else default_cache_dir()
        if tokenizer is None:
            tokenizer, tok_reused = cached_tokenizer(
                kind, corpus, cache, vocab_size, min_freq, sample_bytes, log
            )
            tokenizer = with_bos(tokenizer) if bos else tokenizer
        key = shards_key(corpus_fingerprint(corpus), tokenizer_sha256(tokenizer))
        dest = cache / "tokens" / f"{corpus.name}-{key}"
    else:
        if run_dir is None:
            raise ValueError("a corpus that does not stream keeps its shards in a run directory")
        if tokenizer is None:
            if log is not None:
                log(f"building the {kind} tokenizer on {corpus.name} ...")
            with beating(f"building the {kind} tokenizer", log):
                tokenizer = build_tokenizer(kind, corpus.chunks(), vocab_size, min_freq, bos=bos)
        dest = Path(run_dir) / TOKENS_DIR
    result = shards_for(corpus, tokenizer, dest, SHARD_BYTES, workers, log)
    record = {
        "token_shards": str(dest.resolve()) if streamed else TOKENS_DIR,
        "sampler": "epochs" if streamed else "random",
        "data_key": _data_key(corpus),
    }
    return LMTokens(
        tokenizer=tokenizer,
        tokens=result.tokens(),
        n_chars=result.manifest["n_chars"],
        dest=dest,
        sampler=record["sampler"],
        reused=result.reused,
        tokenizer_reused=tok_reused,
        stats=result.stats,
        record=record,
    )


def reopen_lm_tokens(
    run_dir: str | Path,
    record: dict,
    tokenizer: Tokenizer,
    corpus: Callable[[], Corpus | None] | None = None,
    log: Log = None,
) -> LMTokens:
    """The tokens of an existing run (for ``--resume``), from the ``record`` it saved.

    Shards that are damaged or gone are encoded again from the text if it is unchanged
    (``corpus()`` gives it; it is only called then); otherwise a DataError that says why the
    run cannot continue on the same tokens. A run made before shards existed
    (``RUN/tokens.bin``) is read as one shard."""
    run_dir = Path(run_dir)
    if "token_shards" not in record:
        return _legacy_tokens(run_dir, tokenizer)
    dest = Path(record["token_shards"])
    dest = dest if dest.is_absolute() else run_dir / dest

    def unchanged_text() -> Corpus | None:
        text = corpus() if corpus is not None else None
        return text if text is not None and _data_key(text) == record.get("data_key") else None

    if (dest / "manifest.json").is_file():
        result = open_shards(dest, tokenizer, unchanged_text, log)
    else:
        text = unchanged_text()
        if text is None:
            raise ShardError(
                f"{dest}: the run's token shards are gone and its data has changed or is "
                "missing; cannot resume on the same tokens"
            )
        result = shards_for(text, tokenizer, dest, SHARD_BYTES, None, log)
    return LMTokens(
        tokenizer=tokenizer,
        tokens=result.tokens(),
        n_chars=result.manifest["n_chars"],
        dest=dest,
        sampler=record.get("sampler", "random"),
        reused=result.reused,
        tokenizer_reused=True,
        stats=result.stats,
        record=dict(record),
    )


def _legacy_tokens(run_dir: Path, tokenizer: Tokenizer) -> LMTokens:
    from attnlab.data.tokens import TOKEN_FILE, TOKEN_META, read_token_file

    if not (run_dir / TOKEN_FILE).exists() and not (run_dir / TOKEN_META).exists():
        raise ShardError(
            f"{run_dir}: holds no tokens of its training text (an imported model, or a run "
            "written without them)"
        )
    _, info = read_token_file(run_dir / TOKEN_FILE)  # checks the size against data.json
    tokens = ShardedTokens([(run_dir / TOKEN_FILE, 0, info.n_tokens)], info.dtype)
    return LMTokens(tokenizer, tokens, info.n_chars, run_dir, "random", reused=True)


def lm_batches(
    train: ShardedTokens,
    sampler: str,
    block_size: int,
    batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    bos: int | None = None,
) -> RandomWindows | EpochWindows:
    """The training batches: ``RandomWindows`` or, for ``sampler == "epochs"``, ``EpochWindows``
    (``bos``: each window read after it, see ``windows``)."""
    source = EpochWindows if sampler == "epochs" else RandomWindows
    return source(train, block_size, batch_size, seed=seed, rank=rank, world_size=world_size,
                  bos=bos)  # fmt: skip
