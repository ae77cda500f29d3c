"""`attnlab attention RUN TEXT`: the token x token attention matrix of a layer and head, or
(``--all --png``) the grid of every layer x head (``Run.attention``)."""

from __future__ import annotations

import json
import sys

from attnlab.cli import UsageError, Verb, int_at_least, output_file, register
from attnlab.cli.common import load, print_result, run_and_text, wrote


def cmd_attention(args) -> int:
    if args.all and args.png is None:
        raise UsageError("--all draws the grid of every layer x head into --png FILE; give --png")
    png = output_file(args.png, ".png", "--png")
    run = load(args)
    if args.all:  # the grid's summary, not one head's table: the picture is the result
        grid = run.attention(args.text, map=args.map, all=True,
                             title=f"{args.run}: {args.text!r}")  # fmt: skip
        grid.save_png(png)
        if args.json:
            sys.stdout.write(
                json.dumps(
                    {"about": grid.about, "png": str(png), **grid.to_dict()}, ensure_ascii=False
                )
                + "\n"
            )
        else:
            print(f"{png}: attention grid, {grid.summary()}")
        wrote(png, "attention grid (every layer x head)")
        return 0
    amap = run.attention(args.text, layer=args.layer, head=args.head, mean=args.mean,
                         map=args.map, start=args.start)  # fmt: skip
    if png is not None:  # written before anything is printed: a failed write prints only itself
        amap.save_png(png)
    print_result(amap, args.json)
    if png is not None:
        wrote(png, "attention heatmap")
    return 0


def add(sub) -> None:
    nonneg = int_at_least(0)

    p = sub.add_parser(
        "attention",
        help=VERB.help,
        description="Print the attention matrix (row = query token, column = key token). "
        "--png saves a heatmap of it, or with --all a grid of every layer x head.",
    )
    run_and_text(p)
    p.add_argument("--layer", type=nonneg, default=None, help="layer (default: 0)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--head", type=nonneg, default=None, help="head (default: 0)")
    g.add_argument("--mean", action="store_true", help="the mean over heads")
    p.add_argument(
        "--map",
        default=None,
        metavar="NAME",
        help="pick attention maps by name or part of it (e.g. cross, decoder; default: "
        "the first map of the layer)",
    )
    p.add_argument("--png", metavar="FILE", help="save a heatmap PNG")
    p.add_argument(
        "--all",
        action="store_true",
        help="with --png: a grid of every layer x head (prints the grid's summary)",
    )
    p.add_argument(
        "--start",
        type=nonneg,
        default=0,
        help="first key shown in the terminal table (it pages to the terminal's width from "
        "there; past 32 query rows, also the first query)",
    )
    p.add_argument("--json", action="store_true", help="print the matrix as JSON")
    p.set_defaults(func=cmd_attention)


VERB = register(
    Verb("attention", 60, add, help="the token x token attention matrix of a layer and head")
)
