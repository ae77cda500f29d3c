"""Language-model verbs: ``train --task lm`` (here as ``train``), ``generate`` and ``eval``.

Every verb is a thin layer over the library: ``attnlab.data`` (corpus, token file),
``attnlab.training`` (Trainer), ``attnlab.generation`` (sampling), ``attnlab.checkpoint``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from attnlab import checkpoint as ckpt
from attnlab.cli import UsageError
from attnlab.config import ConfigError

# Options that may change when a run is resumed; every other training option comes from the run.
RESUMABLE = {
    "max_iters",
    "eval_interval",
    "log_interval",
    "quiet",
    "device",
    "dtype",
    "compile",
    "resume",
    "data",
    "out",
    "task",
    "encoding",
}
MODEL_OPTIONS = ("n_layer", "n_head", "d_model", "block_size", "dropout", "pos")
TRAIN_OPTIONS = (
    "max_iters",
    "batch_size",
    "grad_accum",
    "lr",
    "min_lr",
    "warmup_iters",
    "lr_decay_iters",
    "weight_decay",
    "beta2",
    "grad_clip",
    "eval_interval",
    "eval_iters",
    "log_interval",
    "seed",
    "device",
    "dtype",
    "compile",
)


def _given(args: argparse.Namespace) -> set[str]:
    """Destination names of the options the user typed (``--max-iters 5`` -> max_iters)."""
    out = set()
    for tok in getattr(args, "_argv", []):
        if tok.startswith("--"):
            out.add(tok[2:].split("=", 1)[0].replace("-", "_"))
    return out


def _as_options(message: str, names) -> str:
    """'top_p must be ...' -> '--top-p must be ...' so the message names what the user typed."""
    import re

    for name in sorted(names, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}\b", "--" + name.replace("_", "-"), message)
    return message


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _set_cpu_threads(device: torch.device, quiet: bool = True) -> None:
    from attnlab.runtime import set_cpu_threads

    set_cpu_threads(device, quiet)


# ---------------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------------


def model_config_from_args(args: argparse.Namespace, vocab_size: int):
    """GPTConfig = the preset, then every override given on the command line."""
    from attnlab.models.gpt import PRESETS, GPTConfig

    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose from {', '.join(PRESETS)}")
    fields = dict(PRESETS[args.preset])
    for name in MODEL_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    if getattr(args, "norm", None):
        fields["norm_first"] = args.norm == "pre"
    fields.setdefault("dropout", 0.0)
    return GPTConfig(vocab_size=vocab_size, **fields)


def train_config_from_args(args: argparse.Namespace):
    from attnlab.training import TrainConfig

    values = {name: getattr(args, name) for name in TRAIN_OPTIONS}
    if values["lr_decay_iters"] is None:  # fixed now, so that --resume with more --max-iters
        values["lr_decay_iters"] = values["max_iters"]  # keeps the schedule of the run
    return TrainConfig(**values)


def check_train_options(args: argparse.Namespace):
    """The optimisation and tokenizer options every ``train --task`` shares, as a TrainConfig;
    a bad one is a UsageError naming the option as typed (``--lr must be positive``)."""
    try:
        tcfg = train_config_from_args(args)
    except ConfigError as e:
        raise UsageError(_as_options(str(e), TRAIN_OPTIONS)) from None
    for name in ("vocab_size", "min_freq"):
        value = getattr(args, name, 1)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return tcfg


def _check_resume_options(args, saved_train: dict, saved_model: dict) -> None:
    """On --resume, an option typed on the command line must not change the run's settings."""
    for name in sorted(_given(args) - RESUMABLE):
        if name in saved_train:
            saved = saved_train[name]
        elif name in saved_model:
            saved = saved_model[name]
        else:
            continue
        if getattr(args, name, saved) != saved:
            raise UsageError(
                f"--{name.replace('_', '-')} cannot change on --resume (the run was trained "
                f"with {saved}); start a new run with another --out instead"
            )


