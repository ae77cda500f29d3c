"""Token shards: a corpus of any size encoded, in parallel, into a directory of token files.

    DIR/manifest.json      what was encoded (files, sizes, mtimes), with what (the tokenizer's
                           SHA-256), and for each shard: its text, token count and SHA-256
    DIR/shard-00000.bin    raw token ids, little-endian uint16 (vocab < 65536) or uint32
    DIR/shard-00001.bin    ...

The token stream of the corpus is the tokens of its files in order, with the tokens of one
``"\\n"`` between two files (as ``Corpus.chunks`` joins them); each file is encoded on its own.
A shard holds the tokens of about ``shard_bytes`` of text: a run of whole small files, or a part
of a large file cut at a safe cut (see ``attnlab.data.pieces``), so that the shards put end to
end are exactly that token stream whatever the shard size or the number of workers.

Building never shows a half-made directory: shards are written into ``.DIR.tmp-*``, fsynced, and
the directory renamed into place; a second process that wants the same directory waits on an OS
lock (``.DIR.lock``, released when its holder dies) and then reuses the result. Opening checks
every shard's size and SHA-256 against the manifest (and its ids against the vocabulary size); a
bad shard is re-encoded from its text if the text is unchanged, and refused in one line
otherwise.

Reading never maps the files: ``ShardedTokens`` reads the windows of a batch with ``pread``, so
the memory a run holds does not grow with the corpus (a memory map's touched pages count in the
process's resident set).
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.data.corpus import Corpus, DataError
from attnlab.data.pieces import array_encoder, next_safe_cut, split_pieces
from attnlab.data.tokens import token_dtype
from attnlab.files import FileLock, atomic_write_json, fsync_dir
from attnlab.tokenizers import Tokenizer, tokenizer_from_json

FORMAT = 1
MANIFEST = "manifest.json"
_SHARD_NAME = re.compile(r"shard-\d{5,}\.bin")
SHARD_BYTES = 4 << 20  # text per shard: ~50 shards for 200 MB keep 2-16 workers evenly busy
BLOCK_BYTES = 1 << 20  # a worker reads, encodes and writes 1 MiB of text at a time
SEARCH_BYTES = 1 << 20  # how far past a shard's target end a safe cut is looked for


def shard_dtype(vocab_size: int) -> np.dtype:
    """``token_dtype`` (uint16 when every id fits, else uint32), little-endian on every machine."""
    return token_dtype(vocab_size).newbyteorder("<")


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """The SHA-256 of the tokenizer's ``tokenizer.json``: two tokenizers that encode alike."""
    return hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# What the corpus is: its files' names, sizes and modification times
# ---------------------------------------------------------------------------------------------


def corpus_fingerprint(corpus: Corpus) -> dict:
    """The files of ``corpus`` as (absolute path, size in bytes, mtime in ns), and its encoding.

    This is what decides whether shards can be reused: reading it costs one ``stat`` per file.
    An edit that keeps both the size and the modification time of a file (``touch -d``) goes
    unseen; hashing every byte instead would cost about 1.5 s per GB on a 2-core machine.
    """
    files = []
    for p in corpus.files:
        st = p.stat()
        files.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    return {"encoding": codecs.lookup(corpus.encoding).name, "files": files}


