"""`attnlab influence RUN TEXT`: how far its context moved each token, layer by layer
(``Run.influence``)."""

from __future__ import annotations

from attnlab.cli import Verb, int_at_least, output_file, register
from attnlab.cli.common import load, print_result, run_and_text, wrote


def cmd_influence(args) -> int:
    out = output_file(args.csv, ".csv", "--csv")
    png = output_file(args.png, ".png", "--png")
    result = load(args).influence(args.text, sources=args.sources, top=args.top)
    if out is not None:  # written before anything is printed
        result.to_csv(out)
    if png is not None:
        result.save_png(png)
    print_result(result, args.json)
    if out is not None:
        wrote(out, "influence table")
    if png is not None:
        wrote(png, "influence heatmap")
    return 0


def add(sub) -> None:
    pos = int_at_least(1)

    p = sub.add_parser(
        "influence",
        help=VERB.help,
        description="Per token and layer: ||h_after - h_before|| / ||h_before||, "
        "cos(h_before, h_after), the share of the update from attention and from the "
        "FFN, and the source tokens that contributed most (weight x ||W_O v||).",
    )
    run_and_text(p)
    p.add_argument("--top", type=pos, default=20, help="rows of the ranked table to print")
    p.add_argument("--sources", type=pos, default=3, help="source tokens per row")
    p.add_argument("--csv", metavar="FILE", help="save the whole ranked table as CSV")
    p.add_argument("--png", metavar="FILE",
                   help="save how far context moved each token, layer x token, as a heatmap")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the whole table as JSON")
    p.set_defaults(func=cmd_influence)


VERB = register(
    Verb("influence", 80, add, help="how far its context moved each token, layer by layer")
)
