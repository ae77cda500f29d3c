"""`attnlab train`: one verb for every task; ``--task`` picks the library function."""

from __future__ import annotations

import argparse
import importlib

# task -> "module:function(args)"; each function validates its own options.
TASKS = {
    "lm": "attnlab.cli.lm:train",
    "mlm": "attnlab.cli.interop:train_mlm",
    "classify": "attnlab.cli.interop:train_classify",
    "seq2seq": "attnlab.cli.seq2seq:train",
}


def run(args: argparse.Namespace) -> int:
    from attnlab.cli import UsageError

    task = args.task
    if args.arch == "vit" and task != "classify":
        raise UsageError("--arch vit trains an image classifier: use --task classify")
    if (task == "classify" and args.arch == "vit") or _is_image_data(args):
        module, name = "attnlab.cli.vision", "train_vit"  # images: a vision transformer
    else:
        module, name = TASKS[task].split(":")
    return getattr(importlib.import_module(module), name)(args)


def _is_image_data(args: argparse.Namespace) -> bool:
    """--task classify on the built-in digits or on a DIR/<label>/*.png folder of images."""
    from attnlab.data.images import is_image_data

    return args.task == "classify" and is_image_data(args.data)


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on a text, a task or a TSV file",
        description="Train a model. --task lm (default) trains a GPT on next-token prediction; "
        "mlm and classify train a BERT-style encoder; classify on images (--data digits or "
        "DIR/<label>/*.png, or --arch vit) trains a vision transformer; seq2seq trains an "
        "encoder-decoder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.set_defaults(func=run)
    a = p.add_argument
    a(
        "--task",
        choices=sorted(TASKS),
        default="lm",
        help="what to train (classify on images, e.g. --data digits, trains a ViT)",
    )
    a(
        "--data",
        required=True,
        help="a text file, a directory of .txt files, a built-in corpus or task",
    )
    a("--out", default=None, help="run directory to write (default runs/<data name>)")
    a("--encoding", default="utf-8", help="text encoding of the data files")
    a(
        "--tokenizer",
        choices=["char", "word", "bpe", "wordpiece"],
        default="char",
        help="tokenizer to build (wordpiece: encoder tasks only)",
    )
    a("--vocab-size", type=int, default=512, help="BPE vocabulary size")
    a("--min-freq", type=int, default=1, help="word tokenizer: rarer words become <unk>")
    a("--preset", default="baby", help="model size preset: baby, small, gpt2")
    # model overrides (None = take the preset's)
    a("--n-layer", type=int)
    a("--n-head", type=int)
    a("--d-model", type=int)
    a("--block-size", type=int)
    a("--dropout", type=float)
    a("--pos", choices=["learned", "sinusoidal", "rotary"])
    a("--norm", choices=["pre", "post"], help="pre-norm (GPT-2) or post-norm (the paper, BERT)")
    # optimisation
    a("--max-iters", type=int, default=2000)
    a("--batch-size", type=int, default=12)
    a("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    a("--lr", type=float, default=1e-3)
    a("--min-lr", type=float, default=1e-4)
    a("--warmup-iters", type=int, default=100)
    a("--lr-decay-iters", type=int, default=None, help="default: --max-iters")
    a("--weight-decay", type=float, default=0.1)
    a("--beta2", type=float, default=0.99)
    a("--grad-clip", type=float, default=1.0)
    a("--eval-interval", type=int, default=250)
    a("--eval-iters", type=int, default=20)
    a("--log-interval", type=int, default=10)
    a("--val-fraction", type=float, default=0.1)
    a("--seed", type=int, default=1337)
    a("--device", default="auto", help="cpu, cuda, or auto")
    a("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--resume", action="store_true", help="continue from the checkpoint in --out")
    a("--quiet", action="store_true", help="no progress bar")
    # encoder-decoder
    a(
        "--arch",
        choices=["transformer", "lstm-attention", "lstm", "vit"],
        default="transformer",
        help="seq2seq architecture, or vit (a vision transformer) for --task classify on images",
    )
    a("--patch-size", type=int, help="--arch vit: side of a square patch in pixels (default 2)")
    a(
        "--score",
        choices=["dot", "general", "additive"],
        default="dot",
        help="LSTM attention score",
    )
    a("--label-smoothing", type=float, default=0.0)
    a("--schedule", choices=["cosine", "noam"], default="cosine", help="learning-rate schedule")
    a("--src-tokenizer", choices=["char", "word", "bpe"], default=None, help="seq2seq TSV source")
    a("--tgt-tokenizer", choices=["char", "word", "bpe"], default=None, help="seq2seq TSV target")
