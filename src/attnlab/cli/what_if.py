"""`attnlab what-if RUN TEXT`: one head's attention with one piece changed at a time.

It loads the run, records one forward pass and calls ``Run.what_if``
(``attnlab.inspect.what_if``).
"""

from __future__ import annotations

import sys

from attnlab.cli import Verb, int_at_least, register


def cmd_what_if(args) -> int:
    from attnlab.inspect.by_hand import indented
    from attnlab.render.display import console
    from attnlab.run import load_run

    run = load_run(args.run, args.device)
    result = run.what_if(args.text, layer=args.layer, head=args.head, map=args.map,
                         temperature=args.temperature, pad=args.pad, pad_text=args.pad_text)  # fmt: skip
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        out = console()
        if result.about.get("description"):
            out.print(indented(f"the model: {result.about['description']}.", 0, "italic"))
        out.print(result)
    return 0


def add(sub) -> None:
    from attnlab.inspect.what_if import DEFAULT_PAD, DEFAULT_TEMPERATURE

    nonneg = int_at_least(0)
    p = sub.add_parser(
        "what-if",
        help=VERB.help,
        description="Recompute one head's attention from its recorded Q, K and V as the model "
        "computes it, then with one piece changed at a time: no 1/sqrt(d_k) scale, no causal "
        "mask, a softmax temperature T and 1/T, and padding (the text batched with a longer "
        "one) without a padding mask. For each: the weights before and after, each row's "
        "entropy and largest weight, and how far the outputs move. What each piece is for.",
    )
    p.add_argument("run", help="run directory (written by `attnlab train` or `import-hf`)")
    p.add_argument("text", help="the text to run through the model")
    p.add_argument("--layer", type=nonneg, default=None, help="layer (default: 0)")
    p.add_argument("--head", type=nonneg, default=0, help="head")
    p.add_argument("--map", default=None, metavar="NAME",
                   help="pick attention maps by name or part of it (e.g. cross, decoder)")  # fmt: skip
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                   help="the what-if temperature T (and 1/T); not 1")  # fmt: skip
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pad", type=nonneg, default=DEFAULT_PAD,
                   help="pads the text is filled out with (0: no padding what-if)")  # fmt: skip
    g.add_argument("--pad-text", metavar="TEXT", default=None,
                   help="a longer text batched with TEXT: TEXT gets as many pads as it is "
                   "shorter")  # fmt: skip
    p.set_defaults(func=cmd_what_if)


VERB = register(
    Verb(
        "what-if",
        65,
        add,
        help="one head's attention with the scale, the causal mask, a temperature or padding changed",
    )
)
