"""`attnlab experiment NAME --out DIR`: a classic result on attention, rerun on models it trains
(``attnlab.experiments``). Prints the summary (published beside measured) on stdout, writes
DIR/report.html, DIR/figures.json and the runs under DIR/runs/."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import Verb, register

SEEDS_MAX = 10  # each seed trains every model of the experiment again


def seeds(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3] (argparse turns the error into exit 2)."""
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if not out or any(s < 0 for s in out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"expected distinct non-negative integers, got {text!r}")
    from attnlab.cli.limits import SEED_MAX

    if max(out) > SEED_MAX or len(out) > SEEDS_MAX:
        raise argparse.ArgumentTypeError(f"expected at most {SEEDS_MAX} seeds, each at most "
                                         f"{SEED_MAX}, got {text!r}")  # fmt: skip
    return out


def summary_width() -> int:
    """The one width rule's (``COLUMNS``, the terminal's, 80 into a pipe), at least 40."""
    from attnlab.render.terminal import terminal_width

    return max(40, terminal_width())


def run(args: argparse.Namespace) -> int:
    from attnlab.experiments import run_experiment

    report = run_experiment(args.name, args.out, quick=args.quick, seeds=args.seeds,
                            device=args.device)  # fmt: skip
    if args.json:
        # what it is, as every --json starts: an experiment trains its own models
        about = {"kind": "experiment", "model_type": report.name,
                 "description": f"{report.title} ({report.citation})"}  # fmt: skip
        print(json.dumps({"about": about, "report": f"{args.out}/report.html",
                          "figures": f"{args.out}/figures.json",
                          "claims": [c.to_dict() for c in report.claims]}, ensure_ascii=False))  # fmt: skip
        return 0
    print("\n".join(report.lines(summary_width())))
    print(f"report: {args.out}/report.html  figures: {args.out}/figures.json")
    return 0


def add(sub) -> None:
    from attnlab.experiments import registry

    known = registry()
    p = sub.add_parser(
        "experiment",
        help=VERB.help,
        description="Train the models an experiment needs (run directories under OUT/runs/), "
        "measure, and write OUT/report.html and OUT/figures.json: each published figure beside "
        "attnlab's, over several seeds, with the criterion that decides whether it reproduces. "
        + " ".join(f"{e.name}: {e.about}." for e in known.values()),
    )
    p.set_defaults(func=run)
    p.add_argument("name", choices=list(known), metavar="NAME", help=f"one of {', '.join(known)}")
    p.add_argument("--out", required=True, help="directory to write the report and runs into")
    p.add_argument("--quick", action="store_true",
                   help="smaller models and fewer steps: under a minute (what CI runs)")  # fmt: skip
    p.add_argument("--seeds", type=seeds, default="1,2,3",
                   help="seeds to train and measure with, comma separated")  # fmt: skip


VERB = register(
    Verb(
        "experiment",
        220,
        add,
        help="rerun a classic experiment on attention and compare with the paper",
    )
)
