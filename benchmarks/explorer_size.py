"""Size of the HTML explorer page for short and long inputs (docs/figures.md quotes this table).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/explorer_size.py

A random (untrained) model of the `baby` preset's shape (4 layers x 4 heads, d_model 128) with
block_size 512; random weights give dense attention, the worst case for a page that carries
rounded weights (the page computes them from q and k where that reproduces them exactly).
"""

from __future__ import annotations

import time

import torch

from attnlab import GPT, CharTokenizer, GPTConfig
from attnlab.inspect import explore, record

TEXT = "I like to eat apples. You like to eat pears. The bank of the river is green. " * 10


def main() -> None:
    torch.manual_seed(0)
    tok = CharTokenizer.from_text(TEXT)
    cfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=4, n_head=4, d_model=128, block_size=512)
    model = GPT(cfg).eval()
    print(f"{'tokens':>6} {'--max-tokens':>12} {'kept':>5} {'size':>10} {'build s':>8}")
    for n, cap in [(64, 128), (128, 128), (512, 128), (512, 512)]:
        t0 = time.perf_counter()
        page = explore(record(model, tok, TEXT[:n]), model, max_tokens=cap, tokenizer=tok)
        dt = time.perf_counter() - t0
        kept = page.data["maps"][0]["T"]
        print(f"{n:>6} {cap:>12} {kept:>5} {page.size / 1024:>7.0f} KiB {dt:>8.2f}")


if __name__ == "__main__":
    main()
