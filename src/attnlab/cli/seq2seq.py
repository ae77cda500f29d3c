"""Encoder-decoder verbs: ``train --task seq2seq`` (via cli/train.py), ``translate``, ``eval``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _data_errors():
    from attnlab.cli import UsageError
    from attnlab.data.tasks import DataError

    return UsageError, DataError


def _device(name: str) -> str:
    from attnlab.cli import UsageError
    from attnlab.config import ConfigError
    from attnlab.runtime import resolve_device

    try:
        return str(resolve_device(name))
    except ConfigError as e:
        raise UsageError(str(e)) from None


def train(args: argparse.Namespace) -> int:
    """``attnlab train --task seq2seq --data dates|copy|reverse|sort|addition|FILE.tsv``."""
    UsageError, DataError = _data_errors()
    from attnlab.data import tasks
    from attnlab.seq2seq_training import TrainSettings, build_model
    from attnlab.seq2seq_training import train as run_training

    if args.resume or args.compile or args.dtype not in ("auto", "float32") or args.grad_accum != 1:
        raise UsageError("seq2seq training does not support --resume, --compile, --grad-accum or "
                         "--dtype other than float32 yet")  # fmt: skip
    if args.arch != "transformer" and (args.n_head or args.norm or args.pos):
        raise UsageError("--n-head, --norm and --pos apply to --arch transformer only")
    if args.pos and args.pos != "sinusoidal":
        raise UsageError("the seq2seq Transformer uses sinusoidal positions")
    if args.schedule == "noam" and args.warmup_iters < 1:
        raise UsageError("--schedule noam needs --warmup-iters >= 1")
    try:
        data = tasks.load_data(args.data, args.seed, args.val_fraction, args.encoding)
        src_kind = args.src_tokenizer or args.tokenizer
        tgt_kind = args.tgt_tokenizer or args.tokenizer
        tok = tasks.build_pair_tokenizer(data, src_kind, tgt_kind, args.vocab_size, args.min_freq)
    except DataError as e:
        raise UsageError(str(e)) from None
    longest = max(max(len(tok.encode_source(s)), len(tok.encode_target(t)) + 1)
                  for split in (data.train, data.val, data.test) for s, t in split)  # fmt: skip
    model = build_model(
        args.arch, tok, max(256, 2 * longest + 16), n_layer=args.n_layer, n_head=args.n_head,
        d_model=args.d_model, dropout=args.dropout, norm=args.norm, score=args.score,
        label_smoothing=args.label_smoothing,
    )  # fmt: skip
    s = TrainSettings(
        max_iters=args.max_iters, batch_size=args.batch_size, lr=args.lr, min_lr=args.min_lr,
        warmup_iters=args.warmup_iters, lr_decay_iters=args.lr_decay_iters,
        schedule=args.schedule, weight_decay=args.weight_decay, beta2=args.beta2,
        grad_clip=args.grad_clip, eval_interval=args.eval_interval,
        log_interval=args.log_interval, seed=args.seed, device=_device(args.device),
        quiet=args.quiet,
    )  # fmt: skip
    out = Path(args.out or f"runs/{data.name}-{args.arch}")
    extra = {"task": "seq2seq", "arch": args.arch, "data": data.recipe}
    best = run_training(model, tok, data, out, s, extra)
    print(f"{out}: val exact match {best['val_exact']:.1%}, token accuracy "
          f"{best['val_token_acc']:.1%} (step {best['step']}, {best['train_time_s']:.0f}s); "
          f"test it with: attnlab eval {out}")  # fmt: skip
    return 0


def _load(run: str):
    from attnlab.checkpoint import RunError, load_run, read_run_config
    from attnlab.tokenizers import PairTokenizer

    model, tok = load_run(run)
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
    UsageError, DataError = _data_errors()
    from attnlab.data.tasks import rebuild
    from attnlab.seq2seq_training import evaluate as run_eval

    if args.beam < 1:
        raise UsageError("--beam must be >= 1")
    model, tok, cfg = _load(args.run)
    if "data" not in cfg:
        raise UsageError(f"{args.run}: config.json does not say which data it was trained on")
    try:
        pairs = rebuild(cfg["data"]).split(args.split)
    except DataError as e:
        raise UsageError(str(e)) from None
    if args.limit:
        pairs = pairs[: args.limit]
    r = run_eval(model, tok, pairs, beam=args.beam, alpha=args.alpha)
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
