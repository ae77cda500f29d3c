"""Language-model verbs: ``generate`` and ``eval`` (``train --task lm`` is cli/train.py).

Every verb is a thin layer over the library: ``attnlab.data`` (corpus, token windows),
``attnlab.generation`` (sampling), ``attnlab.checkpoint``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from attnlab import checkpoint as ckpt
from attnlab.cli import UsageError
from attnlab.config import ConfigError
from attnlab.models.gpt import WINDOWS


def _as_options(message: str, names) -> str:
    """'top_p must be ...' -> '--top-p must be ...' so the message names what the user typed."""
    import re

    for name in sorted(names, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}\b", "--" + name.replace("_", "-"), message)
    return message


# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------


def _device(name: str) -> torch.device:
    from attnlab.runtime import resolve_device

    try:
        device = resolve_device(name)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return device


def _load_gpt(run: str, device_name: str):
    from attnlab.models.gpt import GPT

    device = _device(device_name)
    model, tokenizer = ckpt.load_run(run, device=device)
    if not isinstance(model, GPT):
        raise UsageError(
            f"{run}: a {type(model).__name__} run; this verb needs a GPT language model"
        )
    if tokenizer is None:
        raise ckpt.RunError(f"{run}: no tokenizer.json")
    return model, tokenizer


SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop")


def _typed(args: argparse.Namespace) -> set[str]:
    """Destination names of the options the user typed (``--top-k 5`` -> top_k)."""
    typed = (t for t in getattr(args, "_argv", []) if t.startswith("--"))
    return {t[2:].split("=", 1)[0].replace("-", "_") for t in typed}


def add_sampling_options(a, temperature: float) -> None:
    """The sampling options ``generate`` and ``translate`` share (``a`` = add_argument)."""
    a("--temperature", type=float, default=temperature, help="0 = greedy")
    a("--top-k", type=int, default=None, help="sample from the k most probable tokens only")
    a("--top-p", type=float, default=None, help="nucleus sampling, in (0, 1]")
    a("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    a("--stop", action="append", help="stop when this string appears (repeatable)")
    a("--seed", type=int, default=None, help="for reproducible samples")
    a("--num-samples", type=int, default=1, help="samples per prompt (with --beam: the best N)")
    a("--beam", type=int, default=None, help="beam search of this width instead of sampling")
    a("--alpha", type=float, default=0.6, help="beam search: length penalty exponent")


def decoding_settings(args: argparse.Namespace, max_new_tokens: int | None):
    """The SamplingConfig the options describe; bad or clashing options are a UsageError."""
    from attnlab.generation import SamplingConfig

    names = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty")
    try:
        cfg = SamplingConfig(max_new_tokens, args.temperature, args.top_k, args.top_p,
                             args.repetition_penalty, args.seed)  # fmt: skip
    except ValueError as e:
        raise UsageError(_as_options(str(e), names)) from None
    if args.num_samples <= 0:
        raise UsageError(f"--num-samples must be positive, got {args.num_samples}")
    if args.beam is not None:
        if args.beam < 1:
            raise UsageError(f"--beam must be >= 1, got {args.beam}")
        clash = sorted(_typed(args) & set(SAMPLING_OPTIONS))
        if clash:
            flags = ", ".join("--" + n.replace("_", "-") for n in clash)
            raise UsageError(f"--beam searches without sampling: drop {flags}")
        if args.num_samples > args.beam:
            raise UsageError(f"--num-samples {args.num_samples} is more than --beam {args.beam} "
                             "hypotheses")  # fmt: skip
    return cfg


def generate(args: argparse.Namespace) -> int:
    """``attnlab generate RUN --prompt TEXT``: sample a continuation (or beam-search one); text
    on stdout."""
    from attnlab.checkpoint import read_run_config
    from attnlab.generation import beam_generate
    from attnlab.generation import generate as sample

    cfg = decoding_settings(args, args.max_new_tokens)
    if read_run_config(args.run).get("model_type") in ("seq2seq", "rnn"):
        raise UsageError(f"{args.run} is an encoder-decoder run: use attnlab translate "
                         f"{args.run} TEXT (--temperature 0.8 to sample)")  # fmt: skip
    prompts = args.prompt or ["\n"]
    model, tokenizer = _load_gpt(args.run, args.device)
    try:
        model.check_window(args.window, use_cache=not args.no_cache)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for p in prompts:
        tokenizer.encode(p)  # unknown characters: a one-line error naming them, before any output
    if args.beam is not None:
        best = beam_generate(model, tokenizer, prompts, args.beam, args.alpha,
                             args.max_new_tokens, n_best=args.num_samples, window=args.window,
                             use_cache=not args.no_cache)  # fmt: skip
        print(("\n" + "-" * 40 + "\n").join(s.prompt + s.text for row in best for s in row))
        return 0
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
        window=args.window,
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
    from attnlab.data import token_dtype
    from attnlab.tasks.lm import score_tokens

    dtype = token_dtype(tokenizer.vocab_size)
    parts, n_chars = [], 0
    for chunk in corpus.chunks():
        parts.append(np.asarray(tokenizer.encode(chunk), dtype=dtype))
        n_chars += len(chunk)
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return score_tokens(model, tokens, n_chars / max(len(tokens), 1), batch_size, max_tokens)


def eval_(args: argparse.Namespace) -> int:
    """``attnlab eval RUN``: a language model is scored on ``--data`` or its own held-out split
    (loss, perplexity, bits per character); an encoder-decoder on its own held-out split (exact
    match, token accuracy). ``--ablate L.H[,...]``: the figures intact and with those heads
    ablated (``_eval_ablated``)."""
    from attnlab import data
    from attnlab.checkpoint import read_run_config

    cfg = read_run_config(args.run)
    model_type = cfg.get("model_type")
    if args.ablate:
        return _eval_ablated(args, model_type)
    if cfg.get("task") == "induction" and args.data is None:  # in-context loss on r r
        from attnlab.cli.timeline import eval_induction

        return eval_induction(args)
    if model_type in ("seq2seq", "rnn"):
        from attnlab.cli.seq2seq import evaluate

        return evaluate(args)
    if model_type != "gpt":
        raise UsageError(
            f"{args.run}: eval scores GPT and encoder-decoder runs, not {model_type!r}"
        )
    _check_text_options(args)
    if args.data is None:
        return _eval_held_out(args)
    corpus = data.open_corpus(args.data, args.encoding)
    model, tokenizer = _load_gpt(args.run, args.device)
    _print_scores(_score_text(model, tokenizer, corpus, args))
    return 0


def _eval_held_out(args: argparse.Namespace) -> int:
    """A GPT run without --data: its own held-out split, read from its token shards (streamed:
    only the windows scored are read)."""
    from attnlab.data import ShardError
    from attnlab.tasks import open_task
    from attnlab.tasks.lm import score_tokens

    try:
        task = open_task(args.run, with_data=True)
    except ShardError as e:
        raise ShardError(f"{e}; score a text with --data") from None
    model, _ = _load_gpt(args.run, args.device)
    r = score_tokens(model, task.val_tokens, task.info.chars_per_token, args.batch_size,
                     args.max_tokens)  # fmt: skip
    print(f"held-out split of {task.options.data} ({task.options.val_fraction:.0%} of its tokens)")
    _print_scores(r)
    return 0


def _print_scores(r: dict) -> None:
    print(f"loss         {r['loss']:.4f}  nats/token")
    print(f"perplexity   {r['perplexity']:.3f}")
    print(f"bits/char    {r['bits_per_char']:.4f}  ({r['chars_per_token']:.3f} chars/token)")
    print(f"tokens       {r['tokens']:,} evaluated of {r['corpus_tokens']:,}")


def _check_text_options(args) -> None:
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {args.batch_size}")
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise UsageError(f"--max-tokens must be positive, got {args.max_tokens}")


def _score_text(model, tokenizer, corpus, args) -> dict:
    from attnlab import data

    try:
        return evaluate_text(model, tokenizer, corpus, args.batch_size, args.max_tokens)
    except data.DataError as e:
        raise data.DataError(f"{args.data}: {e}") from None  # e.g. shorter than one window


SEQ2SEQ_OPTIONS = ("--split", "--beam", "--alpha", "--limit")


def _eval_ablated(args, model_type: str | None) -> int:
    """``eval RUN --ablate L.H[,...] [--mode M]``: the run's figures intact and with those heads
    ablated. With ``--data`` a GPT is scored on that text; otherwise any trained run is scored
    on its task's held-out split, as training scored it (``interventions.held_out``)."""
    from attnlab import data
    from attnlab.inspect.display import console
    from attnlab.interventions import ablated_eval, held_out

    if args.data is not None:
        if model_type != "gpt":
            raise UsageError(f"--data scores a GPT on a text; this is a {model_type!r} run: "
                             "without --data it is scored on its own held-out split")  # fmt: skip
        _check_text_options(args)
        corpus = data.open_corpus(args.data, args.encoding)
        model, tokenizer = _load_gpt(args.run, args.device)

        def score() -> dict:
            r = _score_text(model, tokenizer, corpus, args)
            return {k: r[k] for k in ("loss", "perplexity", "bits_per_char", "tokens")}

        source = f"{args.data}"
    else:
        given = [o for o in SEQ2SEQ_OPTIONS if any(a.split("=")[0] == o for a in args._argv)]
        if given:
            raise UsageError(f"{given[0]} does not apply to --ablate: the run is scored on the "
                             "held-out split it was trained with, as training scored it")  # fmt: skip
        h = held_out(args.run, _device(args.device))
        model, score, source = h.model, h.figures, h.source
    result = ablated_eval(model, score, args.ablate, args.mode, source, quiet=False)
    if args.json:
        print(result.to_json())
    else:
        console().print(result)
    return 0


