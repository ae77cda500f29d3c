"""`attnlab translate RUN TEXT...`: an encoder-decoder run's output for each source text, one
per line: ``Run.translate`` (greedy as ``predict``, beam search, or sampling with ``generate``'s
decoding options)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from attnlab.cli import Verb, register


def _load(run: str, device: str = "cpu"):
    """The encoder-decoder run (an ``attnlab.run.Run``), refused otherwise in one line."""
    from attnlab.cli.predict import open_run
    from attnlab.rundir import RunError

    r = open_run(run, device)
    if r.model.predicts != "decoder-step":
        raise RunError(f"{run}: not an encoder-decoder run (train one with --task seq2seq); "
                       "`attnlab predict` answers for any run")  # fmt: skip
    return r


def translate(args: argparse.Namespace) -> int:
    """``attnlab translate RUN TEXT...``: greedy, beam search (--beam) or sampling
    (--temperature > 0); one line per output on stdout."""
    from attnlab.cli import UsageError
    from attnlab.cli.generate import decoding_settings
    from attnlab.models.declare import max_positions

    cfg = decoding_settings(args, args.max_len)
    if args.max_len is not None and args.max_len < 1:
        raise UsageError(f"--max-len must be positive, got {args.max_len}")
    run = _load(args.run, args.device)
    model, tok = run
    texts = args.text if args.text != ["-"] else [ln.rstrip("\n") for ln in sys.stdin]
    limit = max_positions(model)  # a Transformer's max_len; an LSTM reads any length
    for t in texts:
        if limit and len(tok.encode_source(t)) > limit:
            raise UsageError(f"source of {len(tok.encode_source(t))} tokens is longer than the "
                             f"model's {limit} positions: {t[:40]!r}")  # fmt: skip
    from attnlab.cli.limits import check_decoding_memory
    from attnlab.generation import default_max_len

    longest = max((len(tok.encode_source(t)) for t in texts), default=1)
    rows = len(texts) * (args.beam if args.beam is not None else args.num_samples)
    check_decoding_memory(model, rows, longest, default_max_len(model, longest, args.max_len))
    sampling = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "max_new_tokens"}
    rows = run.translate(texts, beam=args.beam, alpha=args.alpha, max_len=args.max_len,
                         num_samples=args.num_samples, stop=args.stop or (), **sampling)  # fmt: skip
    if args.json:
        print(json.dumps({"about": run.about, "outputs": rows}, ensure_ascii=False))
        return 0
    for row in rows:
        print(row["output"])
    return 0


def add(sub) -> None:
    from attnlab.cli.generate import add_sampling_options

    p = sub.add_parser("translate", help=VERB.help,
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
        help="longest output, in tokens (default: twice the source + 10)",
    )
    add_sampling_options(p.add_argument, temperature=0.0)
    p.set_defaults(func=translate)


VERB = register(
    Verb("translate", 140, add, help="translate text with a trained encoder-decoder run", data=True)
)
