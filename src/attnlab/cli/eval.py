"""`attnlab eval RUN [--data FILE]`: the task's figures on the run's held-out split or a file,
for every kind of run (``Run.eval``: ``Run.evaluate``'s figures); ``--ablate L.H``: intact and
with those heads ablated (``Run.eval`` with ``ablate``).

    attnlab eval runs/language --png confusion.png        # accuracy, P/R/F1, confusion matrix
"""

from __future__ import annotations

import argparse
import json
import sys

from attnlab.cli import UsageError, Verb, options_from, output_file, register
from attnlab.cli.predict import field_defaults, open_run


def eval_(args: argparse.Namespace) -> int:
    """``attnlab eval RUN [--data FILE]``: the task's figures (``--png``: a classifier's
    confusion matrix; ``--ablate L.H``: intact and with those heads ablated)."""
    from attnlab.tasks.base import EvalOptions

    options = options_from(EvalOptions, data=args.data, encoding=args.encoding, split=args.split,
                           batch_size=args.batch_size, max_tokens=args.max_tokens,
                           beam=args.beam, alpha=args.alpha, limit=args.limit)  # fmt: skip
    if args.ablate:
        return _eval_ablated(args, options)
    png = output_file(args.png, ".png", "--png")
    run = open_run(args.run, args.device)
    _check_batch(run, options.batch_size)
    if png is not None and run.task.name not in ("classify", "vision"):
        raise UsageError(f"--png draws a classifier's confusion matrix; {args.run} is a "
                         f"{run.kind} run")  # fmt: skip
    from attnlab.heartbeat import Heartbeat

    with Heartbeat(f"scoring {args.data or args.run}"):  # a big file: a line every 2 s
        ev = run.eval(options=options)
    if png is not None:
        ev.save_png(png)
    if args.json:
        print(json.dumps({"about": run.about, **ev.to_dict()}, ensure_ascii=False))
    else:
        from attnlab.render.display import console

        console().print(ev)
    if png is not None:
        print(f"wrote confusion matrix {png}", file=sys.stderr)
    return 0


def _check_batch(run, batch_size: int) -> None:
    """--batch-size past what one forward pass of this model can hold: refused before scoring."""
    from attnlab.cli.limits import check_forward_memory, config_field

    c = run.model.config
    tokens = config_field(c, "block_size", "max_len") or 1
    device = next(run.model.parameters()).device
    check_forward_memory(c, device, batch_size, tokens, "--batch-size")


def _eval_ablated(args: argparse.Namespace, options) -> int:
    """``eval RUN --ablate L.H[,...] [--mode M]``: ``eval``'s own figures (the same data, split,
    batches and limits), intact and with those heads ablated (``Run.eval`` with ``ablate``), in
    ``eval``'s words."""
    from attnlab.render.display import console

    if args.png is not None:
        raise UsageError("--png draws eval's confusion matrix; it does not apply to --ablate")
    run = open_run(args.run, args.device)
    _check_batch(run, options.batch_size)
    result = run.eval(options=options, ablate=args.ablate, mode=args.mode, quiet=False)
    if args.json:
        print(result.to_json())
    else:
        console().print(result)
    return 0


def add(sub) -> None:
    from attnlab.tasks.base import EvalOptions

    ed = field_defaults(EvalOptions)
    pos = int  # checked by EvalOptions: one line naming the option
    e = sub.add_parser(
        "eval",
        help=VERB.help,
        description="Print the run's figures in its task's words. A GPT: loss, perplexity and "
        "bits per character. A masked LM: masked-token accuracy and loss. A classifier (text "
        "or image): accuracy, per-class precision, recall and F1, and the confusion matrix "
        "(--png draws it). An encoder-decoder: exact match, token accuracy, BLEU and chrF. "
        "Without --data the run's held-out split is scored (a ViT's and an encoder-decoder's "
        "test split); --data scores a file in the task's format: text; label<TAB>text; "
        "source<TAB>target; a DIR/<label>/*.png folder.",
    )
    e.add_argument("run", help="run directory (trained or imported)")
    e.add_argument(
        "--data",
        default=ed["data"],
        help="a file (or image folder) to score (default: the run's held-out split)",
    )
    e.add_argument("--encoding", default=ed["encoding"], help="of --data")
    e.add_argument("--split", choices=["test", "val", "train"], default=ed["split"],
                   help="which split of the run (default: its held-out one)")  # fmt: skip
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--png", metavar="FILE", help="a classifier: draw the confusion matrix")
    e.add_argument("--batch-size", type=pos, default=ed["batch_size"],
                   help="examples scored per forward pass")  # fmt: skip
    e.add_argument("--max-tokens", type=pos, default=ed["max_tokens"],
                   help="a GPT: score at most this many tokens")  # fmt: skip
    e.add_argument("--beam", type=pos, default=ed["beam"],
                   help="encoder-decoder: beam width (1 = greedy)")  # fmt: skip
    e.add_argument("--alpha", type=float, default=ed["alpha"],
                   help="encoder-decoder: length penalty exponent")  # fmt: skip
    e.add_argument("--limit", type=int, default=ed["limit"],
                   help="score only the first N examples (a GPT: N windows of its block, "
                   "spread over the text; 0 = all)")  # fmt: skip
    e.add_argument("--ablate", metavar="L.H[,L.H...]",
                   help="the figures intact and with these heads ablated (1.2; decoder.0.1, "
                   "cross.1.0, encoder.0.3 in an encoder-decoder; context for an LSTM): eval's "
                   "own figures, on the data, split and limits eval scores")  # fmt: skip
    e.add_argument("--mode", choices=("zero", "mean", "resample"), default="zero",
                   help="--ablate: how")  # fmt: skip
    e.set_defaults(func=eval_)


VERB = register(
    Verb("eval", 30, add, help="score a run on its held-out split or a file (any kind of run)")
)
