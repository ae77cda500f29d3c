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

from attnlab.errors import AttnlabError
from attnlab.render.terminal import fitted_stdout

AREAS = (
    "train",
    "predict",
    "lm",
    "look",
    "interop",
    "seq2seq",
    "vision",
    "intervene",
    "timeline",
    "experiment",
)


# Every verb, the module under attnlab.cli that registers it, and its one line in `attnlab
# --help`. The verb list, a missing or mistyped verb and a mistyped top-level option are
# answered from this table alone (no torch import: well under half a second); only the named
# verb's module is imported to read its options. A test holds it to what the modules register.
VERBS: dict[str, tuple[str, str]] = {
    "train": ("train", "train a model on a text, a task or a TSV file"),
    "predict": ("predict", "what a run predicts for each input (any kind of run)"),
    "eval": ("predict", "score a run on its held-out split or a file (any kind of run)"),
    "generate": ("lm", "sample text from a trained language model"),
    "trace": ("look", "explain one forward pass step by step"),
    "attention": ("look", "the token x token attention matrix of a layer and head"),
    "similarity": ("look", "token x token cosine similarity before and after each block"),
    "influence": ("look", "how far its context moved each token, layer by layer"),
    "explore": ("look", "write a self-contained HTML explorer (no network)"),
    "check": ("look", "conformance checks: no future leak, cache == no cache, ..."),
    "import-hf": ("interop", "convert a Hugging Face model directory (GPT-2, BERT, Llama, "
                  "Mistral, Qwen2/3, Gemma 1-3, Pythia, T5, ViT) into a run directory"),
    "export-hf": ("interop", "write a GPT or encoder run as a Hugging Face directory (GPT-2, "
                  "Llama, Qwen, BERT)"),
    "embed": ("interop", "sentence embedding from an encoder run (JSON list on stdout)"),
    "translate": ("seq2seq", "translate text with a trained encoder-decoder run"),
    "classify": ("vision", "the top classes of a text or an image under a trained classifier"),
    "ablate": ("intervene", "knock out heads (or any activation): loss change"),
    "patch": ("intervene", "activation patching from a clean into a corrupt input"),
    "lens": ("intervene", "the logit lens (or tuned lens) at every layer"),
    "attribute": ("intervene", "attribute an output: dla, rollout, flow, ig, grad"),
    "heads": ("intervene", "every head's scores (previous-token, induction, ...) and kind; "
              "--importance: the loss without it"),
    "timeline": ("timeline", "the loss curve beside every head's scores over training (from "
                 "its snapshots)"),
    "experiment": ("experiment", "rerun a classic experiment on attention and compare with the "
                   "paper"),
}  # fmt: skip
DESCRIPTION = ("Build, train and look inside transformers. Every verb prints its results on "
               "stdout and its progress on stderr; `attnlab VERB --help` describes a verb.")  # fmt: skip


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


# Verbs that run no model; every other verb takes --threads (see add_threads_option).
NO_MODEL_VERBS = {"import-hf", "export-hf"}
# Verbs whose library call chooses the threads itself (training.run.train: the Python API makes
# the same choice); the CLI passes --threads on to them instead of choosing first.
OWN_THREADS_VERBS = {"train"}
# Verbs that run a model take --device and --dtype (and --json, but for these two: embed's
# result is JSON already, explore's is a page); timeline reads snapshots and runs none.
READS_ONLY_VERBS = NO_MODEL_VERBS | {"timeline"}
NO_JSON_VERBS = {"embed", "explore"}
# Verbs whose stdout is data, passed on as written: a model's text (one output line per input
# line for translate) or a vector. Every other verb's stdout, and any verb's without --json,
# is fitted to the terminal (attnlab.render.terminal: 80 columns into a pipe).
DATA_OUTPUT_VERBS = {"generate", "translate", "embed"}
# check compares computations with float32 tolerances: it runs in float32 (no --dtype)
NO_DTYPE_VERBS = {"check"}
# verbs whose --dtype is the dtype of the weights they write, not of a model they run
WEIGHTS_DTYPE_VERBS = {"import-hf"}


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


def _top_parser() -> tuple[Parser, argparse._SubParsersAction]:
    from attnlab import __version__

    parser = Parser(prog="attnlab", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    return parser, parser.add_subparsers(dest="verb", required=True, metavar="VERB")


def verb_list_parser() -> Parser:
    """``attnlab`` with every verb named and described but none of their options (VERBS): what
    answers ``attnlab --help``, a missing or mistyped verb, and a mistyped option before the
    verb, without importing any verb's module (or torch)."""
    parser, sub = _top_parser()
    for verb, (_, help) in VERBS.items():
        sub.add_parser(verb, help=help)
    return parser


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``verb``, only the module that registers it is imported
    (its neighbours come along), which is all that parsing that verb's options needs."""
    parser, sub = _top_parser()
    areas = AREAS if verb is None else (VERBS[verb][0],)
    for area in areas:
        importlib.import_module(f"attnlab.cli.{area}").register(sub)
    for verb, p in sub.choices.items():
        if verb not in NO_MODEL_VERBS:
            add_threads_option(p)
        if verb not in READS_ONLY_VERBS:
            add_model_options(p, json=verb not in NO_JSON_VERBS, dtype=verb not in NO_DTYPE_VERBS)
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

    if args.verb == "train" or not hasattr(args, "device"):
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
    given = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in given if not a.startswith("-")), None)
    if verb not in VERBS or given[0].startswith("-") and given[0] not in ("-h", "--help"):
        # the verb list, or one line saying what is wrong, from VERBS alone: no torch import
        verb_list_parser().parse_args(given)
    try:
        with _interrupts_deferred() as interrupted:  # importing torch, building the parser
            from attnlab import runtime

            runtime.start_cpu_sample()
            parser = build_parser(verb)  # imports the module that registers the verb
        if interrupted:
            raise KeyboardInterrupt
        args = parser.parse_args(argv)
        args._argv = list(sys.argv[1:] if argv is None else argv)  # lets a verb see what was given
        threads = vars(args).pop("threads", None)  # the CLI's option, not the verb's
        data = getattr(args, "json", False) or args.verb in DATA_OUTPUT_VERBS
        with contextlib.nullcontext() if data else fitted_stdout():
            if args.verb in OWN_THREADS_VERBS:
                args.threads = threads  # the library chooses, as it does when called from Python
                result = args.func(args)
            elif (
                args.verb not in NO_MODEL_VERBS
            ):  # chosen now, said by the verb (the Trainer logs it)
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
