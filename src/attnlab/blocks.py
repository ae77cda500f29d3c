"""Transformer building blocks: the feed-forward network and the attention block.

A block is two sublayers, each wrapped in a residual connection and a LayerNorm:
    pre-norm  (GPT-2, default):  x = x + Sublayer(LN(x))
    post-norm (the paper, BERT): x = LN(x + Sublayer(x))
The sublayers are (masked) self-attention, optionally cross-attention over an encoder's output,
then a position-wise feed-forward network FFN(x) = W_2 act(W_1 x + b_1) + b_2. An
attention-only block (``mlp=False``, the models of Elhage et al. 2021) has no FFN sublayer:
x = x + Attention(LN(x)) is all it does.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention import KVCache, MultiHeadAttention, StaticKV
from attnlab.hooks import Hook

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class FeedForward(nn.Module):
    """Position-wise: the same two-layer MLP applied to every token on its own."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}"
            )
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)  # C -> 4C: widen
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)  # 4C -> C: back to the residual width
        self.act = ACTIVATIONS[activation]
        self.hook_hidden = Hook()

    def forward(self, x: Tensor) -> Tensor:
        h = self.hook_hidden(self.act(self.fc1(x)))  # (B, T, d_ff)
        return self.fc2(h)  # (B, T, C); the block applies residual dropout


class Block(nn.Module):
    """Self-attention (causal or not), optional cross-attention, then the feed-forward network
    (none when ``mlp=False``: an attention-only block).

    Recorded: resid_pre, ln1 (normalised input to attention), attn.*, resid_mid (after
    attention), cross.* and resid_cross when cross-attending, ln2, mlp.hidden, mlp_out (with
    an FFN), resid_post (the block's output).
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        causal: bool = False,
        cross_attention: bool = False,
        norm_first: bool = True,
        activation: str = "gelu",
        ln_eps: float = 1e-5,
        bias: bool = True,
        rotary: nn.Module | None = None,
        mlp: bool = True,
    ):
        super().__init__()
        self.causal = causal
        self.norm_first = norm_first
        self.ln1 = nn.LayerNorm(d_model, eps=ln_eps, bias=bias)
        self.attn = MultiHeadAttention(d_model, n_head, bias=bias, dropout=dropout, rotary=rotary)
        if cross_attention:
            self.ln_cross = nn.LayerNorm(d_model, eps=ln_eps, bias=bias)
            self.cross = MultiHeadAttention(d_model, n_head, bias=bias, dropout=dropout)
            self.hook_resid_cross = Hook()
        else:
            self.cross = None
        if mlp:
            self.ln2 = nn.LayerNorm(d_model, eps=ln_eps, bias=bias)
            self.mlp = FeedForward(d_model, d_ff or 4 * d_model, activation, bias)
        else:
            self.ln2 = self.mlp = None  # attention-only
        # residual dropout; with p = 0 an Identity (F.dropout's call costs ~5 us per sublayer,
        # a few percent of a one-token decoding step)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        names = ("resid_pre", "ln1", "resid_mid", "resid_post") + (
            ("ln2", "mlp_out") if mlp else ()
        )
        for name in names:
            setattr(self, f"hook_{name}", Hook())

    def _sublayer(self, x, ln, fn, hook_ln=None):
        """One residual sublayer, pre- or post-norm."""
        if self.norm_first:
            h = ln(x)
            return x + self.drop(fn(hook_ln(h) if hook_ln else h))
        return ln(x + self.drop(fn(x)))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
        cross_cache: StaticKV | None = None,
    ) -> Tensor:
        x = self.hook_resid_pre(x)  # (B, T, C)
        attend = lambda h: self.attn(h, mask=mask, causal=self.causal, cache=cache)
        x = self.hook_resid_mid(self._sublayer(x, self.ln1, attend, self.hook_ln1))
        if self.cross is not None:
            cross = lambda h: self.cross(h, kv=memory, mask=memory_mask, cache=cross_cache)
            x = self.hook_resid_cross(self._sublayer(x, self.ln_cross, cross))
        if self.mlp is not None:
            mlp = lambda h: self.hook_mlp_out(self.mlp(h))
            x = self._sublayer(x, self.ln2, mlp, self.hook_ln2)
        return self.hook_resid_post(x)

    def sublayers(self) -> list[tuple[str, nn.Module, str, str]]:
        """The residual sublayers in forward order, as (name, module, the name of its
        LayerNorm, the point recorded after it): attn; cross when the block cross-attends; mlp
        when it has one (its output is ``mlp_out``; the point after it is ``resid_post``)."""
        out = [("attn", self.attn, "ln1", "resid_mid")]
        if self.cross is not None:
            out.append(("cross", self.cross, "ln_cross", "resid_cross"))
        if self.mlp is not None:
            out.append(("mlp", self.mlp, "ln2", "resid_post"))
        return out


def block_stack(c, causal: bool, rotary: nn.Module | None = None) -> nn.ModuleList:
    """``c.n_layer`` Blocks sized by a model config (d_model, n_head, d_ff, dropout, norm_first,
    activation, ln_eps, bias, and ``mlp`` where the config has it): the stack of a GPT
    (causal), a BERT-style encoder or a ViT."""
    mlp = getattr(c, "mlp", True)
    return nn.ModuleList(
        Block(c.d_model, c.n_head, c.d_ff, c.dropout, causal=causal, norm_first=c.norm_first,
              activation=c.activation, ln_eps=c.ln_eps, bias=c.bias, rotary=rotary, mlp=mlp)
        for _ in range(c.n_layer)
    )  # fmt: skip
