"""`attnlab weights RUN [--head H]`: circuits read from the weights alone, no input: the Q-, K-
and V-composition scores between heads and a head's QK and OV circuits (``Run.weights``)."""

from __future__ import annotations

from attnlab.cli import Verb, register
from attnlab.cli.common import load, print_dict


def _tok(t: str) -> str:
    r = repr(t)[1:-1]
    return r if r.strip() else repr(t)


def _tokens(side: str, toks: list[str], width: int) -> str:
    line = f"{side} " + " ".join(_tok(t) for t in toks)
    return line if len(line) <= width else line[: width - 3] + "..."


def render(d: dict, rows: int) -> list[str]:
    """Lines of at most 80 columns: the ``rows`` head pairs with the largest composition
    score (any of q, k, v), the baselines, and the head's singular values and directions."""
    c = d["composition"]
    pairs = sorted(c["pairs"], key=lambda p: -max(p["q"], p["k"], p["v"]))
    lines = [
        f"composition of an earlier head's OV into a later head ({len(pairs)} pairs; "
        f"the {min(rows, len(pairs))} largest)",  # fmt: skip
        f"{'from':>10} {'to':>10} {'Q':>8} {'K':>8} {'V':>8}",
    ]
    lines += [f"{p['from'][:10]:>10} {p['to'][:10]:>10} {p['q']:>8.3f} {p['k']:>8.3f} "
              f"{p['v']:>8.3f}" for p in pairs[:rows]]  # fmt: skip
    if c["baseline"]:
        b = c["baseline"]
        lines.append(f"{'random baseline':>21} {b['q']:>8.3f} {b['k']:>8.3f} {b['v']:>8.3f}")
    h = d.get("head")
    if h is not None:
        lines.append(f"head {h['head']}: QK (query x key) and OV (source -> logits) circuits")
        for kind in ("qk", "ov"):
            sv = " ".join(f"{x:.3g}" for x in h[f"{kind}_singular_values"][:8])
            lines.append(f"{kind.upper()} singular values: {sv}"[:80])
            for i, dr in enumerate(h[f"{kind}_directions"]):
                a, b = ("query_side", "key_side") if kind == "qk" else ("input_side", "output_side")
                lines.append(f"  {i + 1} ({dr['singular_value']:.3g})")
                lines.append(_tokens(f"    {a.replace('_', ' ')}:", dr[a], 80))
                lines.append(_tokens(f"    {b.replace('_', ' ')}:", dr[b], 80))
    return [line.rstrip() for line in lines]


def cmd_weights(args) -> int:
    run = load(args)
    d = run.weights(args.head, args.top)
    print_dict(run, d, args.json, lambda: render(d, args.rows))
    return 0


def add(sub) -> None:
    p = sub.add_parser("weights", help=VERB.help,
                       description="From the weights alone: how much each earlier head's OV "
                       "circuit feeds a later head's query (Q: |QK_B^T OV_A|_F / (|QK_B|_F "
                       "|OV_A|_F)), key (K: QK_B OV_A) or value (V: OV_B OV_A) beside the "
                       "same score for random matrices; with --head, that head's QK and OV "
                       "circuits through a GPT's embeddings and unembedding, each top singular "
                       "direction read as the tokens most aligned with it.")  # fmt: skip
    p.add_argument("run", help="run directory (trained or imported)")
    p.add_argument("--head", help="also this head's QK and OV circuits, e.g. blocks.1.attn.head0")
    p.add_argument("--rows", type=int, default=20, help="head pairs to list (20)")
    p.add_argument("--top", type=int, default=5, help="tokens per singular direction (5)")
    p.set_defaults(func=cmd_weights)


VERB = register(Verb("weights", 178, add, help="composition scores and a head's QK/OV circuits"))
