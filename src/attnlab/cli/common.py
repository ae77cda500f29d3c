"""What the look-inside and intervention verbs share (no verb lives here): opening the run,
the options they spell alike, and printing a result (a table, or ``--json``; ``--png FILE``
also draws it; "wrote FILE" lines go to stderr)."""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab.cli import UsageError


def load(args):
    """The run (``attnlab.run.Run``): each verb calls its method, which the Python API shares."""
    from attnlab.run import load_run

    return load_run(args.run, args.device)


def record(args):
    """(model, tokenizer, Recording): the run's ``record``, which knows its class names and
    where imported weights came from."""
    run = load(args)
    return run.model, run.tokenizer, run.record(args.text)


def print_dict(run, d: dict, as_json: bool, lines) -> None:
    """A Run method's plain dict on stdout: as JSON after "about" (what the model is, as every
    --json starts), or as the terminal lines ``lines()`` renders."""
    import json

    print(json.dumps({"about": run.about, **d}) if as_json else "\n".join(lines()))


def print_result(result, as_json: bool = False) -> None:
    """The result on stdout: its JSON (which starts with "about"), or its terminal rendering
    after a line saying what the model is (a trace says it itself)."""
    from attnlab.inspect.trace import Trace
    from attnlab.render.display import console

    if as_json:
        sys.stdout.write(result.to_json() + "\n")
        return
    out = console()
    if result.about and result.about.get("description") and not isinstance(result, Trace):
        out.print(f"the model: {result.about['description']}.", style="italic", markup=False)
    out.print(result)


def show(result, args) -> int:
    """An intervention's result: write --png (before printing, so a failed write prints only
    its error), then print."""
    from attnlab.render.display import console

    png = getattr(args, "_png", None)
    if png is not None:
        result.save_png(png)
    if getattr(result, "warning", None) and args.json:  # the text rendering says it itself
        print(f"attnlab: warning: {result.warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        console().print(result)
    if png is not None:
        print(f"wrote {png} ({png.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)
    return 0


def wrote(path: Path, what: str) -> None:
    print(f"wrote {what} {path} ({path.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)


def first_key(start: int, n: int) -> int:
    """--start: the first key column of the terminal tables, one of the text's n tokens."""
    if start >= max(1, n):
        raise UsageError(f"--start {start}: the text has {n} tokens (0..{n - 1})")
    return start


def ints(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected integers separated by commas") from None


def run_and_text(p) -> None:
    """The look-inside verbs' RUN TEXT."""
    p.add_argument("run", help="run directory (written by `attnlab train` or `import-hf`)")
    p.add_argument("text", help="the text to run through the model")


def intervention_arguments(p, text: bool = True) -> None:
    """The intervention verbs' RUN [TEXT], --png and --json."""
    p.add_argument("run", help="run directory (trained or imported)")
    if text:
        p.add_argument("text", help="the input: text, or for a ViT an image file or test:N")
    p.add_argument("--png", metavar="FILE", help="also draw the result into a PNG")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def position_option(p) -> None:
    """--position: the output position an intervention's metric reads."""
    p.add_argument("--position", type=int, default=None,
                   help="output position the metric reads (default: the last; a masked "
                   "LM: the first [MASK]; an encoder-decoder: where the output is TARGET)")  # fmt: skip
