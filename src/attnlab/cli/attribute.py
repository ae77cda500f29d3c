"""`attnlab attribute RUN TEXT --method M`: dla, rollout, flow, ig or grad (``Run.attribute``)."""

from __future__ import annotations

from attnlab.cli import UsageError, Verb, output_file, register
from attnlab.cli.common import intervention_arguments, load, position_option, show
from attnlab.cli.limits import GAUSS_LEGENDRE_MAX


def cmd_attribute(args) -> int:
    args._png = output_file(args.png, ".png", "--png")
    if args.method in ("dla", "ig", "grad") and args.target is None:
        raise UsageError(f"--method {args.method} attributes a token's logit: give --target TOKEN")
    if args.method == "ig" and args.rule == "gauss-legendre" and args.steps > GAUSS_LEGENDRE_MAX:
        raise UsageError(f"--steps must be at most {GAUSS_LEGENDRE_MAX} with --rule "
                         "gauss-legendre (its nodes cost steps^3 to find, and 256 already "
                         f"integrate exactly to degree 511), got {args.steps}; --rule riemann "
                         "takes more")  # fmt: skip
    if args.method in ("rollout", "flow") and (args.target or args.foil):
        raise UsageError(f"--method {args.method} follows attention only: it takes no --target "
                         "(pick the output with --position)")  # fmt: skip
    result = load(args).attribute(args.text, args.method, args.target, foil=args.foil,
                                  position=args.position, steps=args.steps, rule=args.rule,
                                  stack=args.stack, residual=args.residual)  # fmt: skip
    return show(result, args)


def add(sub) -> None:
    p = sub.add_parser("attribute", help="attribute an output: dla, rollout, flow, ig, grad",
                       description="dla: split TARGET's logit into embeddings, heads, MLPs and "
                       "biases (LayerNorm scales frozen). rollout/flow: attention paths with the "
                       "residual term (Abnar & Zuidema 2020). ig/grad: integrated gradients or "
                       "input x gradient on the input embeddings, with IG's completeness "
                       "error.")  # fmt: skip
    intervention_arguments(p)
    p.add_argument("--method", required=True, choices=("dla", "rollout", "flow", "ig", "grad"),
                   help="how (above)")  # fmt: skip
    p.add_argument("--target", metavar="TOKEN", help="dla, ig, grad: the token whose logit")
    p.add_argument("--foil", metavar="TOKEN", help="attribute logit(TARGET) - logit(FOIL)")
    p.add_argument("--steps", type=int, default=64, help="ig: integration steps")
    p.add_argument("--rule", choices=("gauss-legendre", "riemann"), default="gauss-legendre",
                   help="ig: quadrature rule")  # fmt: skip
    p.add_argument("--stack", choices=("encoder", "decoder"), default=None,
                   help="rollout/flow of an encoder-decoder: which self-attention (default decoder)")  # fmt: skip
    p.add_argument("--residual", type=float, default=0.5,
                   help="rollout/flow: weight of the identity in A' = (1 - r) A + r I")  # fmt: skip
    position_option(p)
    p.set_defaults(func=cmd_attribute)


VERB = register(Verb("attribute", 190, add))
