"""attnlab's command line: argument parsing only; every verb calls a library function.

Results go to stdout, progress and logs to stderr. Bad input exits 2 with one line on stderr.
Each area of verbs lives in its own module here and registers its sub-parsers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys

AREAS = ("train", "predict", "lm", "look", "interop", "seq2seq", "vision", "intervene", "timeline")


class UsageError(ValueError):
    """Bad input from the user: reported as one line, exit code 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'bad input', reported without a traceback."""
    from attnlab.checkpoint import RunError
    from attnlab.config import ConfigError
    from attnlab.tokenizers import TokenizerError

    errors = [UsageError, RunError, ConfigError, TokenizerError, FileNotFoundError, IsADirectoryError,
              NotADirectoryError, PermissionError, UnicodeDecodeError]  # fmt: skip
    try:
        from attnlab.data import DataError

        errors.append(DataError)
    except ImportError:
        pass
    from attnlab.interventions.subjects import InterventionError

    errors.append(InterventionError)
    return tuple(errors)


def as_options(message: str, names) -> str:
    """'top_p must be ...' -> '--top-p must be ...' so the message names what the user typed."""
    import re

    for name in sorted(names, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}\b", "--" + name.replace("_", "-"), message)
    return message


def options_from(cls, **values):
    """``cls(**values)`` (a self-validating config), its ConfigError reworded as a usage error
    naming the options the user typed (``--beam``, not ``beam``): one line, exit 2."""
    from attnlab.config import ConfigError

    try:
        return cls(**values)
    except (ConfigError, ValueError) as e:
        raise UsageError(as_options(str(e), values)) from None


def output_file(path: str | None, suffix: str, option: str):
    """Check an output file before any work: its suffix, that its directory exists and that it
    is not a directory (a UsageError naming ``option`` otherwise). Returns a Path, or None."""
    from pathlib import Path

    if path is None:
        return None
    p = Path(path)
    if p.suffix.lower() != suffix:
        raise UsageError(f"{option} {path}: expected a {suffix} file name")
    if not p.parent.is_dir():
        raise UsageError(f"{option} {path}: directory {p.parent} does not exist")
    if p.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    return p


def int_at_least(low: int):
    """An argparse type: an integer >= low (argparse turns the error into exit 2)."""

    def conv(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {n}")
        return n

    conv.__name__ = "integer"
    return conv


# Verbs that run no model; every other verb takes --threads (see add_threads_option).
NO_MODEL_VERBS = {"import-hf", "export-hf"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="Build, train and look inside transformers. Every verb prints its results on "
        "stdout and its progress on stderr.",
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for area in AREAS:
        importlib.import_module(f"attnlab.cli.{area}").register(sub)
    for verb, p in sub.choices.items():
        if verb not in NO_MODEL_VERBS:
            add_threads_option(p)
    return parser


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: torch's CPU threads for this run (the policy is in attnlab.runtime)."""

    parser.add_argument(
        "--threads",
        type=int_at_least(1),
        default=argparse.SUPPRESS,  # absent = the policy's choice (no "(default: None)" in help)
        metavar="N",
        help="CPU threads for torch (default: OMP_NUM_THREADS if set, else one per core, fewer "
        "when other processes keep cores busy)",
    )


def main(argv: list[str] | None = None) -> int:
    try:
        with _interrupts_deferred() as interrupted:  # importing torch, building the parser
            from attnlab import runtime

            runtime.start_cpu_sample()
            parser = build_parser()  # imports every area's verbs
        if interrupted:
            raise KeyboardInterrupt
        args = parser.parse_args(argv)
        args._argv = list(sys.argv[1:] if argv is None else argv)  # lets a verb see what was given
        threads = vars(args).pop("threads", None)  # the CLI's option, not the verb's
        if args.verb not in NO_MODEL_VERBS:  # chosen now, said by the verb (the Trainer logs it)
            with runtime.using_threads(threads):
                result = args.func(args)
        else:
            result = args.func(args)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except user_errors() as e:
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        print(f"attnlab: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: still one line, with a way to see the traceback
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        print(f"attnlab: internal error: {type(e).__name__}: {_one_line(e)} "
              "(set ATTNLAB_DEBUG=1 for the traceback)", file=sys.stderr)  # fmt: skip
        return 1
    return int(result or 0)


@contextlib.contextmanager
def _interrupts_deferred():
    """Ctrl-C is noted, not raised, inside the block; the list it yields is non-empty after one.

    Why: a KeyboardInterrupt raised while torch imports can land inside C code that swallows
    it (torch's extension imports numpy and carries on if that import fails), and then the
    Ctrl-C is lost and the command runs to its end. Noting it and raising after the imports
    makes Ctrl-C at any moment exit 130 with one line (at most an import's length later)."""
    seen: list[int] = []
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            raise ValueError  # ignored (a background job) or someone else's: leave it be
        previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    except ValueError:  # also raised outside the main thread: signals are not ours there
        yield seen
        return
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _one_line(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError) and e.filename:
        return f"{e.filename}: no such file or directory"
    if isinstance(e, PermissionError) and e.filename:
        return f"{e.filename}: permission denied"
    if isinstance(e, UnicodeDecodeError):
        return f"input is not valid {e.encoding} text (pass --encoding to name its encoding)"
    text = str(e).strip() or type(e).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
