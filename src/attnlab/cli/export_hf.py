"""`attnlab export-hf RUN DIR`: a GPT or encoder run written as a directory transformers'
``from_pretrained`` loads (``attnlab.interop.hf.export_hf``)."""

from __future__ import annotations

import argparse
import sys

from attnlab.cli import Verb, register


def export_hf(args: argparse.Namespace) -> int:
    from attnlab.heartbeat import Heartbeat
    from attnlab.interop.hf import export_hf as do_export
    from attnlab.interop.hf_files import read_hf_config

    with Heartbeat(f"exporting {args.run}"):
        out = do_export(args.run, args.dir)
    cfg = read_hf_config(out)  # the Hugging Face directory it wrote
    print(f"exported {args.run} -> {out} ({cfg['architectures'][0]}.from_pretrained and "
          "AutoTokenizer.from_pretrained load it)", file=sys.stderr, flush=True)  # fmt: skip
    print(out)
    return 0


def add(sub) -> None:
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


VERB = register(Verb("export-hf", 120, add, runs="nothing"))
