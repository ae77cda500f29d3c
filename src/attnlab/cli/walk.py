"""`attnlab walk`: attention by hand, on your own X, W_Q, W_K, W_V or random ones.

It reads the matrices (files, stdin or rows typed inline) and calls ``Run.walk`` with them and
the switches (on the class: no run is loaded, no model runs).
"""

from __future__ import annotations

import sys

from attnlab.cli import Verb, register

MATRIX_HELP = ("a file (JSON rows, CSV or whitespace-separated rows), '-' for stdin, or the "
               "rows typed inline, ';' between them")  # fmt: skip


def _read(value: str | None, name: str):
    from attnlab.inspect.by_hand import parse_matrix, read_matrix

    if value is None:
        return None, None
    if value == "-":
        return parse_matrix(sys.stdin.read(), name)
    return read_matrix(value, name)


def cmd_walk(args) -> int:
    from attnlab.inspect.by_hand import read_bundle
    from attnlab.render.display import console
    from attnlab.run import Run

    if args.matrices is not None:  # X and the weights from the file: Run.walk refuses a clash
        x, w_q, w_k, w_v, x_labels = args.x, args.wq, args.wk, args.wv, None
        bundle = read_bundle(args.matrices)
    else:
        x, x_labels = _read(args.x, "X")
        w_q, w_k, w_v = (_read(v, name)[0] for v, name in ((args.wq, "W_Q"), (args.wk, "W_K"),
                                                           (args.wv, "W_V")))  # fmt: skip
        bundle = None
    result = Run.walk(args.tokens if args.tokens is not None else x_labels, x, w_q, w_k, w_v,
                      matrices=bundle, n=args.n, m=args.m, d_k=args.d_k, d_v=args.d_v,
                      seed=args.seed, init=args.init, scale=args.scale, causal=args.causal,
                      temperature=args.temperature, pad=args.pad,
                      padding_mask=args.padding_mask, what_if=args.what_if)  # fmt: skip
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        console().print(result)
    return 0


def add(sub) -> None:
    from attnlab.inspect.by_hand import DEFAULT_D_K, DEFAULT_M

    p = sub.add_parser(
        "walk",
        help=VERB.help,
        description="Walk hand-sized matrices through attention with their real numbers, as "
        "trace walks a model: X, Q = X W_Q, K = X W_K, V = X W_V, Q K^T, the scale, the mask, "
        "the softmax and the weighted sum, each with its shape. Give X (N x M), W_Q and W_K "
        "(M x d_k) and W_V (M x d_v; d_v may differ), or leave any out to draw it at random "
        "(X from N(0, 1), the weights as an untrained nn.Linear, or --init rand). Example, the "
        "notes' 6 x 16 embedding with d_q = d_k = 24, d_v = 28: attnlab walk --tokens \"Life "
        'is short, eat dessert first" --m 16 --d-k 24 --d-v 28 --seed 123',
    )
    g = p.add_argument_group("the matrices")
    g.add_argument("--tokens", metavar="TEXT",
                   help="the tokens (X's rows), split at spaces: 'I like to eat apples' is 5")  # fmt: skip
    g.add_argument("--x", metavar="MATRIX", help=f"X, N x M: {MATRIX_HELP}; a row may start "
                   "with its token")  # fmt: skip
    g.add_argument("--wq", metavar="MATRIX", help="W_Q, M x d_k (same form)")
    g.add_argument("--wk", metavar="MATRIX", help="W_K, M x d_k (same form)")
    g.add_argument("--wv", metavar="MATRIX", help="W_V, M x d_v (same form)")
    g.add_argument("--matrices", metavar="FILE",
                   help="a JSON file with X, W_Q, W_K, W_V (and tokens): what --json prints "
                   "under \"inputs\"")  # fmt: skip
    g.add_argument("--n", type=int, default=None, help="tokens, for a random X without --tokens")
    g.add_argument("--m", type=int, default=None,
                   help=f"M, X's columns, for a random X (default {DEFAULT_M})")  # fmt: skip
    g.add_argument("--d-k", type=int, default=None,
                   help=f"d_q = d_k, for random W_Q, W_K (default {DEFAULT_D_K})")  # fmt: skip
    g.add_argument("--d-v", type=int, default=None, help="d_v, for a random W_V (default d_k)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random matrices")
    g.add_argument("--init", choices=("linear", "rand"), default="linear",
                   help="random weights as an untrained nn.Linear (uniform in +-1/sqrt(M)), or "
                   "torch.rand's [0, 1) (all positive: large scores)")  # fmt: skip
    s = p.add_argument_group("the switches")
    s.add_argument("--no-scale", dest="scale", action="store_false",
                   help="leave out the 1/sqrt(d_k) scale")  # fmt: skip
    s.add_argument("--no-causal", dest="causal", action="store_false",
                   help="no causal mask: every token reads every token")  # fmt: skip
    s.add_argument("--temperature", type=float, default=None,
                   help="divide the scores by T before the softmax (default 1; with --what-if "
                   "the what-if's T and 1/T, default 2)")  # fmt: skip
    s.add_argument("--pad", type=int, default=None,
                   help="batch the text with one P tokens longer: P pad positions (zero rows of "
                   "X; before the text under the causal mask, after it without) (default 0; "
                   "with --what-if 2)")  # fmt: skip
    s.add_argument("--no-padding-mask", dest="padding_mask", action="store_false",
                   help="with --pad: let the tokens read the pads")  # fmt: skip
    s.add_argument("--what-if", action="store_true",
                   help="instead of the walk: the weights as set beside each change (no scale, "
                   "no causal mask, temperature T and 1/T, pads without a padding mask), with "
                   "each row's entropy and largest weight before and after")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the steps (or what-ifs) as JSON")
    p.set_defaults(func=cmd_walk)


VERB = register(
    Verb(
        "walk",
        55,
        add,
        help="attention by hand: your own X, W_Q, W_K, W_V (or random ones), step by step",
        runs="nothing",
    )
)
