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
    """``attnlab translate RUN TEXT...``: greedy, beam search (--beam) or sampling
    (--temperature > 0); one line per output on stdout."""
    from attnlab.cli import UsageError
    from attnlab.cli.lm import decoding_settings
    from attnlab.generation import beam_generate
    from attnlab.generation import generate as sample
    from attnlab.generation import translate as run_translate

    cfg = decoding_settings(args, args.max_len)
    if args.max_len is not None and args.max_len < 1:
        raise UsageError(f"--max-len must be positive, got {args.max_len}")
    model, tok, _ = _load(args.run)
    texts = args.text if args.text != ["-"] else [ln.rstrip("\n") for ln in sys.stdin]
    limit = getattr(model.config, "max_len", None)
    for t in texts:
        if limit and len(tok.encode_source(t)) > limit:
            raise UsageError(f"source of {len(tok.encode_source(t))} tokens is longer than the "
                             f"model's {limit} positions: {t[:40]!r}")  # fmt: skip
    sampled = cfg.temperature > 0 or cfg.repetition_penalty != 1.0 or args.stop
    if args.beam is not None:
        best = beam_generate(model, tok, texts, args.beam, args.alpha, args.max_len,
                             n_best=args.num_samples)  # fmt: skip
        lines = [s.text for row in best for s in row]
    elif sampled or args.num_samples > 1:
        samples = sample(model, tok, texts, cfg, stop=args.stop or (), num_samples=args.num_samples)
        lines = [s.text for s in samples]
    else:
        lines = run_translate(model, tok, texts, 1, args.alpha, args.max_len)
    for line in lines:
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
    from attnlab.cli.lm import add_sampling_options

    p = sub.add_parser("translate", help="translate text with a trained encoder-decoder run",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Decode each TEXT (or stdin lines with '-') with the run's "
                       "model: greedy by default, beam search with --beam N, sampling with "
                       "--temperature T > 0 (--seed, --top-k, --top-p, --num-samples). One "
                       "line per output.")  # fmt: skip
    p.add_argument("run", help="run directory trained with --task seq2seq")
    p.add_argument("text", nargs="+", help="source text(s); '-' reads one per line from stdin")
    p.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="longest output, in tokens (None: twice the source + 10)",
    )
    add_sampling_options(p.add_argument, temperature=0.0)
    p.set_defaults(func=translate)
