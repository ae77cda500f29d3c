"""`attnlab lens RUN TEXT`: the logit lens (or the run's tuned lens) at every layer; with
``--train-tuned --data FILE`` it fits the tuned lens and saves it in the run (``Run.lens``)."""

from __future__ import annotations

import sys

from attnlab.cli import UsageError, Verb, output_file, register
from attnlab.cli.common import load, show


def cmd_lens(args) -> int:
    from attnlab.interventions import fit_tuned_lens
    from attnlab.interventions.lens import describe_fit

    args._png = output_file(args.png, ".png", "--png")
    if args.train_tuned:
        if args.data is None:
            raise UsageError("--train-tuned needs --data FILE (the text to fit the probes on)")
        if args.max_tokens < 2:
            raise UsageError(f"--max-tokens must be at least 2, got {args.max_tokens}")
        if args.ridge < 0:
            raise UsageError(f"--ridge must be >= 0, got {args.ridge}")
        if args.png and args.text is None:
            raise UsageError("--png draws the lens of TEXT: give TEXT too")
    elif args.text is None:
        raise UsageError("give TEXT to read with the lens (or --train-tuned --data FILE)")
    elif args.data is not None:
        raise UsageError("--data is for --train-tuned")
    run = load(args)
    if args.train_tuned:
        tuned = fit_tuned_lens(run.subject, args.data, args.max_tokens, args.ridge,
                               quiet=args.quiet)  # fmt: skip
        files = tuned.save(args.run)
        print("held-out mean KL(final || lens), nats:\n" + describe_fit(tuned), file=sys.stderr)
        for f in files:
            print(f"wrote {f}", file=sys.stderr)
        if args.text is None:
            if args.json:
                out = {"about": run.about, **tuned.meta}
                sys.stdout.write(__import__("json").dumps(out, indent=2) + "\n")
            else:
                print(describe_fit(tuned))
            return 0
    return show(run.lens(args.text, tuned=args.tuned or args.train_tuned), args)


def add(sub) -> None:
    p = sub.add_parser("lens", help="the logit lens (or tuned lens) at every layer",
                       description="Read every residual stream point with the model's own "
                       "head: the top token per layer x position and the KL divergence to the "
                       "final distribution. --train-tuned --data FILE fits the tuned lens (one "
                       "affine probe per layer, in closed form) and saves it in the run.")  # fmt: skip
    p.add_argument("run", help="run directory")
    p.add_argument("text", nargs="?", help="the input to read")
    p.add_argument("--tuned", action="store_true", help="use the run's tuned lens")
    p.add_argument("--train-tuned", action="store_true", help="fit the tuned lens and save it")
    p.add_argument("--data", metavar="FILE", help="--train-tuned: text to fit on")
    p.add_argument("--max-tokens", type=int, default=32768, help="--train-tuned: tokens used")
    p.add_argument("--ridge", type=float, default=1e-3, help="--train-tuned: ridge strength")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--png", metavar="FILE", help="draw the KL heatmap with the top tokens")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_lens)


VERB = register(Verb("lens", 180, add))