def train(args: argparse.Namespace) -> int:
    """``attnlab train --task lm``: train a GPT on next-token prediction."""
    from attnlab import data
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training import (
        TrainConfig,
        Trainer,
        TrainingError,
        bits_per_char,
        init_distributed,
        next_token_loss,
        read_trainer_state,
        resolve_device,
    )

    # Validate every option before reading or writing anything.
    tcfg = check_train_options(args)
    try:
        probe = model_config_from_args(args, vocab_size=1)  # sizes, d_model % n_head, ...
    except ConfigError as e:
        raise UsageError(_as_options(str(e), (*TRAIN_OPTIONS, *MODEL_OPTIONS))) from None
    if not 0 <= args.val_fraction < 1:
        raise UsageError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    device = resolve_device(tcfg.device)
    dist_info = init_distributed(device)
    _set_cpu_threads(device, quiet=args.quiet or not dist_info.is_main)
    corpus = None
    if args.out is None:
        corpus = data.open_corpus(args.data, args.encoding)
    out = Path(args.out) if args.out is not None else Path("runs") / corpus.name
    token_file = out / data.tokens.TOKEN_FILE

    if args.resume:
        cfg = ckpt.read_run_config(out)
        ckpt.build_model(cfg, out / "config.json")  # unknown model type, invalid config
        if cfg.get("model_type") != "gpt" or cfg.get("task", "lm") != "lm":
            raise UsageError(f"{out}: not a language-model run, cannot --resume it with --task lm")
        state = read_trainer_state(out)
        saved_train = (state or {}).get("train_config") or cfg.get("train_config", {})
        _check_resume_options(args, saved_train, cfg["config"])
        changes = {k: getattr(args, k) for k in _given(args) & set(saved_train) & RESUMABLE}
        tcfg = TrainConfig.from_dict({**saved_train, **changes})
        mcfg = GPTConfig.from_dict(cfg["config"])
        tokenizer = load_tokenizer(out / "tokenizer.json")
        tokens, info = data.read_token_file(token_file)
        val_fraction = cfg.get("val_fraction", args.val_fraction)
        kind = cfg.get("tokenizer", args.tokenizer)
        if state is None:
            _stderr(
                f"{out}: no checkpoint written yet, starting from step 0 with the run's settings"
            )
    else:
        if (out / "trainer_state.json").is_file():
            done = (read_trainer_state(out) or {}).get("step")
            raise UsageError(
                f"{out} already holds a training run (step {done}); pass --resume to "
                "continue it, or choose another --out"
            )
        corpus = corpus or data.open_corpus(args.data, args.encoding)
        if dist_info.is_main:
            created = _make_out_dir(out)
            try:
                if not args.quiet:
                    _stderr(f"building the {args.tokenizer} tokenizer on {corpus.name} ...")
                tokenizer = data.build_tokenizer_from_corpus(
                    args.tokenizer, corpus, args.vocab_size, args.min_freq
                )
                ckpt.atomic_write_text(out / "tokenizer.json", tokenizer.to_json())
                info = data.encode_to_file(corpus, tokenizer, token_file, source=str(args.data))
                tokens, info = data.read_token_file(token_file)
                try:
                    data.split_tokens(tokens, args.val_fraction, probe.block_size)
                except data.DataError as e:
                    raise data.DataError(f"{args.data}: {e}") from None  # too short
            except BaseException:
                _remove_partial(out, created)
                raise
        _barrier(dist_info)
        if not dist_info.is_main:
            tokenizer = load_tokenizer(out / "tokenizer.json")  # the one rank 0 built
        tokens, info = data.read_token_file(token_file)
        mcfg = model_config_from_args(args, vocab_size=tokenizer.vocab_size)
        val_fraction, kind = args.val_fraction, args.tokenizer

    train_tokens, val_tokens = data.split_tokens(tokens, val_fraction, mcfg.block_size)
    torch.manual_seed(tcfg.seed)
    model = GPT(mcfg)
    batches = data.RandomWindows(
        train_tokens,
        mcfg.block_size,
        tcfg.batch_size,
        seed=tcfg.seed,
        rank=dist_info.rank,
        world_size=dist_info.world_size,
    )
    val = data.fixed_batches(val_tokens, mcfg.block_size, tcfg.batch_size, tcfg.eval_iters, seed=0)
    train_eval = data.fixed_batches(
        train_tokens, mcfg.block_size, tcfg.batch_size, tcfg.eval_iters, seed=1
    )
    cpt = info.chars_per_token
    extra = {
        "task": "lm",
        "data": str(args.data),
        "encoding": args.encoding,
        "tokenizer": kind,
        "val_fraction": val_fraction,
        "chars_per_token": cpt,
        "n_tokens": info.n_tokens,
    }
    trainer = Trainer(
        model,
        next_token_loss,
        batches,
        tcfg,
        out,
        val_batches=val,
        train_eval_batches=train_eval,
        eval_extras=lambda v: {"val_bpc": bits_per_char(v, cpt)},
        tokenizer=tokenizer,
        run_extra=extra,
        dist_info=dist_info,
        quiet=args.quiet,
    )
    if args.resume:  # a checkpoint that cannot be continued from: one line, before any other
        trainer.load_checkpoint()
    if dist_info.is_main and not args.quiet:
        n = model.num_params()
        _stderr(
            f"{info.n_tokens:,} tokens ({len(train_tokens):,} train, {len(val_tokens):,} val), "
            "vocab "
            f"{tokenizer.vocab_size}, {n / 1e6:.2f}M parameters, run directory {out}"
        )
    try:
        result = trainer.fit(resume=args.resume)
    except TrainingError as e:
        _stderr(f"attnlab: error: {e}")
        return 1
    finally:
        if dist_info.enabled:
            import torch.distributed as dist

            dist.destroy_process_group()
    if not dist_info.is_main:
        return 0
    if result.interrupted:
        _stderr(
            f"stopped at step {result.step}; checkpoint saved in {out}. Continue with: "
            f"attnlab train --data {args.data} --out {out} --resume"
        )
        return 130
    val_text = (
        f"val loss {result.val_loss:.4f}" if result.val_loss is not None else "no validation split"
    )
    bpc = (
        f" ({bits_per_char(result.val_loss, cpt):.3f} bits/char)"
        if result.val_loss is not None
        else ""
    )
    print(f"trained {result.step} steps: {val_text}{bpc}; best {result.best_val_loss}")
    print(f"run: {out}  (model.safetensors, metrics.jsonl, loss.png; best/ holds the best model)")
    return 0


