"""`attnlab import-hf DIR --out RUN`: a Hugging Face model directory of any family attnlab
reads (``attnlab.interop``) written as a run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cli import Verb, register


def import_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import import_hf as do_import

    src = Path(args.dir)
    if not src.exists() and args.dir == "minilm":
        from attnlab.interop.minilm import minilm_dir

        src = minilm_dir()
    from attnlab.heartbeat import Heartbeat

    with Heartbeat(f"importing {src}"):  # a large model: a line every 2 s
        out = do_import(src, args.out, args.dtype)
    print(f"imported {src} -> {out}", file=sys.stderr, flush=True)
    print(out)
    return 0


def add(sub) -> None:
    from attnlab.interop.hf import families, loaders  # each family's module, found

    labels = ", ".join(f.label for f in families().values())
    p = sub.add_parser(
        "import-hf",
        help=f"convert a Hugging Face model directory ({labels}) into a run directory",
        description="Read a Hugging Face model directory (config.json, model.safetensors or "
        "its shards with model.safetensors.index.json; tokenizer.json (byte-level BPE or SentencePiece-derived) or "
        "vocab.txt; preprocessor_config.json for a ViT) and write an "
        "attnlab run directory. model_type: " + ", ".join(loaders()) + ". Float32, float16 and "
        "bfloat16 weights; pickle weights are refused. DIR 'minilm' names the installed "
        "all-MiniLM-L6-v2 (attnlab[models]).",
    )
    p.add_argument("dir", help="Hugging Face model directory")
    p.add_argument("--out", required=True, help="run directory to write")
    p.add_argument("--dtype", choices=("auto", "float32"), default="auto",
                   help="auto: bfloat16 weights of a decoder (Llama, Qwen, Gemma, ...) stay "
                   "bfloat16 and are computed in it, as transformers does, so the run is the "
                   "size of the file; float32: compute in float32 (twice the memory)")  # fmt: skip
    p.set_defaults(func=import_hf)


VERB = register(Verb("import-hf", 110, add, runs="nothing", dtype="weights"))