def content_key(*parts) -> str:
    """SHA-256 (hex) of the JSON of ``parts``: a name for what they describe."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()


def shards_key(fingerprint: dict, tokenizer_hash: str, shard_bytes: int = SHARD_BYTES) -> str:
    """The name of the shards of this text encoded by this tokenizer (a cache key)."""
    return content_key("shards", FORMAT, fingerprint, tokenizer_hash, shard_bytes)[:24]


# ---------------------------------------------------------------------------------------------
# Planning: which text goes into which shard
# ---------------------------------------------------------------------------------------------


def byte_splittable(encoding: str) -> bool:
    """Whether a file in ``encoding`` can be cut at the bytes of a ``\\n`` or a space: true for
    UTF-8 and single-byte code pages (those bytes are never part of another character), false
    for UTF-16/32 and stateful encodings, whose files are encoded whole by one worker."""
    name = codecs.lookup(encoding).name
    if name in ("utf-8", "utf-8-sig", "ascii"):
        return True
    if name.startswith(("utf-16", "utf-32", "utf-7", "iso2022", "hz")):
        return False
    try:
        one_each = len(bytes(range(256)).decode(encoding, errors="replace")) == 256
        return one_each and "\n ".encode(encoding) == b"\n "
    except (LookupError, UnicodeError):
        return False


def _cut_in_file(path: Path, encoding: str, at: int, size: int) -> int | None:
    """The byte offset of the first safe cut at or after byte ``at`` of the file, looking at most
    ``SEARCH_BYTES`` ahead; None if there is none there."""
    lo = max(0, at - 8)
    with open(path, "rb") as f:
        f.seek(lo)
        raw = f.read(at - lo + SEARCH_BYTES)
    if codecs.lookup(encoding).name.startswith("utf-8"):
        skip = 0
        while skip < len(raw) and 0x80 <= raw[skip] < 0xC0:  # start on a character boundary
            skip += 1
        raw, lo = raw[skip:], lo + skip
        encoding = "utf-8"
    text = codecs.getincrementaldecoder(encoding)(errors="replace").decode(raw, final=False)
    start = len(raw[: max(at - lo, 0)].decode(encoding, errors="replace"))
    cut = next_safe_cut(text, start, len(text) - 1)
    if cut is None:
        return None
    offset = lo + len(text[:cut].encode(encoding))
    return offset if at <= offset < size else None


@dataclass(frozen=True)
class Segment:
    """Bytes ``[start, end)`` of file number ``file`` of the corpus."""

    file: int
    start: int
    end: int


def plan_shards(corpus: Corpus, shard_bytes: int = SHARD_BYTES) -> list[list[Segment]]:
    """The text of each shard: consecutive files, and parts of files cut at safe cuts, about
    ``shard_bytes`` each (deterministic: it depends only on the files and ``shard_bytes``)."""
    splittable = byte_splittable(corpus.encoding)
    units: list[list[Segment]] = []
    current: list[Segment] = []
    filled = 0
    for i, path in enumerate(corpus.files):
        size = path.stat().st_size
        pos = 0
        while splittable and size - pos > shard_bytes - filled:
            cut = _cut_in_file(path, corpus.encoding, pos + shard_bytes - filled, size)
            if cut is None:
                break
            current.append(Segment(i, pos, cut))
            units.append(current)
            current, filled, pos = [], 0, cut
        if size > pos:
            current.append(Segment(i, pos, size))
            filled += size - pos
        if filled >= shard_bytes:
            units.append(current)
            current, filled = [], 0
    if current:
        units.append(current)
    return units


# ---------------------------------------------------------------------------------------------
# Encoding one shard (in a worker process or in this one)
# ---------------------------------------------------------------------------------------------


@dataclass
class _Job:
    """Everything a worker needs, the same in every worker."""

    files: list[str]
    encoding: str
    tokenizer_json: str
    dtype: str
    separator: list[int]  # the tokens of the "\n" that joins two files


_JOB: _Job | None = None
_ENCODE = None
_PROGRESS = None  # shared counters (bytes, tokens) when encoding in worker processes


def _init_worker(job: _Job, progress) -> None:
    """Set up a worker process: its own tokenizer, no threads of its own, Ctrl-C left to the
    parent (which stops the pool and removes the partial directory)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core instead
    _set_job(job, progress)


def _set_job(job: _Job, progress=None) -> None:
    global _JOB, _ENCODE, _PROGRESS
    _JOB, _PROGRESS = job, progress
    _ENCODE = array_encoder(tokenizer_from_json(job.tokenizer_json), np.dtype(job.dtype))


def _count(n_bytes: int, n_tokens: int) -> None:
    if _PROGRESS is not None:
        done_bytes, done_tokens = _PROGRESS
        with done_bytes.get_lock():
            done_bytes.value += n_bytes
        with done_tokens.get_lock():
            done_tokens.value += n_tokens


