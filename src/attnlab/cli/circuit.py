"""`attnlab circuit RUN --pairs FILE`: which edges of the residual graph carry a behaviour
(EAP, EAP-IG or exact edge patching), the top-k circuit's faithfulness beside random sets,
with bootstrap confidence intervals (``Run.circuit``)."""

from __future__ import annotations

import sys

from attnlab.cli import Verb, output_file, register
from attnlab.cli.common import intervention_arguments, load, position_option, show

DEFINITIONS = (
    "Scores are denoising by default: EAP = (term_clean - term_corrupt) . dM/d(reader input) "
    "at the corrupt run; EAP-IG averages that gradient over STEPS points on the line from the "
    "corrupt to the clean input embeddings (1 step = EAP); exact = M(corrupt with the edge "
    "patched to clean) - M(corrupt). With --direction noising the base run is the clean one: "
    "the gradient at the clean run, EAP-IG's points from the clean input toward the corrupt "
    "one, exact = M(clean) - M(clean with the edge patched to corrupt). A reader's input is "
    "taken before its norm, which is recomputed from "
    "the patched sum; a K/V head shared by grouped-query attention is one key and one value "
    "reader for its group. Faithfulness = (M(circuit) - M(none)) / (M(clean) - M(none)), "
    "every edge outside the circuit carrying its corrupt term (or with --ablation mean, its "
    "mean over the corrupt inputs)."
)


def cmd_circuit(args) -> int:
    args._png = output_file(args.png, ".png", "--png")
    curve = output_file(args.curve_png, ".png", "--curve-png")
    page = output_file(args.html, ".html", "--html")
    result = load(args).circuit(
        pairs=args.pairs, clean=args.clean, corrupt=args.corrupt, target=args.target,
        foil=args.foil, induction=args.induction, half=args.half, metric=args.metric,
        method=args.method, steps=args.steps, ablation=args.ablation, k=args.k,
        fraction=args.fraction, reach=args.reach, random_sets=args.random_sets,
        resamples=args.resamples, seed=args.seed, acdc=args.acdc, positions=args.positions,
        position=args.position, direction=args.direction,
    )  # fmt: skip
    if curve is not None:
        result.save_curve_png(curve)
    if page is not None:
        result.save_html(page)
    code = show(result, args)
    for path, what in ((curve, "the faithfulness curve"), (page, "the circuit page")):
        if path is not None:
            print(f"wrote {what} {path} ({path.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)
    return code


def add(sub) -> None:
    p = sub.add_parser("circuit", help=VERB.help,
                       description="Score every edge (writer -> a head's q/k/v input, a "
                       "feed-forward's input, the logits) on clean/corrupt pairs, take the "
                       "top k as a circuit and measure how much of the clean - corrupt gap it "
                       "recovers, beside at least 20 random sets of each size. "
                       + DEFINITIONS)  # fmt: skip
    intervention_arguments(p, text=False)
    g = p.add_argument_group("the pairs (one of)")
    g.add_argument("--pairs", metavar="FILE",
                   help="TSV: clean<TAB>corrupt<TAB>target[<TAB>foil], one pair a line")  # fmt: skip
    g.add_argument("--clean", metavar="TEXT", help="one pair: the input that gives TARGET")
    g.add_argument("--corrupt", metavar="TEXT", help="one pair: the same length, changed")
    g.add_argument("--induction", type=int, metavar="N",
                   help="N random pairs r r vs r' r (a GPT with a character vocabulary)")  # fmt: skip
    p.add_argument("--target", metavar="TOKEN", help="with --clean: the token the metric reads")
    p.add_argument("--foil", metavar="TOKEN", help="with --clean: metric = logit diff to FOIL")
    p.add_argument("--half", type=int, default=12, help="--induction: tokens in r (12)")
    p.add_argument("--metric", choices=("logit-diff", "logprob"),
                   help="default: logit-diff where every pair has a foil, else logprob")  # fmt: skip
    p.add_argument("--method", choices=("eap", "eap-ig", "exact"), default="eap-ig",
                   help="edge scores (default eap-ig)")  # fmt: skip
    p.add_argument("--steps", type=int, default=5, help="EAP-IG's points (5)")
    p.add_argument("--direction", choices=("denoising", "noising"), default="denoising",
                   help="patch each edge in the corrupt run (denoising, the default) or in the "
                   "clean run (noising: what the circuit's faithfulness ablates)")  # fmt: skip
    p.add_argument("--ablation", choices=("corrupt", "mean"), default="corrupt",
                   help="what an edge outside the circuit carries (default corrupt)")  # fmt: skip
    p.add_argument("--k", type=int, help="the circuit's size in edges (default: the smallest "
                   "size on the curve that reaches --reach)")  # fmt: skip
    p.add_argument("--fraction", type=float, help="the circuit's size as a share of the edges")
    p.add_argument("--reach", type=float, default=0.9, help="faithfulness to reach (0.9)")
    p.add_argument("--random-sets", type=int, default=20, help="random sets per size (>= 20)")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (1000)")
    p.add_argument("--seed", type=int, default=0, help="random sets, resamples, --induction")
    p.add_argument("--acdc", type=float, metavar="TAU",
                   help="also prune greedily (ACDC), one forward pass per edge: small models")  # fmt: skip
    p.add_argument("--positions", action="store_true",
                   help="a unit is an edge at one position (pairs of one length)")  # fmt: skip
    p.add_argument("--curve-png", metavar="FILE", help="draw the faithfulness curve")
    p.add_argument("--html", metavar="FILE", help="an offline page: the graph with a k slider")
    position_option(p)
    p.set_defaults(func=cmd_circuit)


VERB = register(
    Verb("circuit", 175, add, help="edge attribution and circuits on clean/corrupt pairs")
)
