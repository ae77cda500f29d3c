"""The vision verb ``classify`` (``train --task classify --arch vit`` is cli/train.py).

    attnlab train --task classify --data digits --arch vit      # ~20 s on one CPU core
    attnlab classify runs/digits test:0                         # top classes of a test image
    attnlab attention runs/digits test:0 --layer 1 --head 0     # [CLS] and patch attention

An image argument is the path of an image file (the size the model was trained on) or
``test:N``, the N-th image (from 0) of the run's held-out test split.
"""

from __future__ import annotations

import argparse

from attnlab.cli import UsageError, int_at_least

# ---------------------------------------------------------------------------------------------
# classify
# ---------------------------------------------------------------------------------------------


def cmd_classify(args: argparse.Namespace) -> int:
    """``attnlab classify RUN IMAGE|test:N``: the model's top classes with probabilities."""
    from attnlab.checkpoint import load_run
    from attnlab.tasks.vision import ImageClassifier, VisionOptions

    model, tokenizer = load_run(args.run)
    if getattr(model, "model_type", "") != "vit" or not hasattr(tokenizer, "read"):
        raise UsageError(f"{args.run}: not an image classifier run (train one with --arch vit)")
    task = ImageClassifier(VisionOptions(data=tokenizer.source), seed=tokenizer.seed)
    task.tokenizer = tokenizer
    (pred,) = task.predict(model, [args.image], top_k=args.top)
    width = max(len(c) for c in tokenizer.classes)
    truth = pred["truth"]
    print(f"{args.image}" + (f"  (true class {truth})" if truth is not None else ""))
    for c in pred["classes"]:
        print(f"  {c['label']:<{width}}  {c['p']:.4f}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "classify",
        help="the top classes of an image under a trained ViT",
        description="Run one image through a ViT run and print its most likely classes. "
        "IMAGE is an image file of the size the model was trained on, or test:N for the N-th "
        "image (from 0) of the run's held-out test split.",
    )
    p.add_argument("run", help="run directory (attnlab train --task classify --arch vit)")
    p.add_argument("image", help="an image file, or test:N")
    p.add_argument("--top", type=int_at_least(1), default=3, help="how many classes to show")
    p.set_defaults(func=cmd_classify)
