"""`attnlab embed RUN TEXT...`: the sentence embedding of each text from an encoder run, as
JSON on stdout (``Run.embed``)."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import Verb, register


def embed(args: argparse.Namespace) -> int:
    from attnlab.run import load_run

    rows = load_run(args.run, args.device).embed(args.text, pool=args.pool,
                                                 normalize=args.normalize)  # fmt: skip
    print(json.dumps(rows))
    return 0


def add(sub) -> None:
    p = sub.add_parser(
        "embed",
        help=VERB.help,
        description="Print the sentence embedding of each TEXT as JSON: one list for one text, "
        "a list of lists for several. Mean pooling averages the real tokens' last hidden states "
        "([CLS] and [SEP] included, padding excluded); cls takes the first token's state.",
    )
    p.add_argument("run", help="encoder run directory (trained or imported)")
    p.add_argument("text", nargs="+", help="text(s) to embed")
    p.add_argument(
        "--pool",
        choices=["mean", "cls"],
        default=None,
        help="pooling (default: the run's sentence-transformers setting, else mean)",
    )
    p.add_argument("--normalize", action="store_true", help="scale each embedding to unit length")
    p.set_defaults(func=embed)


VERB = register(
    Verb(
        "embed",
        130,
        add,
        json=False,
        help="sentence embedding from an encoder run (JSON list on stdout)",
        data=True,
    )
)
