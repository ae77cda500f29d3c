"""Vision verbs: ``train --task classify --arch vit`` (here as ``train_vit``) and ``classify``.

    attnlab train --task classify --data digits --arch vit      # ~20 s on one CPU core
    attnlab classify runs/digits test:0                         # top classes of a test image
    attnlab attention runs/digits test:0 --layer 1 --head 0     # [CLS] and patch attention

An image argument is the path of an image file (the size the model was trained on) or
``test:N``, the N-th image (from 0) of the run's held-out test split.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cli import UsageError

# Sizes and optimisation for --arch vit when the option is not typed: the shared defaults of
# `attnlab train` are a language model's. These reach ~97% test accuracy on digits in ~20 s.
VIT_DEFAULTS = dict(
    n_layer=2,
    n_head=4,
    d_model=64,
    patch_size=2,
    dropout=0.0,
    max_iters=600,
    batch_size=64,
    lr=2e-3,
    min_lr=1e-4,
    warmup_iters=50,
    eval_interval=100,
)
MODEL_OPTIONS = ("n_layer", "n_head", "d_model", "patch_size", "dropout")


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _apply_defaults(args: argparse.Namespace) -> None:
    from attnlab.cli.lm import _given

    given = _given(args)
    for name, value in VIT_DEFAULTS.items():
        if name not in given or getattr(args, name, None) is None:
            setattr(args, name, value)


def _check_options(args: argparse.Namespace) -> None:
    from attnlab.cli.lm import _given

    if args.arch not in ("vit", "transformer"):
        raise UsageError(f"--arch {args.arch} cannot classify images; use --arch vit")
    given = _given(args)
    for flag in ("preset", "block_size", "pos", "tokenizer", "vocab_size", "min_freq"):
        if flag in given:
            opt = "--" + flag.replace("_", "-")
            raise UsageError(
                f"{opt} does not apply to --arch vit (size it with --n-layer, --n-head, "
                "--d-model and --patch-size)"
            )
    if args.resume:
        raise UsageError("--resume is not supported for --arch vit yet")
    if not 0.0 < args.val_fraction < 0.5:
        raise UsageError(f"--val-fraction must be between 0 and 0.5, got {args.val_fraction}")


def train_vit(args: argparse.Namespace) -> int:
    """``attnlab train --task classify --arch vit --data digits|DIR``: a ViT classifier trained
    with the shared Trainer; prints and stores the held-out test accuracy."""
    import torch
    import torch.nn.functional as F

    from attnlab import checkpoint as ckpt
    from attnlab.cli.lm import _as_options, check_train_options
    from attnlab.config import ConfigError
    from attnlab.data import images as im
    from attnlab.models.vit import ViT, ViTConfig
    from attnlab.training import Trainer, TrainingError

    _check_options(args)
    _apply_defaults(args)
    tcfg = check_train_options(args)
    fields = {k: getattr(args, k) for k in MODEL_OPTIONS}
    try:  # sizes checked before the data is read (image size filled in below)
        ViTConfig(image_size=fields["patch_size"], channels=1, n_classes=2, **fields)
    except ConfigError as e:
        raise UsageError(_as_options(str(e), MODEL_OPTIONS)) from None

    data = im.load_images(args.data)
    source = args.data if args.data == im.DIGITS else str(Path(args.data).resolve())
    train_idx, val_idx, test_idx = im.split(len(data), args.val_fraction, args.seed)
    try:
        mcfg = ViTConfig(
            image_size=data.image_size,
            channels=data.channels,
            n_classes=len(data.classes),
            norm_first=args.norm != "post",
            **fields,
        )
    except ConfigError as e:
        raise UsageError(f"{args.data}: {_as_options(str(e), MODEL_OPTIONS)}") from None
    out = Path(args.out) if args.out else Path("runs") / Path(args.data).name
    tokenizer = im.ImageTokenizer(
        source, data.classes, data.image_size, data.channels, args.seed, args.val_fraction
    )

    torch.manual_seed(tcfg.seed)
    model = ViT(mcfg)
    X, Y = data.images, data.labels
    batches = im.RandomImageBatches(X[train_idx], Y[train_idx], tcfg.batch_size, tcfg.seed)
    val = im.fixed_batches(X[val_idx], Y[val_idx], 256)

    def loss_fn(m, batch):
        x, y = batch
        return F.cross_entropy(m(x).float(), y)  # mean over the batch

    @torch.no_grad()
    def accuracy(images, labels) -> tuple[int, int]:
        was = model.training
        model.eval()
        device = next(model.parameters()).device
        right = sum(
            int((model(x.to(device)).argmax(-1) == y.to(device)).sum())
            for x, y in im.fixed_batches(images, labels, 256)
        )
        model.train(was)
        return right, len(labels)

    def eval_extras(_val_loss: float) -> dict:
        right, n = accuracy(X[val_idx], Y[val_idx])
        return {"val_accuracy": right / n}

    extra = {
        "task": "classify",
        "data": source,
        "labels": data.classes,
        "val_fraction": args.val_fraction,
        "test_fraction": im.TEST_FRACTION,
        "n_train": len(train_idx),
        "n_val": len(val_idx),
        "n_test": len(test_idx),
    }
    trainer = Trainer(
        model,
        loss_fn,
        batches,
        tcfg,
        out,
        val_batches=val,
        eval_extras=eval_extras,
        tokenizer=tokenizer,
        run_extra=extra,
        quiet=args.quiet,
    )
    c = mcfg
    if not args.quiet:
        _err(
            f"vit: {len(data)} images {c.image_size}x{c.image_size}x{c.channels}, "
            f"{len(data.classes)} classes ({len(train_idx)} train, {len(val_idx)} val, "
            f"{len(test_idx)} test); {c.n_patches} patches of {c.patch_size}x{c.patch_size}, "
            f"{c.n_layer} layers, {c.n_head} heads, d_model {c.d_model}, "
            f"{model.num_params():,} parameters; {tcfg.max_iters} steps of {tcfg.batch_size}, "
            f"lr {tcfg.lr:g}; run directory {out}"
        )
    try:
        result = trainer.fit()
    except TrainingError as e:
        _err(f"attnlab: error: {e}")
        return 1
    if result.interrupted:
        _err(f"stopped at step {result.step}; checkpoint saved in {out}")
        return 130
    right, n = accuracy(X[test_idx], Y[test_idx])
    val_acc = next(
        (r["val_accuracy"] for r in reversed(result.history) if "val_accuracy" in r), None
    )
    extra.update(
        train_config=tcfg.to_dict(),
        test_accuracy=right / n,
        test_correct=right,
        val_accuracy=val_acc,
        steps=result.step,
    )
    ckpt.write_run_config(out, model, extra)  # config.json now records the test accuracy
    print(f"held-out test accuracy {right / n:.4f} ({right}/{n})  run {out}")
    return 0


# ---------------------------------------------------------------------------------------------
# classify
# ---------------------------------------------------------------------------------------------


def cmd_classify(args: argparse.Namespace) -> int:
    """``attnlab classify RUN IMAGE|test:N``: the model's top classes with probabilities."""
    import torch

    from attnlab.checkpoint import load_run

    model, tokenizer = load_run(args.run)
    if getattr(model, "model_type", "") != "vit" or not hasattr(tokenizer, "read"):
        raise UsageError(f"{args.run}: not an image classifier run (train one with --arch vit)")
    image, truth = tokenizer.read(args.image)
    with torch.no_grad():
        probs = torch.softmax(model(image[None]).float(), dim=-1)[0]  # (n_classes,)
    top = torch.topk(probs, min(args.top, len(probs)))
    width = max(len(c) for c in tokenizer.classes)
    print(f"{args.image}" + (f"  (true class {truth})" if truth is not None else ""))
    for p, i in zip(top.values.tolist(), top.indices.tolist()):
        print(f"  {tokenizer.classes[i]:<{width}}  {p:.4f}")
    return 0


def register(sub) -> None:
    from attnlab.cli.look import _int_at_least

    p = sub.add_parser(
        "classify",
        help="the top classes of an image under a trained ViT",
        description="Run one image through a ViT run and print its most likely classes. "
        "IMAGE is an image file of the size the model was trained on, or test:N for the N-th "
        "image (from 0) of the run's held-out test split.",
    )
    p.add_argument("run", help="run directory (attnlab train --task classify --arch vit)")
    p.add_argument("image", help="an image file, or test:N")
    p.add_argument("--top", type=_int_at_least(1), default=3, help="how many classes to show")
    p.set_defaults(func=cmd_classify)