def _barrier(dist_info) -> None:
    if dist_info.enabled:
        import torch.distributed as dist

        dist.barrier()


def _make_out_dir(out: Path) -> bool:
    """Create the run directory (True if it is new) and prove it is writable."""
    from attnlab.training import check_writable

    created = not out.exists()
    check_writable(out)
    return created


def _remove_partial(out: Path, created: bool) -> None:
    """Bad input found while preparing data: leave nothing behind."""
    from attnlab.data.tokens import TOKEN_FILE, TOKEN_META

    if created:
        shutil.rmtree(out, ignore_errors=True)
    else:
        for name in (TOKEN_FILE, TOKEN_META, f".{TOKEN_FILE}.tmp", "tokenizer.json"):
            (out / name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------


def _load_gpt(run: str, device_name: str):
    from attnlab.models.gpt import GPT
    from attnlab.runtime import resolve_device

    try:
        device = resolve_device(device_name)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    _set_cpu_threads(device)
    model, tokenizer = ckpt.load_run(run, device=device)
    if not isinstance(model, GPT):
        raise UsageError(
            f"{run}: a {type(model).__name__} run; this verb needs a GPT language model"
        )
    if tokenizer is None:
        raise ckpt.RunError(f"{run}: no tokenizer.json")
    return model, tokenizer


def generate(args: argparse.Namespace) -> int:
    """``attnlab generate RUN --prompt TEXT``: sample a continuation; text on stdout."""
    from attnlab.generation import SamplingConfig
    from attnlab.generation import generate as sample

    try:
        cfg = SamplingConfig(
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            args.top_p,
            args.repetition_penalty,
            args.seed,
        )
    except ValueError as e:
        names = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty")
        raise UsageError(_as_options(str(e), names)) from None
    if args.num_samples <= 0:
        raise UsageError(f"--num-samples must be positive, got {args.num_samples}")
    prompts = args.prompt or ["\n"]
    model, tokenizer = _load_gpt(args.run, args.device)
    for p in prompts:
        tokenizer.encode(p)  # unknown characters: a one-line error naming them, before any output
    single = len(prompts) == 1 and args.num_samples == 1

    def stream(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    if single:
        stream(prompts[0])
    samples = sample(
        model,
        tokenizer,
        prompts,
        cfg,
        stop=args.stop or (),
        num_samples=args.num_samples,
        use_cache=not args.no_cache,
        stream=stream if single else None,
    )
    if single:
        stream("\n")
        return 0
    for n, s in enumerate(samples):
        if n:
            print("-" * 40)
        print(s.prompt + s.text)
    return 0


# ---------------------------------------------------------------------------------------------
# eval
# ---------------------------------------------------------------------------------------------


def evaluate_text(
    model, tokenizer, corpus, batch_size: int = 32, max_tokens: int | None = None
) -> dict:
    """Loss (nats/token), perplexity and bits per character of ``model`` on ``corpus``, over
    non-overlapping windows of block_size spread evenly over the text."""
    from attnlab.data import sequential_batches, token_dtype
    from attnlab.training import bits_per_char

    dtype = token_dtype(tokenizer.vocab_size)
    parts, n_chars = [], 0
    for chunk in corpus.chunks():
        parts.append(np.asarray(tokenizer.encode(chunk), dtype=dtype))
        n_chars += len(chunk)
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    block = model.config.block_size
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in sequential_batches(tokens, block, batch_size, max_tokens):
            logits = model(x.to(device))  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(),
                y.to(device).reshape(-1),
                reduction="sum",
            )
            total += float(loss)
            count += y.numel()
    loss = total / count
    cpt = n_chars / max(len(tokens), 1)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_char": bits_per_char(loss, cpt),
        "tokens": count,
        "corpus_tokens": len(tokens),
        "chars_per_token": cpt,
    }


