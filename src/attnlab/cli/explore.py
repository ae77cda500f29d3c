"""`attnlab explore RUN TEXT`: a self-contained HTML explorer of TEXT's attention (with
``--interventions``, their tabs too), ``Run.explore``; or with ``--steps`` the run's snapshots
on a step slider (``attnlab.inspect.step_explorer``: it reads the snapshots and loads no
weights); the page's path on stdout."""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab.cli import UsageError, Verb, int_at_least, output_file, register
from attnlab.cli.common import load, wrote


def cmd_explore(args) -> int:
    # the page: --html FILE, else explorer.html in the run directory
    from attnlab.rundir import EXPLORER_FILE

    out = output_file(args.html, ".html", "--html") or Path(args.run) / EXPLORER_FILE
    if args.steps:  # the run's snapshots on a step slider: no text, no forward pass
        from attnlab.inspect.step_explorer import explore_steps

        if args.text is not None or args.interventions:
            what = "TEXT" if args.text is not None else "--interventions"
            raise UsageError(
                f"--steps shows the run's snapshots on their own probes: give no {what}"
            )
        explore_steps(args.run).save(out)
        wrote(out, "step explorer")
        print(out)
        return 0
    if args.text is None:
        raise UsageError("explore needs TEXT (or --steps for the run's snapshots over training)")
    page = load(args).explore(args.text, max_tokens=args.max_tokens, start=args.start,
                              interventions=args.interventions)  # fmt: skip
    page.save(out)
    if page.data["note"]:
        print(f"attnlab: note: {page.data['note']}", file=sys.stderr)
    wrote(out, "explorer page")
    print(out)
    return 0


def add(sub) -> None:
    pos, nonneg = int_at_least(1), int_at_least(0)

    p = sub.add_parser(
        "explore",
        help=VERB.help,
        description="An offline page to explore TEXT's attention; or, with --steps, one "
        "head's attention at every snapshot of a run (train --snapshot-every) on a step slider.",
    )
    p.add_argument("run", help="run directory (written by `attnlab train` or `import-hf`)")
    p.add_argument("text", nargs="?", help="the text to run through the model")
    p.add_argument("--steps", action="store_true",
                   help="the run's snapshots on a step slider instead of TEXT")  # fmt: skip
    p.add_argument("--html", metavar="FILE",
                   help="the page to write (default: RUN/explorer.html); its path is printed")  # fmt: skip
    p.add_argument(
        "--max-tokens",
        type=pos,
        default=128,
        help="tokens per sequence kept in the page (default 128; keeps it small)",
    )
    p.add_argument("--start", type=nonneg, default=0, help="first token of the window kept")
    p.add_argument("--interventions", action="store_true",
                   help="add tabs: logit lens, rollout, flow, DLA, integrated gradients, head "
                   "importance")  # fmt: skip
    p.set_defaults(func=cmd_explore)


VERB = register(
    Verb("explore", 90, add, json=False, help="write a self-contained HTML explorer (no network)")
)
