"""`attnlab translate RUN TEXT...`: an encoder-decoder run's output for each source text.
Greedy and beam translations are ``predict``'s (``Seq2Seq.predict``), one output per line;
sampling is ``attnlab.generation``'s, with ``generate``'s decoding options."""

from __future__ import annotations

import argparse
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
    from attnlab.generation import beam_generate
    from attnlab.generation import generate as sample

    cfg = decoding_settings(args, args.max_len)
    if args.max_len is not None and args.max_len < 1:
        raise UsageError(f"--max-len must be positive, got {args.max_len}")
    run = _load(args.run, args.device)
    model, tok = run
    texts = args.text if args.text != ["-"] else [ln.rstrip("\n") for ln in sys.stdin]
    limit = getattr(model.config, "max_len", None)
    for t in texts:
        if limit and len(tok.encode_source(t)) > limit:
            raise UsageError(f"source of {len(tok.encode_source(t))} tokens is longer than the "
                             f"model's {limit} positions: {t[:40]!r}")  # fmt: skip
    from attnlab.cli.limits import check_decoding_memory
    from attnlab.generation import default_max_len

    longest = max((len(tok.encode_source(t)) for t in texts), default=1)
    rows = len(texts) * (args.beam if args.beam is not None else args.num_samples)
    check_decoding_memory(model, rows, longest, default_max_len(model, longest, args.max_len))
    sampled = cfg.temperature > 0 or cfg.repetition_penalty != 1.0 or args.stop
    if args.beam is not None:
        best = beam_generate(model, tok, texts, args.beam, args.alpha, args.max_len,
                             n_best=args.num_samples)  # fmt: skip
        lines = [s.text for row in best for s in row]
        sources = [s.prompt for row in best for s in row]
    elif sampled or args.num_samples > 1:
        samples = sample(model, tok, texts, cfg, stop=args.stop or (), num_samples=args.num_samples)
        lines = [s.text for s in samples]
        sources = [s.prompt for s in samples]
    else:  # greedy: predict's answer
        lines = [p["output"] for p in run.predict(texts, alpha=args.alpha, max_len=args.max_len)]
        sources = texts
    if args.json:
        rows = [{"source": src, "output": out} for src, out in zip(sources, lines)]
        print(json.dumps({"about": run.about, "outputs": rows}, ensure_ascii=False))
        return 0
    for line in lines:
        print(line)
    return 0


def add(sub) -> None:
    from attnlab.cli.generate import add_sampling_options

    p = sub.add_parser("translate", help="translate text with a trained encoder-decoder run",
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


VERB = register(Verb("translate", 140, add))
