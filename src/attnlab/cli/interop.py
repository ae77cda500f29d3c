"""Verbs for other formats and the encoder: import-hf, export-hf, embed; train mlm|classify."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.cli import UsageError


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# import-hf / export-hf / embed
# ---------------------------------------------------------------------------------------------


def import_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import import_hf as do_import

    src = Path(args.dir)
    if not src.exists() and args.dir == "minilm":
        from attnlab.interop.minilm import minilm_dir

        src = minilm_dir()
    out = do_import(src, args.out)
    _err(f"imported {src} -> {out}")
    print(out)
    return 0


def export_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import export_gpt2

    out = export_gpt2(args.run, args.dir)
    _err(f"exported {args.run} -> {out} (GPT2LMHeadModel.from_pretrained loads it)")
    print(out)
    return 0


def embed(args: argparse.Namespace) -> int:
    from attnlab.checkpoint import load_run, read_run_config
    from attnlab.models.encoder import Encoder
    from attnlab.tasks.encoder_tasks import sentence_embeddings

    model, tokenizer = load_run(args.run)
    if not isinstance(model, Encoder):
        raise UsageError(f"{args.run}: embed needs an encoder run, not {model.model_type!r}")
    if tokenizer is None:
        raise UsageError(f"{args.run}: the run has no tokenizer.json")
    default = read_run_config(args.run).get("sentence_embedding", {})
    pool = args.pool or default.get("pool", "mean")
    emb = sentence_embeddings(model, tokenizer, args.text, pool=pool, normalize=args.normalize)
    rows = [[round(float(v), 7) for v in row] for row in emb]
    print(json.dumps(rows[0] if len(rows) == 1 else rows))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "import-hf",
        help="convert a Hugging Face GPT-2 or BERT directory into a run directory",
        description="Read a Hugging Face model directory (config.json, model.safetensors, "
        "tokenizer.json or vocab.txt) holding GPT-2 or BERT (BertModel, BertForMaskedLM, "
        "sentence-transformers) and write an attnlab run directory. Pickle weights are refused. "
        "DIR 'minilm' names the installed all-MiniLM-L6-v2 (attnlab[models]).",
    )
    p.add_argument("dir", help="Hugging Face model directory")
    p.add_argument("--out", required=True, help="run directory to write")
    p.set_defaults(func=import_hf)

    p = sub.add_parser(
        "export-hf",
        help="write a GPT run as a Hugging Face GPT-2 directory",
        description="Write RUN (an attnlab GPT with learned positions and pre-norm blocks) as a "
        "directory that transformers.GPT2LMHeadModel.from_pretrained loads.",
    )
    p.add_argument("run", help="attnlab run directory")
    p.add_argument("dir", help="directory to write")
    p.set_defaults(func=export_hf)

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


# ---------------------------------------------------------------------------------------------
# train --task mlm | classify
# ---------------------------------------------------------------------------------------------


def _encoder_config(args: argparse.Namespace, vocab_size: int, **heads):
    from attnlab.models.encoder import ENCODER_PRESETS, EncoderConfig

    if args.preset not in ENCODER_PRESETS:
        raise UsageError(
            f"--preset {args.preset!r} is not an encoder preset; "
            f"choose {', '.join(ENCODER_PRESETS)}"
        )
    if args.pos == "rotary":
        raise UsageError("--pos rotary is not available for the encoder (learned or sinusoidal)")
    from attnlab.cli.lm import MODEL_OPTIONS, _as_options
    from attnlab.config import ConfigError

    cfg = dict(ENCODER_PRESETS[args.preset])
    for key in MODEL_OPTIONS:
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)
    if args.norm is not None:
        cfg["norm_first"] = args.norm == "pre"
    try:
        return EncoderConfig(vocab_size=vocab_size, pad_id=0, **cfg, **heads)
    except ConfigError as e:
        raise UsageError(_as_options(str(e), MODEL_OPTIONS)) from None


def _settings(args: argparse.Namespace):
    """The TrainConfig of ``--task mlm|classify``; the options these tasks refuse are errors."""
    from attnlab.cli.lm import check_train_options
    from attnlab.runtime import resolve_device

    tcfg = check_train_options(args)  # --lr, --max-iters, --batch-size, ... as for --task lm
    resolve_device(tcfg.device)  # no CUDA for --device cuda: said before the data is read
    if not 0.0 < args.val_fraction < 1.0:
        raise UsageError(f"--val-fraction must be between 0 and 1, got {args.val_fraction}")
    for flag in ("resume", "compile"):
        if getattr(args, flag, False):
            raise UsageError(f"--{flag} is not supported for --task {args.task} yet")
    if getattr(args, "grad_accum", 1) != 1 or getattr(args, "dtype", "auto") not in (
        "auto",
        "float32",
    ):
        raise UsageError(f"--task {args.task} trains in float32 without gradient accumulation")
    return tcfg


def _out_dir(args: argparse.Namespace) -> Path:
    out = Path(args.out) if args.out else Path("runs") / Path(args.data).stem
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory")
    return out


def _fit(model, tokenizer, task, tcfg, out: Path, extra: dict, quiet: bool) -> dict | None:
    """Train ``task`` with the shared Trainer; returns the last evaluation's task figures (and
    records them in config.json as ``metrics``), or None when training stopped early."""
    from attnlab import checkpoint as ckpt
    from attnlab.training import Trainer, TrainingError

    trainer = Trainer(
        model,
        task.loss_fn,
        task.train_batches,
        tcfg,
        out,
        val_batches=task.val_batches,
        eval_extras=task.eval_extras,
        tokenizer=tokenizer,
        run_extra=extra,
        quiet=quiet,
    )
    try:
        result = trainer.fit()
    except TrainingError as e:
        _err(f"attnlab: error: {e}")
        return None
    if result.interrupted:
        _err(f"stopped at step {result.step}; checkpoint saved in {out}")
        return None
    final = next(r for r in reversed(result.history) if "val_loss" in r)
    shared = ("step", "train_loss", "val_loss", "val_ppl", "lr", "tokens_per_s")
    metrics = {"iter": final["step"], **{k: v for k, v in final.items() if k not in shared}}
    extra.update(train_config=tcfg.to_dict(), metrics=metrics)
    ckpt.write_run_config(out, model, extra)  # config.json now records the final figures
    return metrics


def train_mlm(args: argparse.Namespace) -> int:
    """attnlab train --task mlm --data TEXT: a BERT-style encoder on masked-LM."""
    import torch

    from attnlab.models.encoder import Encoder
    from attnlab.runtime import resolve_device
    from attnlab.tasks import encoder_tasks as et

    tcfg, out = _settings(args), _out_dir(args)
    try:
        texts = et.read_texts(args.data, args.encoding)
        torch.manual_seed(args.seed)
        tokenizer = et.build_encoder_tokenizer(args.tokenizer, texts, args.vocab_size)
        model = Encoder(_encoder_config(args, tokenizer.vocab_size, mlm_head=True))
        task = et.mlm_task(
            model,
            tokenizer,
            texts,
            args.val_fraction,
            args.batch_size,
            args.eval_iters,
            args.seed,
        )
    except et.TaskDataError as e:
        raise UsageError(str(e)) from None
    _err(
        f"masked-LM: {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{tokenizer.vocab_size} tokens ({args.tokenizer}), device {resolve_device(tcfg.device)}"
    )
    extra = {"task": "mlm", "data": str(args.data)}
    final = _fit(model, tokenizer, task, tcfg, out, extra, args.quiet)
    if final is None:
        return 1
    print(
        f"val_mlm_loss {final['val_mlm_loss']:.4f}  val_masked_accuracy "
        f"{final['val_masked_accuracy']:.4f}  run {out}"
    )
    return 0


def train_classify(args: argparse.Namespace) -> int:
    """attnlab train --task classify --data labels.tsv: label<TAB>text, accuracy held out."""
    import torch

    from attnlab.models.encoder import Encoder
    from attnlab.runtime import resolve_device
    from attnlab.tasks import encoder_tasks as et

    if getattr(args, "arch", "transformer") not in ("transformer", None):
        raise UsageError(f"--arch {args.arch} is not a text classifier (use transformer)")
    tcfg, out = _settings(args), _out_dir(args)
    try:
        labels, texts = et.read_labelled(args.data, args.encoding)
        torch.manual_seed(args.seed)
        tokenizer = et.build_encoder_tokenizer(args.tokenizer, texts, args.vocab_size)
        n_classes = len(set(labels))
        model = Encoder(
            _encoder_config(args, tokenizer.vocab_size, pooler=True, num_labels=n_classes)
        )
        task = et.classify_task(
            model, tokenizer, labels, texts, args.val_fraction, args.batch_size, args.seed
        )
    except et.TaskDataError as e:
        raise UsageError(str(e)) from None
    _err(
        f"classify: {n_classes} classes, {task.n_train} training and {task.n_val} held-out "
        f"examples, device {resolve_device(tcfg.device)}"
    )
    extra = {"task": "classify", "labels": task.classes, "data": str(args.data)}
    final = _fit(model, tokenizer, task, tcfg, out, extra, args.quiet)
    if final is None:
        return 1
    right, n = final["val_correct"], final["val_examples"]
    print(f"held-out accuracy {final['val_accuracy']:.4f} ({right}/{n})  run {out}")
    return 0
