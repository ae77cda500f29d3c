"""GPT: a decoder-only language model trained on next-token prediction.

ids (B, T) -> token embedding (B, T, C) + positions -> n_layer causal blocks
           -> final LayerNorm -> LM head tied to the embedding -> logits (B, T, vocab)

``GPTConfig(mlp=False)`` (the ``attn-only-2l`` preset) makes every block attention-only. This module is the
architecture; decoding it (the KV cache, the window policies past block_size, FastForward) is
``attnlab.decoding.GPTDecoder``, the decoder ``GPT.decoded_by`` declares.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.attention import WEIGHTINGS, KVCache, from_hf_attention_mask, softcap
from attnlab.blocks import ACTIVATIONS, FFNS, LAYOUTS, Block, Residual, layout_name
from attnlab.config import BaseConfig, ConfigError
from attnlab.decoding import GPTDecoder
from attnlab.hooks import Hook
from attnlab.models.declare import LaterLogits, ModelKind, Unembed, register
from attnlab.norms import NORMS, make_norm
from attnlab.positional import POSITIONAL, RopeScaling, Rotary, RotaryHalf

POSITIONS = ("learned", "sinusoidal", "rotary")
ROTARY_LAYOUTS = ("pairs", "half")  # adjacent pairs (GPT-J, attnlab's own); rotate-half (Llama)
LAYER_TYPES = ("full", "sliding")  # a layer attends to every earlier position, or a window


@dataclasses.dataclass
class GPTConfig(BaseConfig):
    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.0
    bias: bool = True
    pos: str = "learned"
    norm_first: bool = True
    activation: str = "gelu"
    ln_eps: float = 1e-5
    tie_weights: bool = True
    mlp: bool = True  # False: attention-only blocks (no feed-forward network)
    # The pieces of today's decoders (Llama, Mistral, Qwen, Gemma, Pythia). Each default keeps
    # the GPT above, and a field at its default is left out of config.json (see to_dict).
    norm: str = "layer"  # layer | rms | rms-gemma (RMSNorm times 1 + w): attnlab.norms
    ffn: str = "mlp"  # mlp | gated: down(act(gate(x)) * up(x)) (SwiGLU with silu, GeGLU)
    n_kv_heads: int | None = None  # K/V heads shared by groups of query heads; None = n_head
    head_dim: int | None = None  # each head's width; None = d_model / n_head
    rotary: str = "pairs"  # with pos="rotary": pairs (2i, 2i+1) or half (i, i + D/2)
    rot_dim: int | None = None  # channels of each head that rotate (Pythia); None = all
    rope_base: float = 10000.0
    rope_scaling: dict | None = None  # RopeScaling's fields: {"kind": "llama3", "factor": 8, ...}
    local_rope_base: float | None = None  # the base of sliding layers, where it differs (Gemma 3)
    sliding_window: int | None = None  # a sliding layer's query sees the last this many tokens
    layer_types: list | None = None  # full | sliding, layer i the (i mod len)-th: a pattern
    #       (Gemma 2: [sliding, full]) or one per layer; None = all sliding when sliding_window
    #       is set (Mistral), else all full
    qk_norm: bool = False  # an RMSNorm on each head's q and k (Qwen3), of the model's kind
    #       where its norm is one (rms-gemma: 1 + w), a plain one in a LayerNorm model
    qkv_bias: bool | None = None  # None = bias (Qwen2: q/k/v biases only)
    out_bias: bool | None = None  # None = bias
    attn_scale: float | None = None  # factor on q.k; None = 1/sqrt(head width)
    attn_softcap: float | None = None  # scores -> cap tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits -> cap tanh(logits / cap) (Gemma 2)
    parallel: bool = False  # x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX, Pythia)
    post_norms: bool = False  # a norm on each sublayer's output too (Gemma 2, 3)
    embed_scale: bool = False  # token embeddings times sqrt(d_model) (Gemma)
    layout: str | None = None  # a block layout registered by name (attnlab.blocks.layout);
    #       None: the one norm_first, parallel and post_norms describe
    attention: str = "softmax"  # how scores become weights: softmax, softmax1 or sigmoid, whose
    #       rows need not sum to 1 (attnlab.attention.WEIGHTINGS)
    # The GPU speedrun's initialisation: each block's output projections (attention's W_O, the
    # feed-forward's last matrix) start at zero, and so does an untied head: every block
    # starts as the identity and the first logits are uniform
    zero_init: bool = False

    def validate(self) -> None:
        self._positive("vocab_size", "block_size", "n_layer", "n_head", "d_model")
        self._positive_or_none("d_ff", "n_kv_heads", "head_dim", "rot_dim", "sliding_window")
        self._positive_or_none("attn_scale", "attn_softcap", "final_softcap", "local_rope_base")
        if self.head_dim is None:
            self._divisible("d_model", "n_head")
        self._one_of("pos", POSITIONS)
        hd = self.head_width
        if self.pos == "rotary" and (self.rot_dim or hd) % 2:
            raise ConfigError("rotary positions need an even head width (d_model / n_head)")
        self._one_of("activation", ACTIVATIONS)
        self._fraction("dropout")
        self._positive("ln_eps", "rope_base")
        self._one_of("norm", NORMS)
        self._one_of("ffn", FFNS)
        self._one_of("rotary", ROTARY_LAYOUTS)
        self._one_of("attention", tuple(WEIGHTINGS))
        if self.n_head % (self.n_kv_heads or self.n_head):
            raise ConfigError(f"n_kv_heads ({self.n_kv_heads}) must divide n_head ({self.n_head})")
        if (self.rotary != "pairs" or self.rot_dim or self.rope_scaling) and self.pos != "rotary":
            raise ConfigError("rotary, rot_dim and rope_scaling need pos='rotary'")
        if self.rotary == "pairs" and (self.rot_dim or self.rope_scaling or self.local_rope_base):
            raise ConfigError("rot_dim, rope_scaling and local_rope_base need rotary='half'")
        if self.rot_dim is not None and self.rot_dim > hd:
            raise ConfigError(f"rot_dim ({self.rot_dim}) exceeds the head width ({hd})")
        if self.rope_scaling is not None:
            try:
                RopeScaling(**self.rope_scaling)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"rope_scaling: {e}") from None
        if self.layer_types is not None:
            if not self.layer_types or not set(self.layer_types) <= {*LAYER_TYPES}:
                raise ConfigError(f"layer_types: a list of {', '.join(LAYER_TYPES)}")
            if "sliding" in self.layer_types and self.sliding_window is None:
                raise ConfigError("sliding layers need a sliding_window")
        if (self.qk_norm or self.norm != "layer") and not self.norm_first:
            raise ConfigError("qk_norm and RMS norms are built pre-norm (norm_first)")
        if (self.parallel or self.post_norms) and (not self.norm_first or not self.mlp):
            raise ConfigError("parallel and post_norms blocks are pre-norm with a feed-forward")
        if self.parallel and self.post_norms:
            raise ConfigError("a block is parallel or has post_norms, not both")
        if self.layout is not None:
            self._one_of("layout", LAYOUTS)
            if self.parallel or self.post_norms:
                raise ConfigError("layout names the whole block: leave parallel and post_norms "
                                  "at their defaults")  # fmt: skip

    @property
    def block_layout(self) -> str:
        """The name of the blocks' layout (``attnlab.blocks.LAYOUTS``): ``layout``, or pre,
        post, parallel or four-norm as norm_first, parallel and post_norms say."""
        return self.layout or layout_name(self.norm_first, self.parallel, self.post_norms)

    def residual_steps(self) -> tuple[Residual, ...]:
        """Each block's residual steps, the declaration its Blocks are built from (what an
        exporter reads to see whether another library's blocks can hold them)."""
        return LAYOUTS[self.block_layout](("attn", "mlp") if self.mlp else ("attn",))

    @property
    def head_width(self) -> int:
        return self.head_dim or self.d_model // self.n_head

    def window_of(self, layer: int) -> int | None:
        """The sliding window of layer ``layer``, or None where it sees every earlier token."""
        types = self.layer_types
        kind = types[layer % len(types)] if types else "sliding"
        return self.sliding_window if kind == "sliding" else None

    def to_dict(self) -> dict:
        """Every field, less the modern-decoder ones at their defaults: the config.json of a
        run written before they existed is unchanged (from_dict fills them back in)."""
        d = super().to_dict()
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in list(d)[list(d).index("norm") :]:
            if d[name] == defaults[name]:
                del d[name]
        return d

    def estimate_parameters(self) -> int:
        """About how many parameters a GPT of this config has, from its sizes alone (building
        100,000 layers takes minutes even on the meta device): the blocks, the token and
        learned position embeddings, and the output layer when it is not tied."""
        c = self.d_model
        ff = (self.d_ff or 4 * c) if self.mlp else 0
        hd, kv = self.head_width, self.n_kv_heads or self.n_head
        attn = 2 * c * self.n_head * hd + 2 * c * kv * hd  # W_Q and W_O; W_K and W_V (GQA)
        ffn = (3 if self.ffn == "gated" else 2) * c * ff  # a gated FFN has gate, up and down
        n = self.n_layer * (attn + ffn) + self.vocab_size * c
        n += self.block_size * c if self.pos == "learned" else 0
        return n + (0 if self.tie_weights else self.vocab_size * c)


