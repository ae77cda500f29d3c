"""attnlab's command line: argument parsing only; every verb calls a library function.

Results go to stdout, progress and logs to stderr. Bad input exits 2 with one line on stderr.

One module per verb, named after it (``import-hf`` is ``import_hf.py``): to add a verb, add a
module here that defines a function adding its sub-parser (``add(sub)``, which sets
``func``) and registers it, ``VERB = register(Verb("name", order, add))``. ``build_parser``
finds every module of this package (nothing lists them) and adds the verbs in ``order``, the
place each has in ``attnlab --help``; ``Verb`` says which common options the verb takes.
Modules that register no verb hold what several verbs share (``common.py``, ``limits.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from attnlab.errors import AttnlabError
from attnlab.registry import Registry

VERBS = Registry("attnlab.cli")


@dataclass(frozen=True)
class Verb:
    """A verb of ``attnlab``, declared by the module named after it.

    ``add(sub)`` adds its parser to the sub-parsers and sets its ``func``; ``order`` is its
    place in ``attnlab --help`` (lower first). ``runs``: "model" (it loads and runs a model:
    it takes ``--threads``, ``--device``, ``--dtype`` and ``--json``), "files" (it reads a
    run's files and runs no model, timeline: ``--threads`` only) or "nothing" (import-hf,
    export-hf: neither). ``json`` False: no ``--json`` (embed's result is JSON already,
    explore's a page). ``dtype``: "autocast" (the dtype its model runs in), None (none: check
    compares in float32) or "weights" (its own ``--dtype``, of the weights it writes).
    ``own_threads``: its library call chooses the threads itself, as it does from Python
    (train), so ``--threads`` is passed on to it instead of being chosen first."""

    name: str
    order: int
    add: Callable[[argparse._SubParsersAction], None]
    runs: str = "model"
    json: bool = True
    dtype: str | None = "autocast"
    own_threads: bool = False


def register(verb: Verb) -> Verb:
    """Register a verb (in its own module: see the package docstring)."""
    return VERBS.register(verb)


def registered() -> dict[str, Verb]:
    """Every verb by name, in ``attnlab --help``'s order (every module here imported first)."""
    return VERBS.registered()


class UsageError(AttnlabError):
    """Bad input from the user: reported as one line, exit code 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'bad input', reported without a traceback: attnlab's own
    (every one an AttnlabError), plus the operating system's word that a path the user gave is
    missing, of the wrong kind or unreadable, and text that is not in the encoding named."""
    return (AttnlabError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
            PermissionError, UnicodeDecodeError)  # fmt: skip


def as_options(message: str, names) -> str:
    """'top_p must be ...' -> '--top-p must be ...' so the message names what the user typed."""
    import re

    for name in sorted(names, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}\b", "--" + name.replace("_", "-"), message)
    return message


def options_from(cls, **values):
    """``cls(**values)`` (a self-validating config), its ConfigError reworded as a usage error
    naming the options the user typed (``--beam``, not ``beam``): one line, exit 2."""
    try:
        return cls(**values)
    except ValueError as e:  # a ConfigError, or a plain ValueError from a check it calls
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
    """An argparse type: an integer >= low (its upper bound, if any, is the table's in
    attnlab.cli.limits, which ``build_parser`` applies to every numeric option)."""
    from attnlab.cli.limits import bounded

    return bounded(int, low)


class HelpFormatter(argparse.HelpFormatter):
    """Each option's help followed by its default, as the parser holds it (so a default is
    written once, where it is defined). A switch (off by default) and an option whose absence
    its help explains (default None, or a help that already says "default") show none."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or default in (None, False, argparse.SUPPRESS)
            or "default" in text.lower()
        ):
            return text
        return text + " (default: %(default)s)"


class DescribedHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """The same, with the description (and epilog) kept as written."""


class Parser(argparse.ArgumentParser):
    """argparse with attnlab's convention for bad input: one line ``attnlab: error: ...`` on
    stderr and exit 2 (no usage block first); an unknown verb, option or choice names the
    closest one (``did you mean ...?``)."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {self._reworded(message)}\n")

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
            known = [o for a in self._actions for o in a.option_strings]
            if not any(o.startswith(argv[0].split("=")[0]) for o in known):
                self.error(unknown_option(argv[0], known, "attnlab --help"))
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            verb = getattr(parsed, "verb", None)
            sub = verbs(self).get(verb)
            known = [o for a in (sub or self)._actions for o in a.option_strings]
            where = f"attnlab {verb} --help" if verb else "attnlab --help"
            if extras[0].startswith("-"):
                self.error(unknown_option(extras[0], known, where))
            self.error(f"unexpected argument {extras[0]!r} (quote a text that has spaces; "
                       f"{where} lists what {verb or 'attnlab'} takes)")  # fmt: skip
        return parsed

    def _reworded(self, message: str) -> str:
        """argparse's messages in attnlab's words: an unknown verb or choice with the closest
        one, and a missing verb with where to find the list."""
        import difflib
        import re

        if re.match(r"the following arguments are required: VERB", message):
            return "give a verb: attnlab VERB ... (attnlab --help lists them)"
        m = re.match(r"argument (\S+): (must be .*)$", message, re.DOTALL)
        if m:  # a bounded option's converter: '--lr must be positive, got 0'
            return f"{m.group(1).split('/')[-1]} {m.group(2)}"
        m = re.match(
            r"argument (\S+?)(?:/\S+)?: invalid choice: (.+?) \(choose from .*\)$", message
        )
        if m:
            name, given = m.group(1), m.group(2).strip("'\"")
            action = next((a for a in self._actions
                           if name in a.option_strings or a.metavar == name), None)  # fmt: skip
            choices = [str(c) for c in (action.choices or ())] if action else []
            close = difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
            what = "verb" if name == "VERB" else f"{name} choice"
            if close:
                return f"unknown {what} {given!r}; did you mean {close[0]!r}?"
            if name == "VERB":
                return f"unknown verb {given!r} (attnlab --help lists them)"
            return f"unknown {what} {given!r} (choose from {', '.join(choices)})"
        return message


