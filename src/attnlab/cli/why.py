"""`attnlab why RUN TEXT --head H --query Q --key K`: why a head attends from one position to
another: its score split into (query-side writer, key-side writer) parts that add up to the
model's score (``Run.why``)."""

from __future__ import annotations

from attnlab.cli import Verb, register
from attnlab.cli.common import load, print_dict


def render(d: dict, top: int) -> list[str]:
    """The split as lines of at most 80 columns: the ``top`` largest parts by size, the rest
    summed, the position bias; they add up to the score (to the ``error`` printed)."""
    parts = [(a, b, d["table"][i][j]) for i, a in enumerate(d["query_terms"])
             for j, b in enumerate(d["key_terms"])]  # fmt: skip
    parts.sort(key=lambda p: -abs(p[2]))
    shown, rest = parts[:top], parts[top:]
    lines = [
        f"head {d['head']}: query {d['query_position']} -> key {d['key_position']}, "
        f"score {d['score']:+.4f} = the parts below",  # fmt: skip
        f"{'query-side writer':<28} {'key-side writer':<28} {'part':>12}",
    ]
    lines += [f"{a[:28]:<28} {b[:28]:<28} {v:>+12.4f}" for a, b, v in shown]
    if rest:
        lines.append(f"{f'the other {len(rest)} parts':<57} {sum(p[2] for p in rest):>+12.4f}")
    if d["position_bias"]:
        lines.append(f"{'position bias':<57} {d['position_bias']:>+12.4f}")
    lines.append(f"{'sum':<57} {sum(p[2] for p in parts) + d['position_bias']:>+12.4f}")
    lines.append(f"(|sum - score| = {d['error']:.1e}; norms frozen at this input, before any "
                 "softcap)")  # fmt: skip
    return [line.rstrip() for line in lines]


def cmd_why(args) -> int:
    run = load(args)
    d = run.why(args.text, args.head, args.query, args.key)
    print_dict(run, d, args.json, lambda: render(d, args.top))
    return 0


def add(sub) -> None:
    p = sub.add_parser("why", help=VERB.help,
                       description="Split head HEAD's pre-softmax score from query position "
                       "QUERY to key position KEY into parts scale * q^a . k^b, one per "
                       "(query-side writer a, key-side writer b): the embeddings, each earlier "
                       "head and feed-forward, the biases. The parts add up to the score.")  # fmt: skip
    p.add_argument("run", help="run directory (trained or imported)")
    p.add_argument("text", help="the input")
    p.add_argument("--head", required=True, help="the head, e.g. blocks.1.attn.head0")
    p.add_argument("--query", type=int, required=True, help="the query position (from 0)")
    p.add_argument("--key", type=int, required=True, help="the key position (from 0)")
    p.add_argument("--top", type=int, default=10, help="parts to list by size (10)")
    p.add_argument("--json", action="store_true", help="print Run.why's dict as JSON")
    p.set_defaults(func=cmd_why)


VERB = register(Verb("why", 176, add, help="a head's attention score split by writer"))