PRESETS: dict[str, dict] = {
    "baby": dict(n_layer=4, n_head=4, d_model=128, block_size=64),  # nanoGPT's CPU config
    # baby's sizes with rotary positions and a feed-forward of 2x, not 4x, d_model, trained
    # hotter and shorter by the LM task's recipe (attnlab.tasks.lm.PRESET_TRAINING): the
    # quickest way found to val 1.88 on tiny Shakespeare
    "fast": dict(n_layer=4, n_head=4, d_model=128, block_size=64, pos="rotary", d_ff=256),
    # baby's sizes built with the GPU speedrun's pieces (rotary, RMSNorm, QK-norm, ReLU^2, no
    # biases, an untied head, zero-initialised output projections), trained by its recipe
    # (attnlab.tasks.lm.PRESET_TRAINING: Muon, the wsd schedule): the quickest way found to
    # nanoGPT's val loss on a CPU (docs/speedrun.md)
    "speedrun": dict(
        n_layer=4,
        n_head=4,
        d_model=128,
        block_size=64,
        pos="rotary",
        norm="rms",
        qk_norm=True,
        activation="relu2",
        bias=False,
        tie_weights=False,
        zero_init=True,
    ),  # fmt: skip
    "small": dict(n_layer=6, n_head=6, d_model=384, block_size=256),
    # a word-level toy (--data sentences --tokenizer word): a sentence is a handful of tokens,
    # so its attention is the notes' N x N matrix of words; trained in about a minute on a CPU
    # by the LM task's recipe (attnlab.tasks.lm.PRESET_TRAINING)
    "toy": dict(n_layer=2, n_head=4, d_model=64, block_size=32),
    "gpt2": dict(n_layer=12, n_head=12, d_model=768, block_size=1024),
    # Elhage et al. (2021)'s two-layer attention-only transformer, with rotary positions (with
    # learned ones the induction task finds a positional shortcut: see attnlab.tasks.induction)
    "attn-only-2l": dict(
        n_layer=2, n_head=2, d_model=64, block_size=64, mlp=False, pos="rotary", tie_weights=False
    ),
}


