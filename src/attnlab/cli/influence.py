"""`attnlab influence RUN TEXT`: how far its context moved each token, layer by layer
(``attnlab.inspect.influence``)."""

from __future__ import annotations

from attnlab.cli import Verb, int_at_least, output_file, register
from attnlab.cli.common import print_result, record, run_and_text, wrote


def cmd_influence(args) -> int:
    from attnlab.inspect.influence import influence

    out = output_file(args.csv, ".csv", "--csv")
    model, _, rec = record(args)
    result = influence(model, rec, n_sources=args.sources, top=args.top)
    if out is not None:  # written before anything is printed
        result.to_csv(out)
    print_result(result, args.json)
    if out is not None:
        wrote(out, "influence table")
    return 0


def add(sub) -> None:
    pos = int_at_least(1)

    p = sub.add_parser(
        "influence",
        help="how far its context moved each token, layer by layer",
        description="Per token and layer: ||h_after - h_before|| / ||h_before||, "
        "cos(h_before, h_after), the share of the update from attention and from the "
        "FFN, and the source tokens that contributed most (weight x ||W_O v||).",
    )
    run_and_text(p)
    p.add_argument("--top", type=pos, default=20, help="rows of the ranked table to print")
    p.add_argument("--sources", type=pos, default=3, help="source tokens per row")
    p.add_argument("--csv", metavar="FILE", help="save the whole ranked table as CSV")
    p.add_argument("--json", action="store_true", help="print the whole table as JSON")
    p.set_defaults(func=cmd_influence)


VERB = register(Verb("influence", 80, add))
