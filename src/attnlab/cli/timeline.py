"""Verbs about heads and how they form: ``timeline``; the scores of ``heads`` (the verb is
registered with ``heads --importance`` in cli/intervene.py); ``eval`` of an induction run.

Each parses its arguments and calls one library function: ``attnlab.inspect.timeline``,
``attnlab.inspect.heads``, ``attnlab.tasks.induction``.
"""

from __future__ import annotations

import json
import sys

from attnlab.cli import output_file


def _show(result, as_json: bool) -> None:
    from attnlab.render.display import console

    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        console().print(result)


def cmd_timeline(args) -> int:
    from attnlab.inspect.timeline import timeline

    png = output_file(args.png, ".png", "--png")
    from attnlab.run import about_run

    tl = timeline(args.run, args.probe)
    tl.about = about_run(args.run)
    if png is not None:  # written before anything is printed
        tl.save_png(png)
    _show(tl, args.json)
    if png is not None:
        print(f"wrote timeline {png} ({png.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)
    return 0


def cmd_head_scores(args) -> int:
    """``attnlab heads RUN`` without --importance: every head's scores and kind."""
    from attnlab.checkpoint import read_run_config
    from attnlab.cli.limits import check_forward_memory, config_field
    from attnlab.inspect.heads import heads_of_run
    from attnlab.run import load_run
    from attnlab.runtime import resolve_device

    c = read_run_config(args.run).get("config") or {}  # sized before the model is loaded
    check_forward_memory(c, resolve_device(args.device), args.sequences,
                         config_field(c, "block_size", "max_len") or 1, "--sequences", record=True)  # fmt: skip
    run = load_run(args.run, args.device)
    report = heads_of_run(run, n=args.sequences, seed=args.seed)
    if args.json:  # what the model is, then the list of heads; everything else with --all
        out = report.to_dict() if args.all else {"heads": report.rows}
        sys.stdout.write(json.dumps({"about": run.about, **out}, indent=2) + "\n")
    else:
        _show(report, False)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "timeline",
        help="the loss curve beside every head's scores over training (from its snapshots)",
        description="Read a run's snapshots (train --snapshot-every N; --task induction takes "
        "them by default): each head's previous-token, duplicate-token, induction, first-token "
        "and self scores and entropy at every snapshot, the loss curve, the in-context loss, "
        "and the step where each rose (or fell) fastest.",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--probe", choices=("repeat", "sample"), default="repeat",
                   help="scores on random tokens repeated once (default) or on the held-out "
                   "sample of the run's data")  # fmt: skip
    p.add_argument("--png", metavar="FILE", help="draw the timeline into a PNG")
    p.add_argument("--json", action="store_true", help="print the data as JSON")
    p.set_defaults(func=cmd_timeline)
