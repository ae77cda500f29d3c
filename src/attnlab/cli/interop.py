"""Verbs for other formats and the encoder: import-hf, export-hf, embed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.cli import UsageError


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# import-hf / export-hf / embed
# ---------------------------------------------------------------------------------------------


def import_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import import_hf as do_import

    src = Path(args.dir)
    if not src.exists() and args.dir == "minilm":
        from attnlab.interop.minilm import minilm_dir

        src = minilm_dir()
    from attnlab.heartbeat import Heartbeat

    with Heartbeat(f"importing {src}"):  # a large model: a line every 2 s
        out = do_import(src, args.out, args.dtype)
    _err(f"imported {src} -> {out}")
    print(out)
    return 0


def export_hf(args: argparse.Namespace) -> int:
    from attnlab.heartbeat import Heartbeat
    from attnlab.interop.hf import export_hf as do_export

    with Heartbeat(f"exporting {args.run}"):
        out = do_export(args.run, args.dir)
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    _err(f"exported {args.run} -> {out} ({cfg['architectures'][0]}.from_pretrained and "
         "AutoTokenizer.from_pretrained load it)")  # fmt: skip
    print(out)
    return 0


def embed(args: argparse.Namespace) -> int:
    from attnlab.embeddings import sentence_embeddings
    from attnlab.run import load_run

    run = load_run(args.run, args.device)
    model, tokenizer = run
    if not model.sentence_embedding:
        raise UsageError(f"{args.run}: embed needs an encoder run, not {model.model_type!r}")
    if tokenizer is None:
        raise UsageError(f"{args.run}: the run has no tokenizer.json")
    default = run.config.get("sentence_embedding", {})
    pool = args.pool or default.get("pool", "mean")
    emb = sentence_embeddings(model, tokenizer, args.text, pool=pool, normalize=args.normalize)
    rows = [[round(float(v), 7) for v in row] for row in emb]
    print(json.dumps(rows[0] if len(rows) == 1 else rows))
    return 0


# the model_types import-hf reads (interop/hf.py LOADERS, once every family module has
# registered; a test keeps the two equal without importing interop at start-up)
IMPORTED_TYPES = (
    "gpt2, bert, llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, gpt_neox, t5, vit"
)


def register(sub) -> None:
    p = sub.add_parser(
        "import-hf",
        help="convert a Hugging Face model directory (GPT-2, BERT, Llama, Mistral, Qwen2/3, "
        "Gemma 1-3, Pythia, T5, ViT) into a run directory",
        description="Read a Hugging Face model directory (config.json, model.safetensors or "
        "its shards with model.safetensors.index.json; tokenizer.json (byte-level BPE or SentencePiece-derived) or "
        "vocab.txt; preprocessor_config.json for a ViT) and write an "
        "attnlab run directory. model_type: " + IMPORTED_TYPES + ". Float32, float16 and "
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

    p = sub.add_parser(
        "export-hf",
        help="write a GPT or encoder run as a Hugging Face directory (GPT-2, Llama, Qwen, BERT)",
        description="Write RUN as a directory transformers loads: a GPT (learned positions, "
        "pre-norm) as GPT2LMHeadModel; one with RMSNorm, a gated feed-forward and rotary "
        "positions (train --arch llama) as LlamaForCausalLM (Qwen2 with q/k/v biases, Qwen3 "
        "with QK-norm); an encoder (learned positions, post-norm, gelu) as "
        "BertForMaskedLM, BertForSequenceClassification or BertModel, by its head. The "
        "tokenizer goes with it (tokenizer.json, tokenizer_config.json): "
        "AutoTokenizer.from_pretrained gives attnlab's ids for any text. A character the "
        "vocabulary lacks maps to <unk> where the tokenizer has one, and is refused by both "
        "attnlab and transformers where it has none (a GPT's char tokenizer).",
    )
    p.add_argument("run", help="attnlab run directory")
    p.add_argument("dir", help="directory to write")
    p.set_defaults(func=export_hf)

    p = sub.add_parser(
        "embed",
        help="sentence embedding from an encoder run (JSON list on stdout)",
        description="Print the sentence embedding of each TEXT as JSON: one list for one text, "
        "a list of lists for several. Mean pooling averages the real tokens' last hidden states "
        "([CLS] and [SEP] included, padding excluded); cls takes the first token's state.",
    )
    p.add_argument("run", help="encoder run directory (trained or imported)")
    p.add_argument("text", nargs="+", help="text(s) to embed")
    p.add_argument(
        "--pool",
        choices=["mean", "cls"],
        default=None,
        help="pooling (default: the run's sentence-transformers setting, else mean)",
    )
    p.add_argument("--normalize", action="store_true", help="scale each embedding to unit length")
    p.set_defaults(func=embed)
