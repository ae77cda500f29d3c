"""``attnlab serve [RUN or DIR ...]``: the live workbench (``attnlab.serve``), a local web
application; it prints its address (with the token every request must carry) and serves until
Ctrl-C."""

from __future__ import annotations

import sys

from attnlab.cli import UsageError, Verb, register


def cmd_serve(args) -> int:
    from attnlab import serve
    from attnlab.runtime import resolve_device
    from attnlab.serve.app import Settings

    if not args.runs:
        raise UsageError("name a run directory (or a directory of runs) to serve")
    warning = serve.warn_host(args.host)
    if warning:
        print(f"attnlab: warning: {warning}", file=sys.stderr)
    settings = Settings(args.runs, host=args.host, port=args.port,
                        memory=int(args.memory_gb * 1024**3), device=str(resolve_device(args.device)),
                        max_text=args.max_text)  # fmt: skip
    try:
        serve.serve(settings, announce=lambda url: print(
            f"attnlab workbench: {url}\n(Ctrl-C stops it; the token in the address is its key)",
            flush=True))  # fmt: skip
    except serve.ServeError as e:
        raise UsageError(str(e)) from None
    return 0


def add(sub) -> None:
    from attnlab.serve.runs import default_budget

    p = sub.add_parser(
        "serve",
        help=VERB.help,
        description="Start a local web application on the runs given (run directories, or "
        "directories of runs): type a text and see the prediction, every head, the Q·K neuron "
        "view, similarity, influence and the walkthrough of one forward pass update; click a "
        "head to ablate it; patch, lens, DLA; watch a run that is training. It prints its "
        "address, with a random token every request must carry, and listens on 127.0.0.1 "
        "unless --host says otherwise.",
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="run directories or directories of runs")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (another than 127.0.0.1 opens it to other machines: "
                   "a warning says so)")  # fmt: skip
    p.add_argument("--port", type=int, default=8765, help="port to listen on (0: a free one)")
    p.add_argument("--memory-gb", type=float, default=round(default_budget() / 1024**3, 1),
                   help="the loaded runs' weights stay within this; the least recently used "
                   "run is let go past it")  # fmt: skip
    p.add_argument("--max-text", type=int, default=2000,
                   help="characters of one input the page may send")  # fmt: skip
    p.set_defaults(func=cmd_serve)


VERB = register(
    Verb(
        "serve",
        230,
        add,
        help="the live workbench: a local web page to explore, poke and watch runs",
        json=False,
    )
)
