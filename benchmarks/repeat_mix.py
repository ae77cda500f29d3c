"""A text with repeated random segments spliced in: the data for an induction model whose
induction circuit is a few heads among heads that do other jobs.

    python benchmarks/repeat_mix.py ../shared/data/tinyshakespeare/input.txt mix.txt
    for s in 1 2 3; do
      attnlab train --task induction --data mix.txt --n-layer 4 --n-head 8 --d-model 128 \\
        --lr 3e-3 --max-iters 4000 --seed $s --out mix4l$s
    done
    attnlab circuit mix4l1 --induction 64 --method exact --k 64 --acdc 0.01

On random sequences that repeat (``--data repeat``, the induction task's default) every head of
the last layer becomes an induction head, so the circuit is spread over a large part of the
edges (docs/interpretability.md). Here the text keeps most heads busy with language, and a few
heads learn to copy the segments. After every stretch of ``--min-text`` to ``--max-text``
characters of the text comes, with probability ``--share``, a segment r r [r [r]]: r is
``--min-period`` to ``--max-period`` different characters drawn from the text's own (newline
left out, so every character is one the model reads in the text), repeated 2 to 4 times.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


def splice(text: str, seed: int, share: float, min_text: int, max_text: int,
           min_period: int, max_period: int) -> str:  # fmt: skip
    symbols = sorted(set(text) - {"\n"})
    if len(symbols) < max_period:
        raise ValueError(f"the text has {len(symbols)} characters besides newline; a period of "
                         f"{max_period} different ones needs that many")  # fmt: skip
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rng.randint(min_text, max_text)
        out.append(text[i : i + n])
        i += n
        if rng.random() < share:
            r = rng.sample(symbols, rng.randint(min_period, max_period))
            out.append("".join(r) * rng.randint(2, 4))
    return "".join(out)


def refuse(message: str) -> None:
    print(f"repeat_mix: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("text", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--share", type=float, default=1.0, help="chance of a segment after a stretch")
    p.add_argument("--min-text", type=int, default=40)
    p.add_argument("--max-text", type=int, default=160)
    p.add_argument("--min-period", type=int, default=8)
    p.add_argument("--max-period", type=int, default=24)
    a = p.parse_args()
    if not 0 <= a.share <= 1 or not 1 <= a.min_text <= a.max_text:
        refuse("need 0 <= --share <= 1 and 1 <= --min-text <= --max-text")
    if not 1 <= a.min_period <= a.max_period:
        refuse("need 1 <= --min-period <= --max-period")
    try:
        text = a.text.read_text(encoding="utf-8")
        mixed = splice(text, a.seed, a.share, a.min_text, a.max_text, a.min_period, a.max_period)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        refuse(str(e))
    a.out.write_text(mixed, encoding="utf-8")
    print(f"{a.out}: {len(mixed):,} characters ({len(text):,} of text)")


if __name__ == "__main__":
    main()
