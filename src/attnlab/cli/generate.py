"""`attnlab generate RUN [TEXT...]`: a GPT's continuation, sampled or beam-searched; and the
decoding options it shares with ``translate`` (``add_sampling_options``, ``decoding_settings``).

A thin layer over ``attnlab.generation`` (sampling, beam search), whose ``SamplingConfig`` holds
the sampling options' defaults (``Run.generate`` uses the same).
"""

from __future__ import annotations

import argparse
import sys

from attnlab.cli import DescribedHelpFormatter, UsageError, Verb, as_options, register
from attnlab.cli.limits import check_decoding_memory

# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------


def _load_gpt(run: str, device_name: str):
    """A GPT run (an ``attnlab.run.Run``), refused otherwise in one line saying what to use."""
    from attnlab.cli.predict import open_run
    from attnlab.rundir import RunError

    r = open_run(run, device_name)
    if r.model.predicts == "decoder-step":
        raise UsageError(f"{run} is an encoder-decoder run: use attnlab translate "
                         f"{run} TEXT (--temperature 0.8 to sample)")  # fmt: skip
    if r.model.predicts != "next-token" or not r.model.decodes:
        raise UsageError(f"{run}: generate samples from a GPT language model; this run is a "
                         f"{r.kind} ({type(r.model).__name__}): use `attnlab predict`")  # fmt: skip
    if r.tokenizer is None:
        raise RunError(f"{run}: no tokenizer.json")
    return r


SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop")


def _typed(args: argparse.Namespace) -> set[str]:
    """Destination names of the options the user typed (``--top-k 5`` -> top_k)."""
    typed = (t for t in getattr(args, "_argv", []) if t.startswith("--"))
    return {t[2:].split("=", 1)[0].replace("-", "_") for t in typed}


ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescaped(text: str) -> str:
    """``--stop '\\n'`` as typed in a shell (backslash, n) means a newline: \\n, \\t, \\r and
    \\\\ are read as the characters they name; any other backslash stays as it is."""
    import re

    return re.sub(r"\\([ntr\\])", lambda m: ESCAPES[m.group(1)], text)


def add_sampling_options(a, temperature: float) -> None:
    """The sampling options ``generate`` and ``translate`` share (``a`` = add_argument), with
    ``SamplingConfig``'s defaults (``temperature`` is the verb's: translate decodes greedily)."""
    from attnlab.generation import SamplingConfig
    from attnlab.tasks.base import PredictOptions

    a("--temperature", type=float, default=temperature, help="0 = greedy")
    a("--top-k", type=int, default=SamplingConfig.top_k,
      help="sample from the k most probable tokens only (default: all)")  # fmt: skip
    a(
        "--top-p",
        type=float,
        default=SamplingConfig.top_p,
        help="nucleus sampling, in (0, 1] (default: off)",
    )
    a("--repetition-penalty", type=float, default=SamplingConfig.repetition_penalty,
      help="> 1 discourages repeats")  # fmt: skip
    a("--stop", action="append", type=unescaped,
      help="stop when this string appears (repeatable; \\n, \\t, \\r and \\\\ are a newline, a "
      "tab, a carriage return and a backslash)")  # fmt: skip
    a(
        "--seed",
        type=int,
        default=SamplingConfig.seed,
        help="for reproducible samples (default: unseeded)",
    )
    a("--num-samples", type=int, default=1, help="samples per prompt (with --beam: the best N)")
    a("--beam", type=int, default=None,
      help="beam search of this width instead of sampling (default: sample)")  # fmt: skip
    a("--alpha", type=float, default=PredictOptions.alpha,
      help="beam search: length penalty exponent")  # fmt: skip