def _decoder_blocks(c: GPTConfig) -> nn.ModuleList:
    """The n_layer causal Blocks a GPTConfig describes, each with its rotary module (shared by
    the layers of one base) and its window."""
    hd = c.head_width
    rotary = {}
    if c.pos == "rotary" and c.rotary == "pairs":
        rotary = {"full": Rotary(hd, c.block_size, c.rope_base)}
    elif c.pos == "rotary":
        scaling = RopeScaling(**c.rope_scaling) if c.rope_scaling else None
        rotary = {"full": RotaryHalf(hd, c.block_size, c.rope_base, c.rot_dim, scaling)}
        if c.local_rope_base is not None:  # Gemma 3: sliding layers turn at their own base
            rotary["sliding"] = RotaryHalf(hd, c.block_size, c.local_rope_base, c.rot_dim)
    blocks = []
    for i in range(c.n_layer):
        window = c.window_of(i)
        attn = dict(n_kv_heads=c.n_kv_heads, qkv_bias=c.qkv_bias, out_bias=c.out_bias,
                    qk_norm=(c.norm if c.norm in ("rms", "rms-gemma") else "rms") if c.qk_norm else None,
                    qk_norm_eps=c.ln_eps,
                    scale=c.attn_scale, softcap=c.attn_softcap, window=window,
                    weighting=c.attention)  # fmt: skip
        if c.head_dim is not None:
            attn.update(d_k=c.head_dim, d_v=c.head_dim)
        rot = rotary.get("sliding" if window else "full", rotary.get("full"))
        blocks.append(Block(c.d_model, c.n_head, c.d_ff, c.dropout, causal=True,
                            norm_first=c.norm_first, activation=c.activation, ln_eps=c.ln_eps,
                            bias=c.bias, rotary=rot, mlp=c.mlp, norm=c.norm, ffn=c.ffn,
                            layout=c.block_layout, attn_options=attn))  # fmt: skip
    return nn.ModuleList(blocks)


