"""Draw the README's attention heatmap: a tiny char GPT trained for a few seconds, then one head.

    PYTHONPATH=src OMP_NUM_THREADS=1 python examples/attention_heatmap.py docs/attention.png

The same model as examples/walkthrough.ipynb (2 layers, 4 heads of width 24).
"""

from __future__ import annotations

import sys

import torch

from attnlab import GPT, CharTokenizer, GPTConfig
from attnlab.inspect import attention, attention_grid
from attnlab.inspect.recording import record

CORPUS = (
    "I like to eat apples. You like to eat pears. We like to eat apples and pears. "
    "They like to read books. I like to read. You eat apples. "
) * 20


def train(steps: int = 300) -> tuple[GPT, CharTokenizer]:
    torch.manual_seed(0)
    tok = CharTokenizer.from_text(CORPUS)
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=4, d_model=96, block_size=32)
    )
    data = torch.tensor(tok.encode(CORPUS))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    T = model.config.block_size
    for _ in range(steps):
        starts = torch.randint(0, len(data) - T - 1, (16,))
        x = torch.stack([data[s : s + T] for s in starts])  # (16, T)
        y = torch.stack([data[s + 1 : s + T + 1] for s in starts])
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained {steps} steps, loss {loss.item():.3f}", file=sys.stderr)
    return model.eval(), tok


def main(out: str = "docs/attention.png", grid: str | None = "docs/attention_grid.png") -> None:
    model, tok = train()
    rec = record(model, tok, "I like to eat apples")
    attention(rec, layer=1, head=2).save_png(out)
    print(f"wrote {out}", file=sys.stderr)
    if grid:
        attention_grid(rec).save_png(grid)
        print(f"wrote {grid}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
