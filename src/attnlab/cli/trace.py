"""`attnlab trace RUN TEXT`: one forward pass explained step by step (``Run.trace``)."""

from __future__ import annotations

from attnlab.cli import Verb, int_at_least, register
from attnlab.cli.common import first_key, load, print_result, run_and_text


def cmd_trace(args) -> int:
    result = load(args).trace(args.text, layer=args.layer, head=args.head, top_k=args.top)
    result.start = first_key(args.start, result.widest)
    print_result(result, args.json)
    return 0


def add(sub) -> None:
    pos, nonneg = int_at_least(1), int_at_least(0)

    p = sub.add_parser(
        "trace",
        help=VERB.help,
        description="Explain one forward pass: tokens, embeddings, Q/K/V of one head, "
        "scores, mask, softmax, heads, residual, FFN, and what the model predicts: a GPT's next "
        "token, a masked LM's [MASK] fillers, a classifier's class, each decoder step of an "
        "encoder-decoder (with its cross-attention), an LSTM's alignment.",
    )
    run_and_text(p)
    p.add_argument("--layer", type=nonneg, default=0, help="layer to open up")
    p.add_argument("--head", type=nonneg, default=0, help="head to open up")
    p.add_argument("--top", type=pos, default=5,
                   help="predictions to show: next tokens, [MASK] fillers, classes")  # fmt: skip
    p.add_argument("--start", type=nonneg, default=0,
                   help="first key shown in the token x token tables (they page to the "
                   "terminal's width from there)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the same data as JSON")
    p.set_defaults(func=cmd_trace)


VERB = register(Verb("trace", 50, add, help="explain one forward pass step by step"))
