"""`attnlab similarity RUN TEXT`: token x token cosine similarity (or raw dot products) before
and after each block (``Run.similarity``)."""

from __future__ import annotations

from attnlab.cli import Verb, int_at_least, output_file, register
from attnlab.cli.common import first_key, load, print_result, run_and_text, wrote


def cmd_similarity(args) -> int:
    png = output_file(args.png, ".png", "--png")
    result = load(args).similarity(args.text, layer=args.layer, measure=args.measure)
    result.start = first_key(args.start, max(len(ly.tokens) for ly in result.layers))
    if png is not None:  # written before anything is printed
        result.save_png(png)
    print_result(result, args.json)
    if png is not None:
        wrote(png, "similarity heatmaps")
    return 0


def add(sub) -> None:
    nonneg = int_at_least(0)

    p = sub.add_parser("similarity", help=VERB.help)
    run_and_text(p)
    p.add_argument(
        "--layer",
        type=nonneg,
        default=None,
        help="show this layer's matrices (default: the input and the last output)",
    )
    p.add_argument("--start", type=nonneg, default=0,
                   help="first token (column) shown in the terminal's matrices")  # fmt: skip
    p.add_argument("--png", metavar="FILE",
                   help="save every layer's matrix as heatmaps (before the first, after each)")  # fmt: skip
    p.add_argument("--measure", choices=("cosine", "dot"), default="cosine",
                   help="the matrices shown: cosine similarity, or the raw dot products h_i . "
                   "h_j (--json has both)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print every layer's matrices as JSON")
    p.set_defaults(func=cmd_similarity)


VERB = register(
    Verb("similarity", 70, add, help="token x token cosine similarity before and after each block")
)
