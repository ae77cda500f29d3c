"""`attnlab similarity RUN TEXT`: token x token cosine similarity (or raw dot products) before
and after each block (``attnlab.inspect.similarity``)."""

from __future__ import annotations

from attnlab.cli import Verb, int_at_least, register
from attnlab.cli.common import first_key, print_result, record, run_and_text


def cmd_similarity(args) -> int:
    from attnlab.inspect.similarity import similarity

    _, _, rec = record(args)
    result = similarity(rec, layer=args.layer, measure=args.measure)
    result.start = first_key(args.start, max(len(ly.tokens) for ly in result.layers))
    print_result(result, args.json)
    return 0


def add(sub) -> None:
    nonneg = int_at_least(0)

    p = sub.add_parser(
        "similarity", help="token x token cosine similarity before and after each block"
    )
    run_and_text(p)
    p.add_argument(
        "--layer",
        type=nonneg,
        default=None,
        help="show this layer's matrices (default: the input and the last output)",
    )
    p.add_argument("--start", type=nonneg, default=0,
                   help="first token (column) shown in the terminal's matrices")  # fmt: skip
    p.add_argument("--measure", choices=("cosine", "dot"), default="cosine",
                   help="the matrices shown: cosine similarity, or the raw dot products h_i . "
                   "h_j (--json has both)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print every layer's matrices as JSON")
    p.set_defaults(func=cmd_similarity)


VERB = register(Verb("similarity", 70, add))