# ---------------------------------------------------------------------------------------------
# parsers
# ---------------------------------------------------------------------------------------------


GENERATE_HELP = """\
Continue a prompt with a trained GPT (sampling, or beam search with --beam N). The text goes to
stdout. An encoder-decoder run samples with `attnlab translate RUN TEXT --temperature 0.8`.

Past block_size tokens, --window says what the next token is predicted from:
  slide  (default; nanoGPT's) the last block_size tokens, recomputed in one pass every step:
         exact, and as costly per token as a forward pass over a whole block.
  shift  the tokens since a multiple of block_size/2: the earliest that leaves at most
         block_size. When that start moves (every block_size/2 tokens) the kept half is
         prefilled into the KV cache in one pass, then the cache grows one token at a time.
         Exact for its window, which holds between block_size/2 + 1 and block_size tokens.
  ring   rotary positions only: sliding-window attention, the KV cache a ring of block_size
         slots. One token per step at any length, but past the block it approximates slide:
         from the second layer on, a kept token's key and value are the ones computed when
         it was fed, when it saw tokens that have since left the window.
Within the block all three are the KV cache, equal to recomputing the whole context.
"""


class _DescribedDefaults(
    argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter
):
    """Help with the description as written and every option's default."""


def register(sub) -> None:
    """Add ``generate`` and ``eval`` (``train --task lm`` lives in cli/train.py)."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    g = sub.add_parser(
        "generate",
        help="sample text from a trained language model",
        formatter_class=_DescribedDefaults,
        description=GENERATE_HELP,
    )
    g.set_defaults(func=generate)
    a = g.add_argument
    a("run", help="run directory")
    a(
        "--prompt",
        action="append",
        help="text to continue (repeat for a batch of prompts; default a newline)",
    )
    a("--max-new-tokens", type=int, default=200, help="tokens to generate")
    add_sampling_options(a, temperature=0.8)
    a("--window", choices=WINDOWS, default="slide", help="what to read past block_size (above)")
    a(
        "--no-cache",
        action="store_true",
        help="recompute the whole window every step (no KV cache)",
    )
    a("--device", default="auto", help="cpu, cuda or auto")

    e = sub.add_parser(
        "eval",
        help="score a run: a GPT on a text, an encoder-decoder on its test split",
        formatter_class=fmt,
        description="A GPT run: loss, perplexity and bits per character on --data, or on the "
        "held-out split it was trained with (read from its token shards). An "
        "encoder-decoder run: exact match (decoded output == target) and teacher-forced token "
        "accuracy on the held-out split it was trained with.",
    )
    e.set_defaults(func=eval_)
    a = e.add_argument
    a("run", help="run directory")
    a(
        "--data",
        help="GPT: a text file, a directory of .txt files or a built-in corpus "
        "(default: the run's own held-out split, read from its token shards)",
    )
    a("--encoding", default="utf-8")
    a("--batch-size", type=int, default=32)
    a("--max-tokens", type=int, default=1 << 20, help="evaluate at most this many tokens")
    a("--device", default="auto", help="cpu, cuda or auto")
    a("--split", choices=["test", "val", "train"], default="test", help="seq2seq: which split")
    a("--beam", type=int, default=1, help="seq2seq: beam width (1 = greedy)")
    a("--alpha", type=float, default=0.6, help="seq2seq: length penalty exponent")
    a("--limit", type=int, default=0, help="seq2seq: evaluate only the first N pairs")
    a("--json", action="store_true", help="seq2seq, induction and --ablate: print one JSON object")
    a("--ablate", metavar="L.H[,L.H...]",
      help="the figures intact and with these heads ablated (1.2; decoder.0.1, cross.1.0, "
      "encoder.0.3 in an encoder-decoder; context for an LSTM); without --data, on the run's "
      "held-out split, for every task")  # fmt: skip
    a("--mode", choices=("zero", "mean", "resample"), default="zero", help="--ablate: how")
