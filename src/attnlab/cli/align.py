"""`attnlab align RUN [RUN ...] TEXT`: each decoder step's attention over the source, for one or
more encoder-decoder runs side by side (the notes' "let's go" -> "vamos" picture).

It loads each run and calls the first one's ``Run.align`` with the others.
"""

from __future__ import annotations

import sys

from attnlab.cli import UsageError, Verb, int_at_least, output_file, register

MAX_RUNS = 8  # side by side, each picture still readable


def cmd_align(args) -> int:
    from attnlab.render.display import console
    from attnlab.run import load_run

    if len(args.runs) > MAX_RUNS:
        raise UsageError(f"{len(args.runs)} runs: align draws at most {MAX_RUNS} side by side")
    png = output_file(args.png, ".png", "--png")
    runs = [load_run(r, args.device) for r in args.runs]  # every run loads before any output
    result = runs[0].align(args.text, *runs[1:], layer=args.layer, head=args.head,
                           words=args.words)  # fmt: skip
    if png is not None:  # written before anything is printed
        result.save_png(png)
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        console().print(result)
    if png is not None:
        print(f"wrote {png} ({png.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)
    return 0


def add(sub) -> None:

    nonneg = int_at_least(0)
    p = sub.add_parser(
        "align",
        help=VERB.help,
        description="For each encoder-decoder run: the output it decodes for TEXT and, one row "
        "per decoder step (the token fed -> the token output), its weights over the source: an "
        "LSTM's alignment, a Transformer's cross-attention (mean over heads and layers unless "
        "--layer/--head). Example, the notes' picture: attnlab align runs/lstm runs/transformer "
        '"let\'s go" --words --png align.png',
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="encoder-decoder run directories")
    p.add_argument("text", help="the source text")
    p.add_argument("--layer", type=nonneg, default=None,
                   help="one layer's cross-attention (default: the mean over every layer)")  # fmt: skip
    p.add_argument("--head", type=nonneg, default=None, help="one head (default: their mean)")
    p.add_argument("--words", action="store_true",
                   help="add up the weights of the tokens of each word (let ' s -> let's)")  # fmt: skip
    p.add_argument("--png", metavar="FILE", help="draw the models side by side into a PNG")
    p.set_defaults(func=cmd_align)


VERB = register(
    Verb(
        "align",
        145,
        add,
        help="each decoder step's attention over the source, encoder-decoders side by side",
    )
)
