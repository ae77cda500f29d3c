"""`attnlab patch RUN --clean A --corrupt B --target T`: activation patching, with attribution
patching beside it (``Run.patch``)."""

from __future__ import annotations

from attnlab.cli import Verb, output_file, register
from attnlab.cli.common import intervention_arguments, ints, load, position_option, show


def cmd_patch(args) -> int:
    args._png = output_file(args.png, ".png", "--png")
    result = load(args).patch(args.clean, args.corrupt, args.target, foil=args.foil, by=args.by,
                              position=args.position, reverse=args.reverse,
                              positions=ints(args.positions, "--positions"))  # fmt: skip
    return show(result, args)


def add(sub) -> None:
    p = sub.add_parser("patch", help="activation patching from a clean into a corrupt input",
                       description="Copy one activation at a time from the clean run into the "
                       "corrupt one; recovered = (patched - corrupt) / (clean - corrupt) of the "
                       "logit of TARGET (minus FOIL's). Attribution patching (the gradient "
                       "approximation) is reported beside it, with its error.")  # fmt: skip
    intervention_arguments(p, text=False)
    p.add_argument("--clean", required=True, metavar="TEXT", help="the input that gives TARGET")
    p.add_argument("--corrupt", required=True, metavar="TEXT",
                   help="the input the clean activations are patched into")  # fmt: skip
    p.add_argument("--target", required=True, metavar="TOKEN", help="the token whose logit")
    p.add_argument("--foil", metavar="TOKEN", help="metric = logit(TARGET) - logit(FOIL)")
    p.add_argument("--by", choices=("position", "head"), default="position",
                   help="layer x position (the residual stream) or layer x head")  # fmt: skip
    p.add_argument("--reverse", action="store_true",
                   help="patch the corrupt run's activations into the clean run (noising)")  # fmt: skip
    p.add_argument("--positions", metavar="P,...",
                   help="--by position: patch only these positions (exact patching runs one "
                   "forward pass per layer x position)")  # fmt: skip
    position_option(p)
    p.set_defaults(func=cmd_patch)


VERB = register(Verb("patch", 170, add))
