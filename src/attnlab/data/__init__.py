"""Data: text corpora and token datasets.

- ``corpus``: a file, a directory of ``.txt`` files or a built-in corpus (``shakespeare``;
  ``sentences``, the word-level toy corpus of ``sentences``), checked and read in chunks;
  ``DataError`` for anything unusable.
- ``tokens``: the corpus encoded once into a memory-mapped token file; random windows for
  language modelling, fixed batches for evaluation.
- ``batches``: padding, and random / epoch batch sources that resume exactly.
- ``tasks``: generated sequence-to-sequence tasks and parallel corpora.
- ``shards``: a corpus of any size encoded in parallel into token shards with a manifest,
  checked and reused; ``ShardedTokens`` reads them as one array without loading them.
- ``epochs``: windows read once per epoch in a shuffled order, resumable mid-epoch.
- ``stream``: the language-model pipeline over those: tokenizer (on a bounded sample for a large
  corpus), shards (cached and reused), held-out split, batches (``prepare_lm_tokens``).
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
from attnlab.data.epochs import EpochWindows
from attnlab.data.shards import ShardedTokens, ShardError
from attnlab.data.stream import (
    TOKENS_DIR,
    LMTokens,
    lm_batches,
    prepare_lm_tokens,
    reopen_lm_tokens,
    split_held_out,
    streams,
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
    "EpochWindows",
    "LMTokens",
    "RandomWindows",
    "ShardError",
    "ShardedTokens",
    "TOKENS_DIR",
    "TokenFileInfo",
    "corpus_name",
    "fingerprint",
    "encode_to_file",
    "fixed_batches",
    "lm_batches",
    "load_text",
    "open_corpus",
    "prepare_lm_tokens",
    "read_token_file",
    "reopen_lm_tokens",
    "sequential_batches",
    "split_held_out",
    "streams",
    "split_tokens",
    "token_dtype",
    "windows",
]
