"""Transformer building blocks: the feed-forward networks and the block, which declares its
residual steps as data.

A block runs its sublayers, each in a residual step (``Residual``) that says which norm reads
the stream, which sublayer it feeds, which norm (if any) its output goes through, where it
adds back and with what scale. The layouts are small variants of that one declaration:
    pre-norm  (GPT-2, default):  x = x + Sublayer(LN(x))
    post-norm (the paper, BERT): x = LN(x + Sublayer(x))
    parallel  (GPT-NeoX, Pythia): x = x + Attention(LN1(x)) + FFN(LN2(x))
    four-norm (Gemma 2/3): x = x + LN_post(Sublayer(LN(x))), four norms per block
The sublayers are (masked) self-attention, optionally cross-attention over an encoder's output,
then a position-wise feed-forward network, FFN(x) = W_2 act(W_1 x + b_1) + b_2, or a gated
one, FFN(x) = W_down (act(W_gate x) * W_up x) (SwiGLU, GeGLU). An attention-only block
(``mlp=False``, the models of Elhage et al. 2021) has no FFN sublayer: x = x + Attention(LN(x))
is all it does. The norm is a LayerNorm or an RMSNorm (``attnlab.norms``). A new layout is a
function registered with ``@layout(name)``; everything that reads a block reads its steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

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


SUBLAYERS = {"attn": "self-attention", "cross": "cross-attention", "mlp": "feed-forward"}
NORM_OF = {"attn": "ln1", "cross": "ln_cross", "mlp": "ln2"}  # each sublayer's norm, by name
POINT_OF = {"attn": "resid_mid", "cross": "resid_cross"}  # the stream recorded after it


@dataclass(frozen=True)
class Residual:
    """One residual step of a block, declared as data. With x the residual stream and x0 the
    block's input, a step computes

        h = x  (``reads`` "stream")  or  h = x0  (``reads`` "block": a parallel block)
        h = N(h)       ``norm``: the norm that reads the stream (pre-norm; None: F reads h)
        u = F(h)       ``sublayer``: attn (self-attention), cross (cross-attention over an
                       encoder's output) or mlp (the feed-forward network)
        u = P(u)       ``post``: a norm on the sublayer's output (Gemma 2/3; None: none)
        x = x + s u    the residual connection, ``scale`` s (1: the plain sum)
        x = A(x)       ``after``: a norm on the sum (post-norm; None: none)

    The norms are named by the block's modules (``ln1``, ``ln1_post``, ...). Recorded: the
    normed input as ``norm``'s name, P(u) as ``{sublayer}_post``, the sum before A as
    ``{sublayer}_sum``, and x after the step as ``point`` (attn: resid_mid, cross:
    resid_cross; the last step's x is also the block's resid_post).
    """

    sublayer: str
    norm: str | None = None
    post: str | None = None
    after: str | None = None
    reads: str = "stream"
    scale: float = 1.0

    def __post_init__(self):
        if self.sublayer not in SUBLAYERS:
            raise ValueError(f"unknown sublayer {self.sublayer!r}; choose from "
                             f"{', '.join(SUBLAYERS)}")  # fmt: skip
        if self.reads not in ("stream", "block"):
            raise ValueError(f"a residual step reads the stream or the block's input, not "
                             f"{self.reads!r}")  # fmt: skip

    @property
    def kind(self) -> str:
        """self-attention, cross-attention or feed-forward."""
        return SUBLAYERS[self.sublayer]

    @property
    def point(self) -> str | None:
        """The hook recording the stream after this step (none after the feed-forward: the
        block's resid_post follows it)."""
        return POINT_OF.get(self.sublayer)

    @property
    def output(self) -> str:
        """The hook recording F's output, relative to the block: the attention's own ``out``,
        or the block's ``mlp_out``."""
        return "mlp_out" if self.sublayer == "mlp" else f"{self.sublayer}.out"


# A layout: a function of a block's sublayers (attn, then cross when it cross-attends, then mlp
# when it has a feed-forward) to its residual steps. Registered by name (``layout``), so a
# model config can name one and a new one is a function anywhere (tests/unit/test_graph.py
# defines the sandwich norm in a few lines).
LAYOUTS: dict[str, Callable[[tuple[str, ...]], tuple[Residual, ...]]] = {}


def layout(name: str):
    """Decorator: register a function ``sublayers -> steps`` as the block layout ``name``."""

    def register(fn):
        LAYOUTS[name] = fn
        return fn

    return register


@layout("pre")
def pre_norm(subs: tuple[str, ...]) -> tuple[Residual, ...]:
    """x = x + F(N(x)) for each sublayer (GPT-2, Llama, T5, ViT)."""
    return tuple(Residual(s, norm=NORM_OF[s]) for s in subs)


@layout("post")
def post_norm(subs: tuple[str, ...]) -> tuple[Residual, ...]:
    """x = N(x + F(x)) for each sublayer (the paper, BERT)."""
    return tuple(Residual(s, after=NORM_OF[s]) for s in subs)


@layout("parallel")
def parallel(subs: tuple[str, ...]) -> tuple[Residual, ...]:
    """x = x + Attn(N1(x)) + FFN(N2(x)): both sublayers read the block's input (GPT-J,
    GPT-NeoX, Pythia)."""
    _self_attention_then_ffn("parallel", subs)
    return tuple(Residual(s, norm=NORM_OF[s], reads="block") for s in subs)


@layout("four-norm")
def four_norm(subs: tuple[str, ...]) -> tuple[Residual, ...]:
    """x = x + P(F(N(x))) for each sublayer: a norm before and a norm after (Gemma 2, 3)."""
    _self_attention_then_ffn("four-norm", subs)
    return tuple(Residual(s, norm=NORM_OF[s], post=f"{NORM_OF[s]}_post") for s in subs)


def _self_attention_then_ffn(name: str, subs: tuple[str, ...]) -> None:
    if subs != ("attn", "mlp"):
        raise ValueError(f"a {name} block is self-attention then a feed-forward network")


def layout_words(name: str) -> str:
    """A layout as a message says it: pre-norm, post-norm, parallel, four-norm, sandwich, ..."""
    return {"pre": "pre-norm", "post": "post-norm"}.get(name, name)


def layout_name(norm_first: bool = True, parallel: bool = False, post_norms: bool = False) -> str:
    """The registered layout a model config's flags describe: post-norm, parallel (NeoX),
    four norms (Gemma 2/3), else pre-norm."""
    if (parallel or post_norms) and not norm_first:
        raise ValueError("parallel and post_norms blocks are pre-norm, self-attention then a "
                         "feed-forward network")  # fmt: skip
    if parallel and post_norms:
        raise ValueError("a block is parallel or has post-sublayer norms, not both")
    return (
        "post"
        if not norm_first
        else "parallel"
        if parallel
        else "four-norm"
        if post_norms
        else "pre"
    )


class Block(nn.Module):
    """A transformer block: its sublayers, self-attention (causal or not), cross-attention over
    an encoder's output (``cross_attention``), a feed-forward network (none when ``mlp=False``:
    an attention-only block), each in a residual step its ``layout`` declares (``Residual``):

        pre        x = x + F(N(x))                      (GPT-2, Llama, T5, ViT; the default)
        post       x = N(x + F(x))                      (the paper, BERT; ``norm_first=False``)
        parallel   x = x + Attn(N1(x)) + FFN(N2(x))     (GPT-NeoX, Pythia; ``parallel``)
        four-norm  x = x + P(F(N(x)))                   (Gemma 2, 3; ``post_norms``)

    or any layout registered by name (``layout``). ``self.residual`` is the declaration: the
    forward pass, decoding's fast path, DLA, the trace, the head scores and the residual graph
    (``attnlab.models.graph``) all read it, none the flags it was built from.

    Options (each default keeps the GPT-2 / BERT block): ``norm`` the norm kind (``layer``,
    ``rms``, ``rms-gemma``: ``attnlab.norms``); ``ffn`` the feed-forward kind (``mlp``, or
    ``gated`` with ``activation`` silu / gelu_tanh / gelu_new); ``attn_options``, keyword
    arguments for every MultiHeadAttention of the block (n_kv_heads, d_k, qkv_bias, qk_norm,
    scale, softcap, window, ...; a rotary module goes in ``rotary``, self-attention only).

    Recorded: resid_pre, each pre-norm step's normed input (ln1, ln_cross, ln2), attn.*,
    resid_mid (after attention), cross.* and resid_cross when cross-attending, mlp_in (what
    the FFN reads, after any norm: its own input, which an edit changes for it alone),
    mlp.hidden and mlp_out (with an FFN), {sublayer}_post (an output norm's result, what is added), {sublayer}_sum
    (post-norm: the sum before its norm), resid_post (the block's output).
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
        layout: str | None = None,
    ):
        super().__init__()
        if ffn not in FFNS:
            raise ValueError(f"unknown feed-forward kind {ffn!r}; choose from {', '.join(FFNS)}")
        name = layout_name(norm_first, parallel, post_norms) if layout is None else layout
        if name not in LAYOUTS:
            raise ValueError(f"unknown block layout {name!r}; registered: {', '.join(LAYOUTS)}")
        subs = ("attn",) + (("cross",) if cross_attention else ()) + (("mlp",) if mlp else ())
        self.layout, self.causal = name, causal
        self.residual: tuple[Residual, ...] = tuple(LAYOUTS[name](subs))
        if tuple(s.sublayer for s in self.residual) != subs:
            raise ValueError(f"layout {name!r} must declare one step per sublayer, in the order "
                             f"{', '.join(subs)}")  # fmt: skip
        opts = attn_options or {}
        new_norm = lambda: make_norm(norm, d_model, ln_eps, bias)  # noqa: E731
        make = {
            "attn": lambda: MultiHeadAttention(
                d_model, n_head, bias=bias, dropout=dropout, rotary=rotary, **opts
            ),
            "cross": lambda: MultiHeadAttention(
                d_model, n_head, bias=bias, dropout=dropout, **opts
            ),
            "mlp": lambda: (GatedFeedForward if ffn == "gated" else FeedForward)(
                d_model, d_ff or 4 * d_model, activation, bias
            ),
        }
        self.cross = self.mlp = None  # a sublayer the block does not have
        # the modules in the order they always had (a model's random weights are drawn in it):
        # each sublayer after the norm that reads or closes it, the output norms last
        for s in self.residual:
            for n in (s.norm, s.after):
                if n and n not in self._modules:
                    setattr(self, n, new_norm())
            setattr(self, s.sublayer, make[s.sublayer]())
        for s in self.residual:
            if s.post and s.post not in self._modules:
                setattr(self, s.post, new_norm())
        # residual dropout; with p = 0 an Identity (F.dropout's call costs ~5 us per sublayer,
        # a few percent of a one-token decoding step)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        names = ["resid_pre", *(s.norm for s in self.residual if s.norm)]
        names += [s.point for s in self.residual if s.point] + ["resid_post"]
        names += ["mlp_in", "mlp_out"] if mlp else []
        names += [f"{s.sublayer}_post" for s in self.residual if s.post]
        names += [f"{s.sublayer}_sum" for s in self.residual if s.after]
        for n in dict.fromkeys(names):
            setattr(self, f"hook_{n}", Hook())

    def hook(self, name: str) -> Hook:
        """The block's hook point ``name`` (resid_mid, ln1, attn_post, ...)."""
        return getattr(self, f"hook_{name}")

    def step(self, sublayer: str) -> Residual | None:
        """The residual step that runs ``sublayer`` (attn, cross, mlp), or None: it has none."""
        return next((s for s in self.residual if s.sublayer == sublayer), None)

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
        """x (B, T, C) -> (B, T, C): the declared residual steps in turn (``Residual``).
        ``memory`` (B, S, C) is what cross-attention reads (an encoder's output);
        ``position_bias`` (B|1, H, T, T) is added to self-attention's scores (T5)."""
        run = {
            "attn": lambda h: self.attn(
                h, mask=mask, causal=self.causal, cache=cache, position_bias=position_bias
            ),
            "cross": lambda h: self.cross(h, kv=memory, mask=memory_mask, cache=cross_cache),
            "mlp": lambda h: self.hook_mlp_out(self.mlp(self.hook_mlp_in(h))),
        }
        x = x0 = self.hook_resid_pre(x)  # (B, T, C)
        for s in self.residual:
            h = x0 if s.reads == "block" else x  # what the step reads
            if s.norm:
                h = self.hook(s.norm)(getattr(self, s.norm)(h))
            u = run[s.sublayer](h)  # (B, T, C) the sublayer's update
            if s.post:
                u = self.hook(f"{s.sublayer}_post")(getattr(self, s.post)(u))
            u = self.drop(u)  # residual dropout (an Identity when p = 0)
            x = x + (u if s.scale == 1 else s.scale * u)
            if s.after:
                x = getattr(self, s.after)(self.hook(f"{s.sublayer}_sum")(x))
            if s.point:
                x = self.hook(s.point)(x)
        return self.hook_resid_post(x)


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