# Architectures a GPTConfig can take: the fields each sets over the size preset. ``llama``:
# Llama's shape (RMSNorm, SwiGLU, rotate-half rotary, K/V heads shared by pairs of query heads,
# no biases, an untied head, a feed-forward of ~8/3 the width instead of 4x).
ARCHS: dict[str, dict] = {
    "gpt": {},
    "llama": dict(
        norm="rms",
        ffn="gated",
        activation="silu",
        pos="rotary",
        rotary="half",
        bias=False,
        tie_weights=False,
    ),  # fmt: skip
}
FFN_KINDS = {"mlp": ("mlp", None), "swiglu": ("gated", "silu"), "geglu": ("gated", "gelu_tanh")}


def arch_fields(arch: str, d_model: int, n_head: int) -> dict:
    """The GPTConfig fields ``arch`` sets for a model of this width and head count."""
    fields = dict(ARCHS[arch])
    if arch == "llama":
        fields["d_ff"] = -(-8 * d_model // 3 // 32) * 32  # 8/3 C, rounded up to 32
        fields["n_kv_heads"] = n_head // 2 if n_head % 2 == 0 else n_head
    return fields


@register
class GPT(ModelKind, nn.Module):
    """Decoder-only transformer. ``forward(ids)`` returns logits (B, T, vocab).

    Declares (``attnlab.models.declare``): one causal stack read from token ids; it predicts
    the next token at every position, through ``ln_f`` and ``lm_head``; it decodes."""

    config_class = GPTConfig
    model_type = "gpt"
    kv_cache = True
    examples = (  # fmt: skip
        dict(n_layer=2, n_head=2, d_model=16, block_size=32, dropout=0.0),
        dict(n_layer=2, n_head=2, d_model=16, block_size=32, dropout=0.0, mlp=False, pos="rotary"),
        # Llama's pieces; Gemma 2/3's (four norms, softcaps, windows by layer, QK-norm, MQA)
        dict(
            n_layer=2,
            n_head=4,
            d_model=16,
            block_size=32,
            dropout=0.0,
            norm="rms",
            ffn="gated",
            activation="silu",
            pos="rotary",
            rotary="half",
            n_kv_heads=2,
            bias=False,
            tie_weights=False,
        ),
        dict(
            n_layer=2,
            n_head=2,
            d_model=16,
            block_size=32,
            dropout=0.0,
            norm="rms-gemma",
            ffn="gated",
            activation="gelu_tanh",
            pos="rotary",
            rotary="half",
            n_kv_heads=1,
            head_dim=12,
            bias=False,
            qk_norm=True,
            post_norms=True,
            embed_scale=True,
            attn_softcap=5.0,
            final_softcap=3.0,
            sliding_window=3,
            layer_types=["sliding", "full"],
            local_rope_base=100.0,
        ),
        # GPT-NeoX's (Pythia): parallel attention and MLP, rotary on part of each head
        dict(
            n_layer=2,
            n_head=4,
            d_model=16,
            block_size=32,
            dropout=0.0,
            pos="rotary",
            rotary="half",
            rot_dim=2,
            parallel=True,
        ),
    )
    tied_weights_keys = ("lm_head.weight",)  # tied to tok_embed.weight when config.tie_weights
    causal = True  # output t depends on ids 0..t only (checked by `attnlab check`)
    uses_padding = False
    decoded_by = GPTDecoder  # the KV cache, window policies and FastForward (attnlab.decoding)

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = POSITIONAL[c.pos](c.block_size, c.d_model) if c.pos in POSITIONAL else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = _decoder_blocks(c)
        self.ln_f = (
            make_norm(c.norm, c.d_model, c.ln_eps, c.bias) if c.norm_first else nn.Identity()
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.tok_embed.weight
        self.hook_embed, self.hook_pos, self.hook_ln_f, self.hook_logits = (
            Hook(),
            Hook(),
            Hook(),
            Hook(),
        )
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("out_proj.weight", "fc2.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))
                if c.zero_init:  # the speedrun's: each block starts as the identity
                    nn.init.zeros_(p)
        if c.zero_init and not c.tie_weights:  # uniform first predictions (a tied head is
            nn.init.zeros_(self.lm_head.weight)  # the embedding, which must not be zero)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.pos_embed, nn.Module):
            n -= sum(p.numel() for p in self.pos_embed.parameters())
        return n

    def new_cache(
        self, batch: int, max_len: int | None = None, ring: bool = False, sinks: int = 0
    ) -> list[KVCache]:
        """One preallocated KV cache per layer, for incremental decoding (``ring``: a
        ``RingKVCache``, which keeps the last ``max_len`` positions; ``sinks``: a
        ``SinkKVCache``, which keeps the first ``sinks`` beside a ring of the last ones)."""
        c, p = self.config, next(self.parameters())
        max_len = max_len or c.block_size
        return [
            b.attn.new_cache(batch, max_len, ring, dtype=p.dtype, device=p.device, sinks=sinks)
            for b in self.blocks
        ]

    def forward(
        self,
        ids: Tensor,
        cache: list[KVCache] | None = None,
        record: bool = False,
        logits_to_keep: int = 0,
        attention_mask: Tensor | None = None,
    ):
        """ids (B, T) -> logits (B, T, vocab); with ``record=True``, (logits, activation cache).

        ``cache`` holds earlier positions' keys and values (see ``new_cache``); ``logits_to_keep``
        > 0 computes logits for the last that many positions only. ``attention_mask`` (B, S) is
        Hugging Face's padding mask over all S = cached + new positions, 1 = real token.
        """
        if record:
            with hooks.record(self) as acts:
                logits = self.forward(ids, cache=cache, logits_to_keep=logits_to_keep,
                                      attention_mask=attention_mask)  # fmt: skip
            return logits, acts
        x = self.final_stream(ids, cache, attention_mask)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.hook_logits(self.head(x))  # (B, T, vocab)

    def final_stream(
        self, ids: Tensor, cache: list[KVCache] | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        """ids (B, T) -> the last block's output after the final norm (B, T, C): what the LM
        head reads (``forward``'s arguments)."""
        B, T = ids.shape
        offset = cache[0].length if cache else 0
        if offset + T > self.config.block_size:
            raise ValueError(
                f"sequence of {offset + T} tokens exceeds block_size {self.config.block_size}"
            )
        x = self.tok_embed(ids)  # (B, T, C) one vector per token
        if self.config.embed_scale:  # Gemma: times sqrt(C), rounded to the activations' dtype
            x = x * torch.tensor(self.config.d_model**0.5, dtype=x.dtype)
        x = self.hook_embed(x)
        if self.pos_embed is not None:
            x = x + self.hook_pos(self.pos_embed(T, offset))  # (T, C) broadcast over the batch
        x = self.drop(x)
        mask = None if attention_mask is None else from_hf_attention_mask(attention_mask)
        for i, block in enumerate(self.blocks):
            x = block(x, mask=mask, cache=cache[i] if cache else None)
        return self.hook_ln_f(self.ln_f(x))

    def head(self, x: Tensor) -> Tensor:
        """The final stream (B, T, C) -> logits (B, T, vocab): the LM head, then the final
        softcap where there is one (Gemma 2: squashed into (-cap, cap))."""
        logits = self.lm_head(x)
        cap = self.config.final_softcap
        return logits if cap is None else softcap(logits, cap)

    def record_logits(self, args: tuple) -> LaterLogits:
        """The last position's logits now, the others when first read: at a recorded length
        the LM head over a large vocabulary is a quarter of the pass (64 tokens, 151,936
        entries), and what most readers of a recording ask is the next token. The whole
        (1, T, vocab) ends with the same last row, to the bit."""
        h = self.final_stream(*args)  # (1, T, C)
        last = self.head(h[:, -1:])  # (1, 1, vocab)
        return LaterLogits(last, lambda: torch.cat([self.head(h[:, :-1]), last], 1))

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        """A residual stream h (B, T, C) -> logits (B, T, vocab): the final norm, the LM head
        and the final softcap (the logit lens; on the last block's output, the model's logits)."""
        return self.head(self.ln_f(h))

    def dla_readout(self) -> list:
        """The head after ln_f: the LM head, its logits capped where final_softcap is set."""
        return [Unembed(self.lm_head.weight, softcap=self.config.final_softcap)]

    kind = "gpt"  # what predict, eval and the look-inside verbs call this model

    def describe(self) -> str:
        """What this model is, in one sentence (the look-inside verbs start with it)."""
        c = self.config
        pieces = "".join(f", {p}" for p in self._pieces())
        return (f"GPT: a causal decoder-only language model ({c.n_layer} layers, {c.n_head} "
                f"heads, width {c.d_model}, {c.pos} positions{pieces}); each token attends only "
                "to itself and the tokens before it, and the model predicts the next token")  # fmt: skip

    def _pieces(self) -> list[str]:
        """The modern-decoder options this GPT is built with, in words (none for a GPT-2)."""
        c, out = self.config, []
        if c.pos == "rotary" and c.rotary == "half":
            out.append("rotate-half rotary" + (f" on {c.rot_dim} channels" if c.rot_dim else ""))
        if c.norm != "layer":
            out.append({"rms": "RMSNorm", "rms-gemma": "RMSNorm times (1 + w)",
                        "none": "no norms"}[c.norm])  # fmt: skip
        if c.ffn == "gated":
            out.append(f"gated feed-forward ({c.activation})")
        elif c.mlp and c.activation == "relu2":
            out.append("ReLU^2 feed-forward")
        if c.n_kv_heads and c.n_kv_heads < c.n_head:
            out.append(
                f"{c.n_kv_heads} K/V heads shared by {c.n_head // c.n_kv_heads} query heads each"
            )
        if c.qk_norm:
            out.append("QK-norm")
        if c.attention != "softmax":
            out.append({"softmax1": "softmax with an extra zero logit",
                        "sigmoid": "sigmoid attention (no normalisation)"}[c.attention])  # fmt: skip
        if c.sliding_window:
            out.append(
                f"sliding window {c.sliding_window}" + (" on some layers" if c.layer_types else "")
            )
        if c.attn_softcap or c.final_softcap:
            out.append("softcapped " + " and ".join(
                n for n, v in (("scores", c.attn_softcap), ("logits", c.final_softcap)) if v))  # fmt: skip
        out += [n for n, on in (("parallel attention and MLP", c.parallel),
                                ("norms after each sublayer", c.post_norms),
                                (f"{c.layout} blocks", c.layout is not None),
                                ("embeddings times sqrt(width)", c.embed_scale)) if on]  # fmt: skip
        return out

    def loss(self, ids: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of predicting ``targets`` (B, T) from ``ids`` (B, T)."""
        logits = self(ids)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1
        )
