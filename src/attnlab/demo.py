"""`make demo`: the attention matrix of a sentence, as the notes draw it."""

from __future__ import annotations

import torch

from attnlab.attention import MultiHeadAttention


def attention_table(tokens: list[str], weights: torch.Tensor) -> str:
    """A token x token table: row = the query token, column = the key token it attends to."""
    width = max(6, *(len(t) for t in tokens)) + 1
    head = " " * width + "".join(f"{t:>{width}}" for t in tokens)
    rows = [
        f"{q:>{width}}" + "".join(f"{w:>{width}.2f}" for w in row.tolist())
        for q, row in zip(tokens, weights)
    ]
    return "\n".join([head, *rows])


def main() -> None:
    torch.manual_seed(0)
    tokens = ["I", "like", "to", "eat", "apples"]
    d_model = 16
    embed = torch.nn.Embedding(len(tokens), d_model)
    x = embed(torch.arange(len(tokens)))[None]  # (1, N, M): N tokens, M = d_model
    attn = MultiHeadAttention(d_model, n_heads=1).eval()
    with torch.no_grad():
        _, w = attn(x, causal=True, return_weights=True)  # (1, 1, N, N)
    print("Attention of 'I like to eat apples' (RANDOM, untrained weights; causal mask):")
    print(attention_table(tokens, w[0, 0]))


if __name__ == "__main__":
    main()