def unknown_option(given: str, known: list[str], where: str) -> str:
    """``unknown option '--max-itres'; did you mean '--max-iters'?``"""
    import difflib

    name = given.split("=", 1)[0]
    close = difflib.get_close_matches(name, [o for o in known if o.startswith("--")], n=1,
                                      cutoff=0.6)  # fmt: skip
    if close:
        return f"unknown option {name!r}; did you mean {close[0]!r}?"
    return f"unknown option {name!r} ({where} lists the options)"


def verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """verb -> its sub-parser."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def build_parser() -> argparse.ArgumentParser:
    from attnlab import __version__

    parser = Parser(
        prog="attnlab",
        description="Build, train and look inside transformers. Every verb prints its results on "
        "stdout and its progress on stderr; `attnlab VERB --help` describes a verb.",
    )
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in registered().values():
        verb.add(sub)
        p = sub.choices[verb.name]
        if verb.runs != "nothing":
            add_threads_option(p)
        if verb.runs == "model":
            add_model_options(p, json=verb.json, dtype=verb.dtype == "autocast")
    from attnlab.cli import limits

    limits.apply(sub.choices)  # every numeric option's bound, from the one table
    return parser


def add_model_options(
    parser: argparse.ArgumentParser, json: bool = True, dtype: bool = True
) -> None:
    """``--device``, ``--dtype`` and ``--json``, spelt and defaulted alike on every verb that
    runs a model (the defaults are TrainConfig's; a verb that defines one keeps its own)."""
    from attnlab.train_config import DTYPES, TrainConfig

    have = {o for a in parser._actions for o in a.option_strings}
    if "--device" not in have:
        parser.add_argument("--device", default=TrainConfig.device,
                            help="where the model runs: cpu, cuda, cuda:N, mps, xpu, or auto "
                            "(a GPU when torch sees one, else the CPU)")  # fmt: skip
    if dtype and "--dtype" not in have:
        parser.add_argument("--dtype", choices=DTYPES, default=TrainConfig.dtype,
                            help="autocast dtype (auto: bfloat16 on a GPU that has it, else "
                            "float32)")  # fmt: skip
    if json and "--json" not in have:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")


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


def _model_context(args: argparse.Namespace):
    """The device and autocast a verb's model runs in, checked before any work (a device this
    machine lacks is one line, exit 2). ``train`` takes them into its TrainConfig instead."""
    from attnlab import runtime

    if not hasattr(args, "device"):
        return contextlib.nullcontext()
    device = runtime.resolve_device(args.device)
    args.device = str(device)  # "auto" resolved once: the verb's loaders take it as is
    if not hasattr(args, "dtype"):
        return contextlib.nullcontext()
    return runtime.autocast(device, runtime.resolve_dtype(args.dtype, device))


def main(argv: list[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv) == ["--version"]:  # at once: no torch import
        from attnlab import __version__

        print(f"attnlab {__version__}")
        return 0
    try:
        with _interrupts_deferred() as interrupted:  # importing torch, building the parser
            from attnlab import runtime

            runtime.start_cpu_sample()
            parser = build_parser()  # imports every verb's module
        if interrupted:
            raise KeyboardInterrupt
        args = parser.parse_args(argv)
        args._argv = list(sys.argv[1:] if argv is None else argv)  # lets a verb see what was given
        threads = vars(args).pop("threads", None)  # the CLI's option, not the verb's
        verb = registered()[args.verb]
        if verb.own_threads:
            args.threads = threads  # the library chooses, as it does when called from Python
            result = args.func(args)
        elif verb.runs != "nothing":  # chosen now, said by the verb (the Trainer logs it)
            with runtime.using_threads(threads), _model_context(args):
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
