"""`attnlab predict RUN INPUT...`: one answer per input, for every kind of run (``Run.predict``);
``classify`` and ``translate`` are ``predict`` for one kind, and print the same lines
(``open_run`` and ``print_predictions`` serve them too).

    attnlab predict runs/mine "ROMEO:"                    # the next tokens of a GPT
    attnlab predict runs/bert "The [MASK] of the river"   # each [MASK] filled
    attnlab predict runs/language "¿dónde está?"          # classes with probabilities
    attnlab predict runs/dates "saturday 21 nov 2026" --beam 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from attnlab.cli import UsageError, Verb, options_from, register


def field_defaults(cls) -> dict:
    """Each field's default: the one definition the CLI and the Python methods share."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


def open_run(path: str, device: str = "auto"):
    """``attnlab.run.load_run`` on the device named (auto: a GPU if there is one)."""
    from attnlab.config import ConfigError
    from attnlab.run import load_run
    from attnlab.runtime import resolve_device

    try:
        dev = resolve_device(device)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return load_run(path, device=dev)


def _inputs(given: list[str]) -> list[str]:
    if given == ["-"]:
        lines = [ln.rstrip("\r\n") for ln in sys.stdin]
        if not lines:
            raise UsageError("no input on stdin")
        return lines
    return given


def print_predictions(run, preds: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"about": run.about, "predictions": preds}, ensure_ascii=False))
        return
    for pred in preds:
        for line in run.prediction_lines(pred):
            print(line)


def predict(args: argparse.Namespace) -> int:
    """``attnlab predict RUN INPUT...``: the run's answer for each input, in its task's words."""
    from attnlab.tasks.base import PredictOptions

    options = options_from(PredictOptions, top_k=args.top_k, beam=args.beam, alpha=args.alpha,
                           max_len=args.max_len)  # fmt: skip
    run = open_run(args.run, args.device)
    inputs = _inputs(args.input)
    print_predictions(run, run.predict(inputs, options), args.json)
    return 0


def add(sub) -> None:
    from attnlab.tasks.base import PredictOptions

    pd = field_defaults(PredictOptions)
    pos = int  # checked by PredictOptions / EvalOptions: one line naming the option
    p = sub.add_parser(
        "predict",
        help="what a run predicts for each input (any kind of run)",
        description="Print the run's prediction for each INPUT: a GPT's most probable next "
        "tokens; each [MASK] of a masked LM filled; a classifier's classes with probabilities "
        "(text, or an image file / test:N for a ViT); an encoder-decoder's output (greedy, or "
        "--beam N). An encoder with no head predicts nothing (use embed). '-' reads one input "
        "per line from stdin.",
    )
    p.add_argument("run", help="run directory (trained or imported)")
    p.add_argument("input", nargs="+", help="text(s), image(s) or test:N; '-' reads stdin")
    p.add_argument("--top-k", type=pos, default=pd["top_k"], help="alternatives to show")
    p.add_argument("--beam", type=pos, default=pd["beam"],
                   help="encoder-decoder: beam width (1 = greedy)")  # fmt: skip
    p.add_argument("--alpha", type=float, default=pd["alpha"],
                   help="encoder-decoder: length penalty exponent")  # fmt: skip
    p.add_argument("--max-len", type=pos, default=pd["max_len"],
                   help="encoder-decoder: longest output in tokens")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=predict)


VERB = register(Verb("predict", 20, add))
