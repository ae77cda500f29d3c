"""`attnlab paths RUN --clean A --corrupt B --target T --sender S --receiver R ...`: path
patching, a sender's effect along chosen paths only (``Run.path_patch``)."""

from __future__ import annotations

from attnlab.cli import Verb, register
from attnlab.cli.common import load, position_option, print_dict


def render(d: dict) -> list[str]:
    """The path's effect in lines of at most 80 columns."""
    lines = [f"sender {d['sender']} -> {', '.join(d['receivers'])}"[:80],
             f"metric ({d['metric']})   clean {d['clean'][0]:+.4f}   corrupt "
             f"{d['corrupt'][0]:+.4f}   path patched {d['patched'][0]:+.4f}",
             f"share of the clean -> corrupt change the path carries: {d['share']:.3f}",
             "(the sender takes its corrupt output; only the receivers read it, every other "
             "reader",
             "keeps its clean input)"]  # fmt: skip
    return [line.rstrip() for line in lines]


def cmd_paths(args) -> int:
    run = load(args)
    d = run.path_patch(args.clean, args.corrupt, args.target, args.sender, args.receiver,
                       foil=args.foil, position=args.position)  # fmt: skip
    print_dict(run, d, args.json, lambda: render(d))
    return 0


def add(sub) -> None:
    p = sub.add_parser("paths", help=VERB.help,
                       description="In the clean run, give SENDER its corrupt output along "
                       "the paths into the RECEIVERs only (every other reader keeps its clean "
                       "input) and read the metric: share = (M(path) - M(clean)) / "
                       "(M(corrupt) - M(clean)). Names: writers embed, blocks.L.attn.headH, "
                       "blocks.L.mlp; readers blocks.L.attn.headH.q/.k/.v, blocks.L.mlp_in, "
                       "readout.")  # fmt: skip
    p.add_argument("run", help="run directory (trained or imported)")
    p.add_argument("--clean", required=True, metavar="TEXT", help="the input that gives TARGET")
    p.add_argument("--corrupt", required=True, metavar="TEXT", help="the same length, changed")
    p.add_argument("--target", required=True, metavar="TOKEN", help="the token the metric reads")
    p.add_argument("--foil", metavar="TOKEN", help="metric = logit diff to FOIL (else logprob)")
    p.add_argument("--sender", required=True, help="a writer, e.g. blocks.0.attn.head1")
    p.add_argument("--receiver", required=True, action="append",
                   help="a reader, e.g. blocks.1.attn.head0.k (repeat for several)")  # fmt: skip
    position_option(p)
    p.add_argument("--json", action="store_true", help="print Run.path_patch's dict as JSON")
    p.set_defaults(func=cmd_paths)


VERB = register(Verb("paths", 177, add, help="path patching along chosen paths"))