def decoding_settings(args: argparse.Namespace, max_new_tokens: int | None):
    """The SamplingConfig the options describe; bad or clashing options are a UsageError."""
    from attnlab.generation import SamplingConfig

    names = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty")
    try:
        cfg = SamplingConfig(max_new_tokens, args.temperature, args.top_k, args.top_p,
                             args.repetition_penalty, args.seed)  # fmt: skip
    except ValueError as e:
        raise UsageError(as_options(str(e), names)) from None
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
    """``attnlab generate RUN TEXT`` (or ``--prompt TEXT``): sample a continuation (or beam-search one); text
    on stdout."""
    import dataclasses

    from attnlab.decoding import decoder_for

    cfg = decoding_settings(args, args.max_new_tokens)
    window = _window(args)
    prompts = [*args.text, *(args.prompt or [])] or ["\n"]
    run = _load_gpt(args.run, args.device)
    model, tokenizer = run.model, run.tokenizer
    try:
        decoder_for(model).check_window(window, use_cache=not args.no_cache)
    except ValueError as e:
        raise UsageError(str(e)) from None
    # unknown characters: a one-line error naming them, before any output
    longest = max(len(tokenizer.encode(p)) for p in prompts)
    rows = len(prompts) * (args.beam if args.beam is not None else args.num_samples)
    check_decoding_memory(model, rows, longest, args.max_new_tokens, use_cache=not args.no_cache)
    single = args.beam is None and len(prompts) == 1 and args.num_samples == 1 and not args.json

    def stream(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    if single:
        stream(prompts[0])
    # Run.generate decodes (sampling, or a beam search with --beam): the verb's one logic
    samples = run.generate(prompts, stop=args.stop or (), num_samples=args.num_samples,
                           use_cache=not args.no_cache, stream=stream if single else None,
                           window=window, beam=args.beam, alpha=args.alpha, samples=True,
                           **dataclasses.asdict(cfg))  # fmt: skip
    if single:
        stream("\n")
        return 0
    if args.json:
        return _print_json(run, samples)
    for n, s in enumerate(samples):
        if n:
            print("-" * 40)
        print(s.prompt + s.text)
    return 0


def _window(args: argparse.Namespace) -> str:
    """The window policy as the decoder reads it: ``sinks:K`` for --window sinks --sinks K."""
    from attnlab.decoding import SINKS

    if args.sinks is not None and args.window != "sinks":
        raise UsageError("--sinks is the number of first tokens --window sinks keeps: add "
                         "--window sinks, or drop --sinks")  # fmt: skip
    if args.window == "sinks":
        return f"sinks:{args.sinks if args.sinks is not None else SINKS}"
    return args.window


def _print_json(run, samples) -> int:
    """--json: one object, what the model is (``about``) and a list of {prompt, text} (the
    continuation without the prompt)."""
    import json

    rows = [{"prompt": s.prompt, "text": s.text} for s in samples]
    print(json.dumps({"about": run.about, "samples": rows}, ensure_ascii=False))
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
  sinks  rotary positions only: StreamingLLM's (Xiao et al. 2023) ring that also keeps the
         first --sinks tokens (default 4, the "attention sinks"): each token attends to them
         and to the last block_size - K, with positions as the cache holds them (the sinks
         just before the window). One token per step, as ring.
Within the block all four are the KV cache, equal to recomputing the whole context.
"""


def add(sub) -> None:
    from attnlab.decoding import SINKS, WINDOWS
    from attnlab.generation import SamplingConfig

    g = sub.add_parser(
        "generate",
        help=VERB.help,
        formatter_class=DescribedHelpFormatter,
        description=GENERATE_HELP,
    )
    g.set_defaults(func=generate)
    a = g.add_argument
    a("run", help="run directory")
    a("text", nargs="*", help="text(s) to continue, a batch when several (default: a newline)")
    a("--prompt", action="append", help="a text to continue, as TEXT (repeatable)")
    a(
        "--max-new-tokens",
        type=int,
        default=SamplingConfig.max_new_tokens,
        help="tokens to generate",
    )
    add_sampling_options(a, temperature=SamplingConfig.temperature)
    a("--window", choices=WINDOWS, default="slide", help="what to read past block_size (above)")
    a("--sinks", type=int, metavar="K",
      help=f"--window sinks: how many first tokens it keeps (default {SINKS}; at most "
      "block_size - 1)")  # fmt: skip
    a(
        "--no-cache",
        action="store_true",
        help="recompute the whole window every step (no KV cache)",
    )


VERB = register(
    Verb("generate", 40, add, help="sample text from a trained language model", data=True)
)