def eval_(args: argparse.Namespace) -> int:
    """``attnlab eval RUN``: a language model is scored on ``--data`` (loss, perplexity, bits
    per character); an encoder-decoder on its own held-out split (exact match, token accuracy)."""
    from attnlab import data
    from attnlab.checkpoint import read_run_config

    model_type = read_run_config(args.run).get("model_type")
    if model_type in ("seq2seq", "rnn"):
        from attnlab.cli.seq2seq import evaluate

        return evaluate(args)
    if model_type != "gpt":
        raise UsageError(
            f"{args.run}: eval scores GPT and encoder-decoder runs, not {model_type!r}"
        )
    if args.data is None:
        raise UsageError("eval of a language model needs --data (the text to score)")

    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {args.batch_size}")
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise UsageError(f"--max-tokens must be positive, got {args.max_tokens}")
    corpus = data.open_corpus(args.data, args.encoding)
    model, tokenizer = _load_gpt(args.run, args.device)
    try:
        r = evaluate_text(model, tokenizer, corpus, args.batch_size, args.max_tokens)
    except data.DataError as e:
        raise data.DataError(f"{args.data}: {e}") from None  # e.g. shorter than one window
    print(f"loss         {r['loss']:.4f}  nats/token")
    print(f"perplexity   {r['perplexity']:.3f}")
    print(f"bits/char    {r['bits_per_char']:.4f}  ({r['chars_per_token']:.3f} chars/token)")
    print(f"tokens       {r['tokens']:,} evaluated of {r['corpus_tokens']:,}")
    return 0


# ---------------------------------------------------------------------------------------------
# parsers
# ---------------------------------------------------------------------------------------------


def register(sub) -> None:
    """Add ``generate`` and ``eval`` (``train --task lm`` lives in cli/train.py)."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    g = sub.add_parser(
        "generate",
        help="sample text from a trained language model",
        formatter_class=fmt,
        description="Continue a prompt with a trained GPT. The text goes to stdout.",
    )
    g.set_defaults(func=generate)
    a = g.add_argument
    a("run", help="run directory")
    a(
        "--prompt",
        action="append",
        help="text to continue (repeat for a batch of prompts; default a newline)",
    )
    a("--max-new-tokens", type=int, default=200)
    a("--temperature", type=float, default=0.8, help="0 = greedy")
    a("--top-k", type=int, default=None)
    a("--top-p", type=float, default=None, help="nucleus sampling, in (0, 1]")
    a("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    a("--stop", action="append", help="stop when this string appears (repeatable)")
    a("--seed", type=int, default=None)
    a("--num-samples", type=int, default=1)
    a(
        "--no-cache",
        action="store_true",
        help="recompute the whole context every step (no KV cache)",
    )
    a("--device", default="auto", help="cpu, cuda or auto")

    e = sub.add_parser(
        "eval",
        help="score a run: a GPT on a text, an encoder-decoder on its test split",
        formatter_class=fmt,
        description="A GPT run: loss, perplexity and bits per character on --data. An "
        "encoder-decoder run: exact match (decoded output == target) and teacher-forced token "
        "accuracy on the held-out split it was trained with.",
    )
    e.set_defaults(func=eval_)
    a = e.add_argument
    a("run", help="run directory")
    a("--data", help="GPT: a text file, a directory of .txt files or a built-in corpus")
    a("--encoding", default="utf-8")
    a("--batch-size", type=int, default=32)
    a("--max-tokens", type=int, default=1 << 20, help="evaluate at most this many tokens")
    a("--device", default="auto", help="cpu, cuda or auto")
    a("--split", choices=["test", "val", "train"], default="test", help="seq2seq: which split")
    a("--beam", type=int, default=1, help="seq2seq: beam width (1 = greedy)")
    a("--alpha", type=float, default=0.6, help="seq2seq: length penalty exponent")
    a("--limit", type=int, default=0, help="seq2seq: evaluate only the first N pairs")
    a("--json", action="store_true", help="seq2seq: print one JSON object")
