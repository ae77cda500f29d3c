"""GPT: a decoder-only language model trained on next-token prediction.

ids (B, T) -> token embedding (B, T, C) + positions -> n_layer causal blocks
           -> final LayerNorm -> LM head tied to the embedding -> logits (B, T, vocab)

``GPTConfig(mlp=False)`` (the ``attn-only-2l`` preset) makes every block attention-only. This module is the
architecture; decoding it (the KV cache, the window policies past block_size, FastForward) is
``attnlab.decoding.GPTDecoder``, which ``GPT.decoded_by`` names.
"""

from __future__ import annotations

import dataclasses
import math

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.attention import KVCache, RingKVCache, from_hf_attention_mask
from attnlab.blocks import ACTIVATIONS, block_parameters, block_stack
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.models.declare import ModelKind, register
from attnlab.positional import POSITIONAL, Rotary

POSITIONS = ("learned", "sinusoidal", "rotary")


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

    def validate(self) -> None:
        self._positive("vocab_size", "block_size", "n_layer", "n_head", "d_model")
        self._positive_or_none("d_ff")
        self._divisible("d_model", "n_head")
        self._one_of("pos", POSITIONS)
        if self.pos == "rotary" and (self.d_model // self.n_head) % 2:
            raise ConfigError("rotary positions need an even head width (d_model / n_head)")
        self._one_of("activation", ACTIVATIONS)
        self._fraction("dropout")
        self._positive("ln_eps")

    def estimate_parameters(self) -> int:
        """About how many parameters a GPT of this config has, from its sizes alone (building
        100,000 layers takes minutes even on the meta device): the blocks, the token and
        learned position embeddings, and the output layer when it is not tied."""
        c = self.d_model
        ff = (self.d_ff or 4 * c) if self.mlp else 0
        n = self.n_layer * block_parameters(c, ff) + self.vocab_size * c
        n += self.block_size * c if self.pos == "learned" else 0
        return n + (0 if self.tie_weights else self.vocab_size * c)


PRESETS: dict[str, dict] = {
    "baby": dict(n_layer=4, n_head=4, d_model=128, block_size=64),  # nanoGPT's CPU config
    # baby's sizes with rotary positions and a feed-forward of 2x, not 4x, d_model, trained
    # hotter and shorter by the LM task's recipe (attnlab.tasks.lm.PRESET_TRAINING): the
    # quickest way found to val 1.88 on tiny Shakespeare
    "fast": dict(n_layer=4, n_head=4, d_model=128, block_size=64, pos="rotary", d_ff=256),
    "small": dict(n_layer=6, n_head=6, d_model=384, block_size=256),
    "gpt2": dict(n_layer=12, n_head=12, d_model=768, block_size=1024),
    # Elhage et al. (2021)'s two-layer attention-only transformer, with rotary positions (with
    # learned ones the induction task finds a positional shortcut: see attnlab.tasks.induction)
    "attn-only-2l": dict(
        n_layer=2, n_head=2, d_model=64, block_size=64, mlp=False, pos="rotary", tie_weights=False
    ),
}


@register
class GPT(ModelKind, nn.Module):
    """Decoder-only transformer. ``forward(ids)`` returns logits (B, T, vocab).

    Declares (``attnlab.models.declare``): one causal stack read from token ids; it predicts
    the next token at every position, through ``ln_f`` and ``lm_head``; it decodes."""

    config_class = GPTConfig
    model_type = "gpt"
    decodes = kv_cache = True
    examples = (
        dict(n_layer=2, n_head=2, d_model=16, block_size=32, dropout=0.0),
        dict(n_layer=2, n_head=2, d_model=16, block_size=32, dropout=0.0, mlp=False, pos="rotary"),
    )
    tied_weights_keys = ("lm_head.weight",)  # tied to tok_embed.weight when config.tie_weights
    causal = True  # output t depends on ids 0..t only (checked by `attnlab check`)
    uses_padding = False
    decoded_by = "gpt"  # attnlab.decoding.GPTDecoder: the KV cache, window policies, FastForward

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        head_dim = c.d_model // c.n_head
        rotary = Rotary(head_dim, c.block_size) if c.pos == "rotary" else None
        self.pos_embed = POSITIONAL[c.pos](c.block_size, c.d_model) if c.pos in POSITIONAL else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = block_stack(c, causal=True, rotary=rotary)
        self.ln_f = (
            nn.LayerNorm(c.d_model, eps=c.ln_eps, bias=c.bias) if c.norm_first else nn.Identity()
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
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

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
        self, batch: int, max_len: int | None = None, ring: bool = False
    ) -> list[KVCache]:
        """One preallocated KV cache per layer, for incremental decoding (``ring``: a
        ``RingKVCache``, which keeps the last ``max_len`` positions)."""
        c, p = self.config, next(self.parameters())
        max_len = max_len or c.block_size
        hd = c.d_model // c.n_head
        kind = RingKVCache if ring else KVCache
        return [
            kind(batch, max_len, c.n_head, hd, hd, dtype=p.dtype, device=p.device)
            for _ in self.blocks
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
        B, T = ids.shape
        offset = cache[0].length if cache else 0
        if offset + T > self.config.block_size:
            raise ValueError(
                f"sequence of {offset + T} tokens exceeds block_size {self.config.block_size}"
            )
        x = self.hook_embed(self.tok_embed(ids))  # (B, T, C) one vector per token
        if self.pos_embed is not None:
            x = x + self.hook_pos(self.pos_embed(T, offset))  # (T, C) broadcast over the batch
        x = self.drop(x)
        mask = None if attention_mask is None else from_hf_attention_mask(attention_mask)
        for i, block in enumerate(self.blocks):
            x = block(x, mask=mask, cache=cache[i] if cache else None)
        x = self.hook_ln_f(self.ln_f(x))
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.hook_logits(self.lm_head(x))  # (B, T, vocab)

    kind = "gpt"  # what predict, eval and the look-inside verbs call this model

    def describe(self) -> str:
        """What this model is, in one sentence (the look-inside verbs start with it)."""
        c = self.config
        return (f"GPT: a causal decoder-only language model ({c.n_layer} layers, {c.n_head} "
                f"heads, width {c.d_model}, {c.pos} positions); each token attends only to itself "
                "and the tokens before it, and the model predicts the next token")  # fmt: skip

    def loss(self, ids: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of predicting ``targets`` (B, T) from ``ids`` (B, T)."""
        logits = self(ids)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1
        )
