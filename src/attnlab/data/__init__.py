"""Data: text corpora and token datasets.

- ``corpus``: a file, a directory of ``.txt`` files or a built-in corpus (``shakespeare``),
  checked and read in chunks; ``DataError`` for anything unusable.
- ``tokens``: the corpus encoded once into a memory-mapped token file; random windows for
  language modelling, fixed batches for evaluation.
- ``batches``: padding, and random / epoch batch sources that resume exactly.
- ``tasks``: generated sequence-to-sequence tasks and parallel corpora.
- ``images`` (import it on its own): the built-in ``digits`` or a ``DIR/<label>/*.png`` folder,
  a seeded train/val/test split, and the ``ImageTokenizer`` a ViT run stores.
"""

from attnlab.data.corpus import (
    BUILTIN,
    Corpus,
    DataError,
    corpus_name,
    fingerprint,
    load_text,
    open_corpus,
)
from attnlab.data.tokens import (
    RandomWindows,
    TokenFileInfo,
    encode_to_file,
    fixed_batches,
    read_token_file,
    sequential_batches,
    split_tokens,
    token_dtype,
    windows,
)

__all__ = [
    "BUILTIN",
    "Corpus",
    "DataError",
    "RandomWindows",
    "TokenFileInfo",
    "corpus_name",
    "fingerprint",
    "encode_to_file",
    "fixed_batches",
    "load_text",
    "open_corpus",
    "read_token_file",
    "sequential_batches",
    "split_tokens",
    "token_dtype",
    "windows",
]
