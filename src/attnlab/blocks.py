"""Transformer building blocks: the feed-forward networks and the attention block.

A block is two sublayers, each wrapped in a residual connection and a norm:
    pre-norm  (GPT-2, default):  x = x + Sublayer(LN(x))
    post-norm (the paper, BERT): x = LN(x + Sublayer(x))
    parallel  (GPT-NeoX, Pythia): x = x + Attention(LN1(x)) + FFN(LN2(x))
    post-sublayer norms (Gemma 2/3): x = x + LN_post(Sublayer(LN(x))), four norms per block
The sublayers are (masked) self-attention, optionally cross-attention over an encoder's output,
then a position-wise feed-forward network, FFN(x) = W_2 act(W_1 x + b_1) + b_2, or a gated
one, FFN(x) = W_down (act(W_gate x) * W_up x) (SwiGLU, GeGLU). An attention-only block
(``mlp=False``, the models of Elhage et al. 2021) has no FFN sublayer: x = x + Attention(LN(x))
is all it does. The norm is a LayerNorm or an RMSNorm (``attnlab.norms``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention import KVCache, MultiHeadAttention, StaticKV
from attnlab.hooks import Hook
from attnlab.norms import make_norm


def gelu_new(x: Tensor) -> Tensor:
    """GELU's tanh approximation written out, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))):
    GPT-2's and T5 v1.1's ``gelu_new`` (torch's ``gelu_tanh`` differs from it by ~1e-7)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def relu2(x: Tensor) -> Tensor:
    """ReLU squared, max(0, x)^2 (So et al. 2021, Primer; the GPU speedrun's feed-forward): as
    cheap as ReLU, smooth at 0 on the side that passes, and sparse like it."""
    return F.relu(x).square()


ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": relu2,
    "silu": F.silu,  # x sigmoid(x): SwiGLU's gate (Llama, Qwen, Mistral)
    "gelu_new": gelu_new,
}
FFNS = ("mlp", "gated")  # the feed-forward kinds a Block takes


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose from {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """Position-wise: the same two-layer MLP applied to every token on its own."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.act = _activation(activation)
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)  # C -> 4C: widen
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)  # 4C -> C: back to the residual width
        self.hook_hidden = Hook()

    def forward(self, x: Tensor) -> Tensor:
        h = self.hook_hidden(self.act(self.fc1(x)))  # (B, T, d_ff)
        return self.fc2(h)  # (B, T, C); the block applies residual dropout


class GatedFeedForward(nn.Module):
    """A gated feed-forward network: FFN(x) = W_down (act(W_gate x) * W_up x).

    One projection, passed through the activation, gates another elementwise. ``silu``: SwiGLU
    (Llama, Qwen, Mistral); ``gelu_tanh``: GeGLU (Gemma); ``gelu_new``: T5 v1.1's gated GELU
    (its wi_0 is the gate, wi_1 the up projection). Recorded: gate (B, T, d_ff), act(W_gate x);
    hidden (B, T, d_ff), the gated product W_down reads (as FeedForward's hidden).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu", bias: bool = False):
        super().__init__()
        self.act = _activation(activation)
        self.gate = nn.Linear(d_model, d_ff, bias=bias)  # C -> d_ff: the gate, through act
        self.up = nn.Linear(d_model, d_ff, bias=bias)  # C -> d_ff: what the gate lets through
        self.down = nn.Linear(d_ff, d_model, bias=bias)  # d_ff -> C: back to the residual width
        self.hook_gate, self.hook_hidden = Hook(), Hook()

    def forward(self, x: Tensor) -> Tensor:
        g = self.hook_gate(self.act(self.gate(x)))  # (B, T, d_ff) in roughly (0, 1) x scale
        h = self.hook_hidden(g * self.up(x))  # (B, T, d_ff) the gated product
        return self.down(h)  # (B, T, C)


class Block(nn.Module):
    """Self-attention (causal or not), optional cross-attention, then the feed-forward network
    (none when ``mlp=False``: an attention-only block).

    Options (each default keeps the GPT-2 / BERT block): ``norm`` the norm kind (``layer``,
    ``rms``, ``rms-gemma``: ``attnlab.norms``); ``ffn`` the feed-forward kind (``mlp``, or
    ``gated`` with ``activation`` silu / gelu_tanh / gelu_new); ``parallel`` (pre-norm, both
    sublayers read the block's input: x + attn(ln1(x)) + mlp(ln2(x))); ``post_norms`` (pre-norm
    with a second norm on each sublayer's output: x + ln1_post(attn(ln1(x))), then
    x + ln2_post(mlp(ln2(x)))); ``attn_options``, keyword arguments for every
    MultiHeadAttention of the block (n_kv_heads, d_k, qkv_bias, qk_norm, scale, softcap,
    window, ...; a rotary module goes in ``rotary``, self-attention only).

    Recorded: resid_pre, ln1 (normalised input to attention), attn.*, resid_mid (after
    attention; with ``parallel``, x + attention's output), cross.* and resid_cross when
    cross-attending, ln2, mlp.hidden, mlp_out (with an FFN), attn_post and mlp_post (what
    ``post_norms`` adds to the residual), resid_post (the block's output); post-norm blocks
    also record attn_sum, cross_sum and mlp_sum, each residual sum before the norm that follows
    it (resid_mid = LN(attn_sum), resid_cross = LN(cross_sum), resid_post = LN(mlp_sum)).
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
        norm: str = "layer",
        ffn: str = "mlp",
        parallel: bool = False,
        post_norms: bool = False,
        attn_options: dict | None = None,
    ):
        super().__init__()
        if ffn not in FFNS:
            raise ValueError(f"unknown feed-forward kind {ffn!r}; choose from {', '.join(FFNS)}")
        if (parallel or post_norms) and (not norm_first or not mlp or cross_attention):
            raise ValueError("parallel and post_norms blocks are pre-norm, self-attention "
                             "then a feed-forward network")  # fmt: skip
        if parallel and post_norms:
            raise ValueError("a block is parallel or has post-sublayer norms, not both")
        self.causal, self.norm_first = causal, norm_first
        self.parallel, self.post_norms = parallel, post_norms
        opts = attn_options or {}
        new_norm = lambda: make_norm(norm, d_model, ln_eps, bias)  # noqa: E731
        self.ln1 = new_norm()
        self.attn = MultiHeadAttention(
            d_model, n_head, bias=bias, dropout=dropout, rotary=rotary, **opts
        )
        if cross_attention:
            self.ln_cross = new_norm()
            self.cross = MultiHeadAttention(d_model, n_head, bias=bias, dropout=dropout, **opts)
            self.hook_resid_cross = Hook()
        else:
            self.cross = None
        if mlp:
            self.ln2 = new_norm()
            d_ff = d_ff or 4 * d_model
            if ffn == "gated":
                self.mlp = GatedFeedForward(d_model, d_ff, activation, bias)
            else:
                self.mlp = FeedForward(d_model, d_ff, activation, bias)
        else:
            self.ln2 = self.mlp = None  # attention-only
        if post_norms:
            self.ln1_post, self.ln2_post = new_norm(), new_norm()
        # residual dropout; with p = 0 an Identity (F.dropout's call costs ~5 us per sublayer,
        # a few percent of a one-token decoding step)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        names = ("resid_pre", "ln1", "resid_mid", "resid_post") + (
            ("ln2", "mlp_out") if mlp else ()
        )
        names += ("attn_post", "mlp_post") if post_norms else ()
        if not norm_first:  # post-norm: the sums each norm reads, before it
            names += (
                ("attn_sum",)
                + (("cross_sum",) if cross_attention else ())
                + (("mlp_sum",) if mlp else ())
            )
        for name in names:
            setattr(self, f"hook_{name}", Hook())

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
        cross_cache: StaticKV | None = None,
        position_bias: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, C) -> (B, T, C): each sublayer in a residual connection, pre- or post-norm.
        ``memory`` (B, S, C) is what cross-attention reads (an encoder's output);
        ``position_bias`` (B|1, H, T, T) is added to self-attention's scores (T5)."""
        attn = lambda h: self.attn(  # noqa: E731
            h, mask=mask, causal=self.causal, cache=cache, position_bias=position_bias
        )
        cross = lambda h: self.cross(h, kv=memory, mask=memory_mask, cache=cross_cache)
        mlp = lambda h: self.hook_mlp_out(self.mlp(h))
        drop = self.drop  # residual dropout (an Identity when p = 0)
        x = self.hook_resid_pre(x)  # (B, T, C)
        if self.parallel:  # both sublayers read the block's input
            a = drop(attn(self.hook_ln1(self.ln1(x))))  # (B, T, C)
            m = drop(mlp(self.hook_ln2(self.ln2(x))))  # (B, T, C)
            x = self.hook_resid_mid(x + a) + m
        elif self.post_norms:  # each sublayer's output normed again before it is added
            a = self.hook_attn_post(self.ln1_post(attn(self.hook_ln1(self.ln1(x)))))
            x = self.hook_resid_mid(x + drop(a))
            x = x + drop(self.hook_mlp_post(self.ln2_post(mlp(self.hook_ln2(self.ln2(x))))))
        elif self.norm_first:
            x = self.hook_resid_mid(x + drop(attn(self.hook_ln1(self.ln1(x)))))
            if self.cross is not None:
                x = self.hook_resid_cross(x + drop(cross(self.ln_cross(x))))
            if self.mlp is not None:
                x = x + drop(mlp(self.hook_ln2(self.ln2(x))))
        else:
            x = self.hook_resid_mid(self.ln1(self.hook_attn_sum(x + drop(attn(x)))))
            if self.cross is not None:
                x = self.hook_resid_cross(self.ln_cross(self.hook_cross_sum(x + drop(cross(x)))))
            if self.mlp is not None:
                x = self.ln2(self.hook_mlp_sum(x + drop(mlp(x))))
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


def block_parameters(d_model: int, d_ff: int, cross: bool = False) -> int:
    """About how many parameters one Block of width C = ``d_model`` holds, counted without
    building it: 4 C^2 of self-attention (Q, K, V, out), 4 C^2 more of cross-attention, and
    2 C d_ff of feed-forward (``d_ff`` 0: none). Biases and norms, O(C), are left out."""
    return (8 if cross else 4) * d_model * d_model + 2 * d_model * d_ff


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
