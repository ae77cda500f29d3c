"""`attnlab ablate RUN TEXT`: knock out heads, an LSTM's context vector or any named activation;
the change in the loss and in the top predictions (``Run.ablate``)."""

from __future__ import annotations

from attnlab.cli import UsageError, Verb, output_file, register
from attnlab.cli.common import intervention_arguments, ints, load, position_option, show


def cmd_ablate(args) -> int:

    args._png = output_file(args.png, ".png", "--png")
    chosen = [x for x in (args.head, args.site, args.context or None) if x]
    if len(chosen) != 1:
        raise UsageError("say what to ablate: --head L.H[,L.H...], --site HOOK_NAME or --context")
    positions, neurons = ints(args.positions, "--positions"), ints(args.neurons, "--neurons")
    if neurons is not None and args.site is None:
        raise UsageError("--neurons picks units of one activation: give it with --site")
    result = load(args).ablate(args.text, args.head, site=args.site, context=args.context,
                               positions=positions, neurons=neurons, mode=args.mode,
                               reference=args.reference, top=args.top, position=args.position)  # fmt: skip
    return show(result, args)


def add(sub) -> None:
    p = sub.add_parser("ablate", help="knock out heads (or any activation): loss change",
                       description="Ablate heads, an LSTM's context vector, or any named "
                       "activation (--site), and print the change in the loss and in the top "
                       "predictions. The result says how many values the ablation changed.")  # fmt: skip
    intervention_arguments(p)
    p.add_argument("--head", metavar="L.H[,L.H...]",
                   help="heads: 1.2 (one stack); encoder.0.1, decoder.1.0, cross.1.3")  # fmt: skip
    p.add_argument("--site", metavar="HOOK", help="any hook name, e.g. blocks.0.mlp.hidden")
    p.add_argument("--context", action="store_true", help="an LSTM decoder's context vector")
    p.add_argument("--positions", metavar="P,...", help="ablate only these positions")
    p.add_argument("--neurons", metavar="N,...", help="with --site: only these units")
    p.add_argument("--mode", choices=("zero", "mean", "resample"), default="zero",
                   help="zero: zeros; mean: the mean over the positions of the clean "
                   "(unablated) run of --reference (or of the text), every mean recorded "
                   "before anything is ablated; resample: values from --reference (or the text "
                   "shuffled)")  # fmt: skip
    p.add_argument("--reference", metavar="TEXT",
                   help="mean/resample: the input to take values from")  # fmt: skip
    p.add_argument("--top", type=int, default=5, help="top predictions to show")
    position_option(p)
    p.set_defaults(func=cmd_ablate)


VERB = register(Verb("ablate", 160, add))