def _segment_text(seg: Segment, job: _Job) -> Iterator[tuple[str, int, bool]]:
    """The text of a segment in pieces of about ``BLOCK_BYTES``: (text, bytes read, last)."""
    encoding = job.encoding
    if seg.start > 0 and codecs.lookup(encoding).name == "utf-8-sig":
        encoding = "utf-8"  # the byte order mark is only at the start of the file
    decoder = codecs.getincrementaldecoder(encoding)()
    with open(job.files[seg.file], "rb") as f:
        f.seek(seg.start)
        left = seg.end - seg.start
        while True:
            raw = f.read(min(BLOCK_BYTES, left))
            left -= len(raw)
            last = left <= 0 or not raw
            if not raw and not last:
                raise DataError(f"{job.files[seg.file]}: the file shrank while being read")
            try:
                text = decoder.decode(raw, final=last)
            except UnicodeError as e:
                where = job.files[seg.file]
                raise DataError(f"{where}: not valid {job.encoding} text ({e})") from None
            yield text, len(raw), last
            if last:
                return


def encode_shard(segments: list[Segment], path: str) -> dict:
    """Encode the text of ``segments`` into the token file ``path`` (set up by ``_set_job``).

    Returns the shard's entry in the manifest: its text, token and character counts, SHA-256.
    """
    job, encode = _JOB, _ENCODE
    sep = np.asarray(job.separator, dtype=job.dtype)
    digest, n_tokens, n_chars = hashlib.sha256(), 0, 0
    with open(path, "wb") as f:

        def write(ids: np.ndarray) -> None:
            nonlocal n_tokens
            ids = np.ascontiguousarray(ids, dtype=job.dtype)
            f.write(memoryview(ids).cast("B"))
            digest.update(memoryview(ids).cast("B"))
            n_tokens += ids.size

        for seg in segments:
            if seg.start == 0 and seg.file > 0:
                write(sep)
                n_chars += 1
            rest = ""
            for text, n_read, last in _segment_text(seg, job):
                pieces, rest = split_pieces(rest + text)
                if last:  # a segment ends at a safe cut (or the end of its file)
                    pieces, rest = pieces + ([rest] if rest else []), ""
                before = n_tokens
                write(encode(pieces))
                n_chars += sum(map(len, pieces))
                _count(n_read, n_tokens - before)
        f.flush()
        os.fsync(f.fileno())
    return {
        "file": Path(path).name,
        "segments": [[s.file, s.start, s.end] for s in segments],
        "n_tokens": n_tokens,
        "n_chars": n_chars,
        "sha256": digest.hexdigest(),
    }


# ---------------------------------------------------------------------------------------------
# Building and opening a shard directory
# ---------------------------------------------------------------------------------------------


