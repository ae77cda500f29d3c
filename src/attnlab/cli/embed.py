"""`attnlab embed RUN TEXT...`: the sentence embedding of each text from an encoder run, as
JSON on stdout (``attnlab.embeddings``)."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import UsageError, Verb, register


def embed(args: argparse.Namespace) -> int:
    from attnlab.embeddings import sentence_embeddings
    from attnlab.run import load_run

    run = load_run(args.run, args.device)
    model, tokenizer = run
    if not model.sentence_embedding:
        raise UsageError(f"{args.run}: embed needs an encoder run, not {model.model_type!r}")
    if tokenizer is None:
        raise UsageError(f"{args.run}: the run has no tokenizer.json")
    default = run.config.get("sentence_embedding", {})
    pool = args.pool or default.get("pool", "mean")
    emb = sentence_embeddings(model, tokenizer, args.text, pool=pool, normalize=args.normalize)
    rows = [[round(float(v), 7) for v in row] for row in emb]
    print(json.dumps(rows[0] if len(rows) == 1 else rows))
    return 0


def add(sub) -> None:
    p = sub.add_parser(
        "embed",
        help="sentence embedding from an encoder run (JSON list on stdout)",
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


VERB = register(Verb("embed", 130, add, json=False))
