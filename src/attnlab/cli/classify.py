"""`attnlab classify RUN INPUT...`: ``predict`` for a classifier run, text or image.

    attnlab train --task classify --data digits --arch vit      # ~20 s on one CPU core
    attnlab classify runs/digits test:0                         # top classes of a test image
    attnlab classify runs/language "where is the station?"      # a text classifier
    attnlab attention runs/digits test:0 --layer 1 --head 0     # [CLS] and patch attention

An image argument is the path of an image file (the size the model was trained on) or
``test:N``, the N-th image (from 0) of the run's held-out test split.
"""

from __future__ import annotations

import argparse
import dataclasses

from attnlab.cli import UsageError, Verb, int_at_least, register


def cmd_classify(args: argparse.Namespace) -> int:
    """``attnlab classify RUN INPUT``: the model's top classes with probabilities."""
    from attnlab.cli.predict import open_run, print_predictions

    run = open_run(args.run, args.device)
    if run.model.predicts != "class":
        raise UsageError(f"{args.run}: not a classifier run (train one with --task classify); "
                         "`attnlab predict` answers for any run")  # fmt: skip
    print_predictions(run, run.classify(args.input, top_k=args.top), args.json)
    return 0


def add(sub) -> None:
    from attnlab.tasks.base import PredictOptions

    d = {f.name: f.default for f in dataclasses.fields(PredictOptions)}
    p = sub.add_parser(
        "classify",
        help=VERB.help,
        description="Run each INPUT through a classifier run and print its most likely classes "
        "(the same as `attnlab predict`). For a ViT, INPUT is an image file of the size the "
        "model was trained on, or test:N for the N-th image (from 0) of its held-out test split.",
    )
    p.add_argument("run", help="run directory (attnlab train --task classify)")
    p.add_argument("input", nargs="+", help="a text; for a ViT an image file, or test:N")
    p.add_argument(
        "--top", type=int_at_least(1), default=d["top_k"], help="how many classes to show"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_classify)


VERB = register(
    Verb(
        "classify",
        150,
        add,
        help="the top classes of a text or an image under a trained classifier",
    )
)
