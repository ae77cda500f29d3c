"""`attnlab timeline RUN`: the loss curve beside every head's scores over training, read from
the run's snapshots (``attnlab.inspect.timeline``); it runs no model."""

from __future__ import annotations

import sys

from attnlab.cli import Verb, output_file, register


def cmd_timeline(args) -> int:
    from attnlab.inspect.timeline import timeline
    from attnlab.render.display import console

    png = output_file(args.png, ".png", "--png")
    from attnlab.run import about_run

    tl = timeline(args.run, args.probe)
    tl.about = about_run(args.run)
    if png is not None:  # written before anything is printed
        tl.save_png(png)
    if args.json:
        sys.stdout.write(tl.to_json() + "\n")
    else:
        console().print(tl)
    if png is not None:
        print(f"wrote timeline {png} ({png.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)
    return 0


def add(sub) -> None:
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


VERB = register(Verb("timeline", 210, add, runs="files"))