@dataclass
class BuildStats:
    """How long encoding took, for the progress line and the benchmark."""

    n_bytes: int
    n_tokens: int
    seconds: float
    workers: int

    @property
    def mb_per_s(self) -> float:
        return self.n_bytes / 1e6 / max(self.seconds, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / max(self.seconds, 1e-9)


def default_workers(n_bytes: int, n_shards: int) -> int:
    """Worker processes for encoding: one per available core, none for a small corpus (< 8 MB:
    starting processes would cost more than it saves), never more than there are shards."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    if n_bytes < 8 << 20:
        return 0
    return max(0, min(cores, n_shards)) if cores > 1 else 0


def _pool_context():
    import multiprocessing as mp

    # fork: a worker starts in milliseconds with the tokenizer already in memory; spawn and
    # forkserver would import torch again in every worker (seconds each). Elsewhere: spawn.
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _encode_all(
    units: list[list[Segment]],
    job: _Job,
    tmp: Path,
    workers: int,
    total: int,
    log: Callable[[str], None] | None,
) -> list[dict]:
    names = [str(tmp / f"shard-{i:05d}.bin") for i in range(len(units))]
    if workers <= 0:  # in this process (HF tokenizers still use their own threads)
        _set_job(job)
        return [encode_shard(u, n) for u, n in zip(units, names)]
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    ctx = _pool_context()
    progress = (ctx.Value("q", 0), ctx.Value("q", 0))
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before fork: no "already used" warning
    start = shown = time.perf_counter()
    try:
        with ProcessPoolExecutor(workers, ctx, _init_worker, (job, progress)) as pool:
            futures = []
            try:
                futures = [pool.submit(encode_shard, u, n) for u, n in zip(units, names)]
                while True:
                    done, left = wait(futures, timeout=0.5, return_when=FIRST_EXCEPTION)
                    if not left or any(f.exception() for f in done):
                        break
                    now = time.perf_counter()
                    if log is not None and now - shown >= 5.0 and progress[0].value > 0:
                        shown = now
                        done_bytes, done_tokens = progress[0].value, progress[1].value
                        log(_progress_line(done_bytes, total, done_tokens, now - start))
                return [f.result() for f in futures]  # the first error, if any, is raised here
            except BaseException:
                for f in futures:
                    f.cancel()
                # Ctrl-C or an error: stop the workers now rather than after their shard
                # (Python 3.14 has pool.terminate_workers(); before it, the processes map)
                for p in list((getattr(pool, "_processes", None) or {}).values()):
                    p.terminate()
                raise
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _progress_line(done: int, total: int, tokens: int, seconds: float) -> str:
    rate = done / max(seconds, 1e-9)
    eta = (total - done) / rate if rate > 0 else float("inf")
    return (
        f"  tokenized {done / 1e6:,.1f}/{total / 1e6:,.1f} MB  {rate / 1e6:.2f} MB/s  "
        f"{tokens / max(seconds, 1e-9) / 1e6:.2f}M tokens/s  ETA {eta:,.0f} s"
    )


def locked(dest: Path) -> FileLock:
    """``.DEST.lock``, a lock file a second process waits for (an OS lock: freed when this
    process ends, however it ends; none on Windows, where the atomic rename still keeps the
    directory whole)."""
    return FileLock(dest.parent / f".{dest.name}.lock", wait=True, create=True)


def build_shards(
    corpus: Corpus,
    tokenizer: Tokenizer,
    dest: str | Path,
    shard_bytes: int = SHARD_BYTES,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> BuildStats:
    """Encode ``corpus`` into the shard directory ``dest`` (replacing nothing: ``dest`` must not
    exist; see ``shards_for`` for reuse). ``workers``: processes (0 = this process; default one
    per core for a corpus of 8 MB or more). ``log`` receives progress lines."""
    dest = Path(dest)
    units = plan_shards(corpus, shard_bytes)
    total = sum(s.end - s.start for u in units for s in u)
    workers = default_workers(total, len(units)) if workers is None else workers
    dtype = shard_dtype(tokenizer.vocab_size)
    job = _Job(
        [str(p) for p in corpus.files],
        corpus.encoding,
        tokenizer.to_json(),
        dtype.str,
        # the "\n" between two files (a one-file corpus may hold no "\n" at all)
        array_encoder(tokenizer, dtype)(["\n"]).tolist() if len(corpus.files) > 1 else [],
    )
    fingerprint = corpus_fingerprint(corpus)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    if log is not None:
        how = f"{workers} processes" if workers else "this process"
        log(f"tokenizing {total / 1e6:,.1f} MB into {len(units)} shards in {how} ...")
    start = time.perf_counter()
    try:
        entries = _encode_all(units, job, tmp, workers, total, log)
        seconds = time.perf_counter() - start
        manifest = {
            "format": FORMAT,
            "what": "attnlab token shards",
            "dtype": dtype.str,
            "vocab_size": tokenizer.vocab_size,
            "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "source": fingerprint,
            "shard_bytes": shard_bytes,
            "separator": job.separator,
            "n_tokens": sum(e["n_tokens"] for e in entries),
            "n_chars": sum(e["n_chars"] for e in entries),
            "shards": entries,
        }
        atomic_write_json(tmp / MANIFEST, manifest)
        fsync_dir(tmp)
        os.rename(tmp, dest)  # fails if dest exists: never replaces anything
        fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stats = BuildStats(total, manifest["n_tokens"], seconds, workers)
    if log is not None:
        log(
            f"tokenized {total / 1e6:,.1f} MB -> {stats.n_tokens:,} tokens in {seconds:.1f} s "
            f"({stats.mb_per_s:.2f} MB/s, {stats.tokens_per_s / 1e6:.2f}M tokens/s); "
            f"shards in {dest}"
        )
    return stats


class ShardError(DataError):
    """A shard directory that cannot be used as it is (missing, partial, corrupt, stale)."""


def read_manifest(dest: str | Path) -> dict:
    path = Path(dest) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT or not isinstance(manifest.get("shards"), list):
            raise ValueError("not a token shard manifest of this version")
        np.dtype(manifest["dtype"])
        int(manifest["vocab_size"])
        for e in manifest["shards"]:
            e["n_tokens"], e["sha256"], e["segments"]  # noqa: B018 (must exist)
            if not _SHARD_NAME.fullmatch(e["file"]):  # a name in DIR, never a path elsewhere
                raise ValueError(f"bad shard name {e['file']!r}")
    except (OSError, ValueError, TypeError, KeyError) as e:
        reason = getattr(e, "strerror", None) or e
        raise ShardError(f"{path}: cannot read the token shard manifest ({reason})") from None
    return manifest


def bad_shards(dest: str | Path, manifest: dict, checksums: bool = True) -> list[tuple[int, str]]:
    """(index, what is wrong) for every shard whose file is missing, of the wrong size, or
    (``checksums``) whose SHA-256 is not the manifest's."""
    dest, itemsize = Path(dest), np.dtype(manifest["dtype"]).itemsize
    bad = []
    for i, e in enumerate(manifest["shards"]):
        path = dest / e["file"]
        try:
            size = path.stat().st_size
        except OSError:
            bad.append((i, "missing"))
            continue
        if size != e["n_tokens"] * itemsize:
            bad.append((i, f"{size} bytes, expected {e['n_tokens'] * itemsize}"))
        elif checksums:
            digest, top = _scan(path, np.dtype(manifest["dtype"]))
            if digest != e["sha256"]:
                bad.append((i, "checksum mismatch"))
            elif top >= manifest["vocab_size"]:
                bad.append(
                    (i, f"token id {top} outside the vocabulary of {manifest['vocab_size']}")
                )
    return bad


def _scan(path: Path, dtype: np.dtype) -> tuple[str, int]:
    """(SHA-256, largest token id) of a token file, read 4 MiB at a time."""
    h, top = hashlib.sha256(), -1
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
            top = max(top, int(np.frombuffer(chunk, dtype=dtype).max()))
    return h.hexdigest(), top


def repair_shards(
    dest: Path, manifest: dict, bad: list[tuple[int, str]], corpus, tokenizer
) -> None:
    """Re-encode the shards listed in ``bad`` from their text, if that text is unchanged;
    otherwise a ShardError that says which shard and why. ``corpus``: the Corpus, or a function
    that gives it (or None), called only now."""
    corpus = corpus() if callable(corpus) else corpus
    first, why = bad[0]
    where = f"{dest / manifest['shards'][first]['file']}: {why}"
    if corpus is None or corpus_fingerprint(corpus) != manifest["source"]:
        raise ShardError(
            f"{where}, and the text it was made from has changed or is not given; "
            f"delete {dest} to re-encode the corpus"
        )
    if tokenizer is None or tokenizer_sha256(tokenizer) != manifest["tokenizer_sha256"]:
        raise ShardError(f"{where}, and the tokenizer that made it is not given")
    job = _Job(
        [str(p) for p in corpus.files],
        corpus.encoding,
        tokenizer.to_json(),
        manifest["dtype"],
        manifest["separator"],
    )
    _set_job(job)
    for i, _ in bad:
        e = manifest["shards"][i]
        segments = [Segment(*s) for s in e["segments"]]
        tmp = dest / f".{e['file']}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            again = encode_shard(segments, str(tmp))
            if again["sha256"] != e["sha256"]:
                raise ShardError(
                    f"{dest / e['file']}: re-encoding gave different tokens; delete {dest}"
                )
            os.replace(tmp, dest / e["file"])  # readers keep the file they opened
        finally:
            tmp.unlink(missing_ok=True)
    fsync_dir(dest)


@dataclass
class ShardResult:
    """The shards of a corpus: where they are, whether they were reused, and their tokens."""

    dest: Path
    manifest: dict
    reused: bool
    stats: BuildStats | None  # None when reused
    check_seconds: float = 0.0

    def tokens(self) -> ShardedTokens:
        return ShardedTokens.open(self.dest, self.manifest)


def shards_for(
    corpus: Corpus,
    tokenizer: Tokenizer,
    dest: str | Path,
    shard_bytes: int = SHARD_BYTES,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> ShardResult:
    """The shards of ``corpus`` encoded by ``tokenizer`` in ``dest``: reused when ``dest`` holds
    them for the same files (sizes and mtimes) and tokenizer, repaired when a shard is damaged,
    built otherwise. Safe when several processes ask at once: one builds, the others wait."""
    dest = Path(dest)
    with locked(dest):
        if dest.exists():
            start = time.perf_counter()
            try:
                manifest = read_manifest(dest)
            except ShardError:
                manifest = None
            if manifest is not None and _matches(manifest, corpus, tokenizer, shard_bytes):
                bad = bad_shards(dest, manifest)
                if bad:
                    if log is not None:
                        log(f"{dest}: {len(bad)} damaged shard(s); re-encoding them")
                    repair_shards(dest, manifest, bad, corpus, tokenizer)
                seconds = time.perf_counter() - start
                if log is not None:
                    log(
                        f"reusing {manifest['n_tokens']:,} tokens in {len(manifest['shards'])} "
                        f"shards from {dest} (checked in {seconds:.1f} s)"
                    )
                return ShardResult(dest, manifest, True, None, seconds)
            # another corpus or tokenizer, or a broken directory: set it aside, then rebuild
            trash = dest.parent / f".{dest.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(dest, trash)
            shutil.rmtree(trash, ignore_errors=True)
        stats = build_shards(corpus, tokenizer, dest, shard_bytes, workers, log)
        return ShardResult(dest, read_manifest(dest), False, stats)


def _matches(manifest: dict, corpus: Corpus, tokenizer: Tokenizer, shard_bytes: int) -> bool:
    return (
        manifest.get("source") == corpus_fingerprint(corpus)
        and manifest.get("tokenizer_sha256") == tokenizer_sha256(tokenizer)
        and manifest.get("shard_bytes") == shard_bytes
    )


def open_shards(
    dest: str | Path,
    tokenizer: Tokenizer | None = None,
    corpus: Corpus | Callable[[], Corpus | None] | None = None,
    log: Callable[[str], None] | None = None,
) -> ShardResult:
    """The shards already in ``dest`` (a resumed run's), checked against ``tokenizer``; damaged
    shards are re-encoded when ``corpus`` is the unchanged text they came from."""
    dest = Path(dest)
    with locked(dest):
        manifest = read_manifest(dest)
        if tokenizer is not None and manifest["tokenizer_sha256"] != tokenizer_sha256(tokenizer):
            raise ShardError(f"{dest}: these token shards were made by another tokenizer")
        start = time.perf_counter()
        bad = bad_shards(dest, manifest)
        if bad:
            if log is not None:
                log(f"{dest}: {len(bad)} damaged shard(s); re-encoding them")
            repair_shards(dest, manifest, bad, corpus, tokenizer)
        return ShardResult(dest, manifest, True, None, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# Reading: the shards as one array of tokens
# ---------------------------------------------------------------------------------------------


class ShardedTokens:
    """Token files read as one 1-D array, without mapping or loading them.

    ``len(t)``, ``t[i]``, ``t[a:b]`` (another ShardedTokens over the same files) and ``t[idx]``
    for an integer array ``idx`` of any shape (the windows of a batch: each row a run of
    consecutive positions) behave as on a numpy array holding the concatenated files. Reads
    are ``pread`` calls, one per run of consecutive positions.
    """

    def __init__(self, parts: list[tuple[str, int, int]], dtype: np.dtype):
        """``parts``: (file, first token, end token) ranges, in order."""
        self.parts = [(str(f), int(a), int(b)) for f, a, b in parts if b > a]
        self.dtype = np.dtype(dtype)
        sizes = np.array([b - a for _, a, b in self.parts], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])  # (P + 1,)
        self._fds: dict[str, int] = {}

    @classmethod
    def open(cls, dest: str | Path, manifest: dict | None = None) -> ShardedTokens:
        dest = Path(dest)
        manifest = manifest or read_manifest(dest)
        parts = [(dest / e["file"], 0, e["n_tokens"]) for e in manifest["shards"]]
        return cls(parts, np.dtype(manifest["dtype"]))

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getstate__(self):  # file descriptors do not travel
        return {**self.__dict__, "_fds": {}}

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            if len(self._fds) >= 64:  # keep few files open, however many shards there are
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` as a new array."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"tokens [{start}, {stop}) outside [0, {len(self)})")
        out = np.empty(stop - start, dtype=self.dtype)
        size = self.dtype.itemsize
        p = int(np.searchsorted(self.starts, start, side="right")) - 1
        pos = start
        while pos < stop:
            path, a, b = self.parts[p]
            lo = a + pos - int(self.starts[p])
            n = min(stop - pos, b - lo)
            raw = os.pread(self._fd(path), n * size, lo * size)
            if len(raw) != n * size:
                raise ShardError(f"{path}: shorter than its manifest says (truncated?)")
            out[pos - start : pos - start + n] = np.frombuffer(raw, dtype=self.dtype)
            pos, p = pos + n, p + 1
        return out

    def __getitem__(self, key):
        if isinstance(key, slice):
            a, b, step = key.indices(len(self))
            if step != 1:
                raise IndexError("ShardedTokens slices take step 1")
            return self._view(a, max(a, b))
        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if key < 0 else 0)
            return self.read(i, i + 1)[0]
        idx = np.asarray(key, dtype=np.int64)
        if idx.size == 0:
            return np.zeros(idx.shape, dtype=self.dtype)
        flat = np.unique(idx)  # sorted; runs of consecutive positions are read at once
        breaks = np.flatnonzero(np.diff(flat) != 1) + 1
        runs = np.split(flat, breaks)
        values = np.concatenate([self.read(int(r[0]), int(r[-1]) + 1) for r in runs])
        return values[np.searchsorted(flat, idx)]

    def _view(self, a: int, b: int) -> ShardedTokens:
        parts = []
        for p, (path, lo, hi) in enumerate(self.parts):
            s = int(self.starts[p])
            x, y = max(a, s), min(b, s + hi - lo)
            if x < y:
                parts.append((path, lo + x - s, lo + y - s))
        return ShardedTokens(parts, self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(t)``: every token, read at once (meant for a short slice)."""
        out = self.read(0, len(self))
        return out if dtype is None else out.astype(dtype)

    def split_tails(self, fraction: float) -> tuple[ShardedTokens, ShardedTokens]:
        """(heads, tails): the last ``fraction`` of every part, and the rest.

        Held-out text spread over the whole corpus, one piece per shard; the same pieces
        whatever the number of workers, as long as the files and shard size are the same."""
        heads, tails = [], []
        for path, a, b in self.parts:
            cut = b - int((b - a) * fraction)
            heads.append((path, a, cut))
            tails.append((path, cut, b))
        return ShardedTokens(heads, self.dtype), ShardedTokens(tails, self.dtype)
