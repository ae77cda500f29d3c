"""Small models and runs for the look-inside tests (built here: the trainer lives elsewhere)."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.attention import MultiHeadAttention
from attnlab.blocks import Block
from attnlab.models.declare import ModelKind
from attnlab.rundir import save_model
from attnlab.tokenizers import CharTokenizer
from lm_helpers import tiny_gpt  # the tests' one small GPT (its importers take it from here too)

SENTENCE = "I like to eat apples"
CORPUS = "I like to eat apples. You like to eat pears. The bank of the river is green. "


def char_tokenizer() -> CharTokenizer:
    return CharTokenizer.from_text(CORPUS)


def train_briefly(
    model: nn.Module, tok: CharTokenizer, steps: int = 40, lr: float = 1e-2
) -> nn.Module:
    """A few dozen steps of next-character prediction on the corpus: enough for non-uniform maps."""
    data = torch.tensor(tok.encode(CORPUS * 2))
    T = model.config.block_size
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - T - 1, (8,), generator=g)
        x = torch.stack([data[s : s + T] for s in starts])  # (8, T)
        y = torch.stack([data[s + 1 : s + T + 1] for s in starts])
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def make_run(path, steps: int = 40, **overrides):
    """A run directory with the same layout `attnlab train` writes."""
    torch.manual_seed(0)
    tok = char_tokenizer()
    model = train_briefly(tiny_gpt(tok, **overrides), tok, steps)
    save_model(path, model, tok)
    return path, model, tok


# ---------------------------------------------------------------------------------------------
# The classic mistake (notes, 004): mask the LOWER triangle (allow only self and the future) and
# normalise over the query axis (softmax dim=-2).
# ---------------------------------------------------------------------------------------------


def broken_forward(
    self, x, kv=None, mask=None, causal=False, cache=None, return_weights=False, position_bias=None
):
    q = self._heads(self.q_proj(x), self.d_k)  # (B, H, T, d_k)
    k = self._heads(self.k_proj(x), self.d_k)
    v = self._heads(self.v_proj(x), self.d_v)
    if cache is not None:
        k, v = cache.append(k, v)
    q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
    T, S = q.size(2), k.size(2)
    scores = q @ k.transpose(-2, -1) / self.d_k**0.5  # (B, H, T, S)
    lower = torch.tril(torch.ones(T, S, dtype=torch.bool), diagonal=-1 + (S - T))
    scores = self.hook_scores(
        scores.masked_fill(lower, float("-inf"))
    )  # the mistake: hides the past
    weights = self.hook_weights(torch.softmax(scores, dim=-2))  # the mistake: over queries
    weights = torch.nan_to_num(weights)
    z = self.hook_z(weights @ v)  # (B, H, T, d_v)
    out = self.hook_out(self.out_proj(z.transpose(1, 2).reshape(x.size(0), T, -1)))
    return (out, weights) if return_weights else out


def break_attention(model: nn.Module, monkeypatch) -> None:
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            monkeypatch.setattr(m, "forward", broken_forward.__get__(m))


# ---------------------------------------------------------------------------------------------
# A tiny encoder (bidirectional, masks pad keys): exercises the default declaration and the
# padding check without depending on the encoder being written elsewhere.
# ---------------------------------------------------------------------------------------------


class TinyEncoder(ModelKind, nn.Module):
    """Embedding + positions + non-causal blocks; keys whose id is ``pad_id`` are masked out.
    It declares itself with ``ModelKind``'s defaults (not registered: no run holds it)."""

    kind = "tiny-encoder"

    uses_padding = True
    causal = False

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 16,
        n_head: int = 2,
        n_layer: int = 2,
        max_len: int = 32,
        mask_padding: bool = True,
    ):
        super().__init__()
        self.config = type("Cfg", (), {"vocab_size": vocab_size, "max_len": max_len})()
        self.pad_id = 0
        self.mask_padding = mask_padding
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Parameter(torch.randn(max_len, d_model) * 0.1)
        self.blocks = nn.ModuleList(Block(d_model, n_head, causal=False) for _ in range(n_layer))
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids):
        T = ids.size(1)
        x = self.tok_embed(ids) + self.pos_embed[:T]  # (B, T, C)
        mask = (ids != self.pad_id)[:, None, None, :] if self.mask_padding else None  # (B, 1, 1, T)
        for b in self.blocks:
            x = b(x, mask=mask)
        return self.head(x)  # (B, T, vocab)


def run_main(capsys, *args) -> tuple[int, str, str]:
    """``attnlab ARGS`` in this process (fast; the subprocess tests cover the real entry point)."""
    from attnlab.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err
