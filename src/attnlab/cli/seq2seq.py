"""Encoder-decoder verbs: ``translate`` and ``eval`` (``train --task seq2seq`` is cli/train.py)."""

from __future__ import annotations

import argparse
import json
import sys


def _load(run: str, device: str = "cpu"):
    """An encoder-decoder run on ``device`` (a name for runtime.resolve_device: a device this
    machine lacks is a ConfigError, one line and exit 2)."""
    from attnlab.checkpoint import RunError, load_run, read_run_config
    from attnlab.runtime import resolve_device
    from attnlab.tokenizers import PairTokenizer

    model, tok = load_run(run, resolve_device(device))
    if not isinstance(tok, PairTokenizer) or not hasattr(model, "start"):
        raise RunError(f"{run}: not an encoder-decoder run (train one with --task seq2seq)")
    return model, tok, read_run_config(run)


def translate(args: argparse.Namespace) -> int:
    from attnlab.cli import UsageError
    from attnlab.decoding import translate as run_translate

    if args.beam < 1:
        raise UsageError("--beam must be >= 1")
    model, tok, _ = _load(args.run)
    texts = args.text if args.text != ["-"] else [ln.rstrip("\n") for ln in sys.stdin]
    limit = getattr(model.config, "max_len", None)
    for t in texts:
        if limit and len(tok.encode_source(t)) > limit:
            raise UsageError(f"source of {len(tok.encode_source(t))} tokens is longer than the "
                             f"model's {limit} positions: {t[:40]!r}")  # fmt: skip
    for line in run_translate(model, tok, texts, args.beam, args.alpha, args.max_len):
        print(line)
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """``attnlab eval RUN`` on an encoder-decoder run: exact match and token accuracy."""
    from attnlab.cli import UsageError
    from attnlab.data.tasks import rebuild
    from attnlab.tasks.seq2seq import score_pairs

    if args.beam < 1:
        raise UsageError("--beam must be >= 1")
    model, tok, cfg = _load(args.run, args.device)
    if "data" not in cfg:
        raise UsageError(f"{args.run}: config.json does not say which data it was trained on")
    pairs = rebuild(cfg["data"]).split(args.split)  # a changed or missing TSV: a DataError
    if args.limit:
        pairs = pairs[: args.limit]
    r = score_pairs(model, tok, pairs, beam=args.beam, alpha=args.alpha)
    if args.json:
        print(json.dumps({"split": args.split, "beam": args.beam, **r}))
    else:
        print(f"{args.split}: {r['n']} pairs  exact match {r['exact']:.2%}  "
              f"token accuracy {r['token_acc']:.2%}  loss {r['loss']:.4f}")  # fmt: skip
    return 0


def register(sub) -> None:
    """Add ``translate`` (``eval`` of a seq2seq run is the shared verb in cli/lm.py)."""
    p = sub.add_parser("translate", help="translate text with a trained encoder-decoder run",
                       description="Decode each TEXT (or stdin lines with '-') with the run's "
                       "model: greedy by default, beam search with --beam N.")  # fmt: skip
    p.add_argument("run", help="run directory trained with --task seq2seq")
    p.add_argument("text", nargs="+", help="source text(s); '-' reads one per line from stdin")
    p.add_argument("--beam", type=int, default=1, help="beam width (1 = greedy)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    p.add_argument("--max-len", type=int, default=None, help="longest output, in tokens")
    p.set_defaults(func=translate)
