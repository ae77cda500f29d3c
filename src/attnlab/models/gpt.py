"""GPT: a decoder-only language model trained on next-token prediction.

ids (B, T) -> token embedding (B, T, C) + positions -> n_layer causal blocks
           -> final LayerNorm -> LM head tied to the embedding -> logits (B, T, vocab)
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.attention import KVCache, RingKVCache, from_hf_attention_mask
from attnlab.blocks import ACTIVATIONS, block_stack
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.positional import POSITIONAL, Rotary

POSITIONS = ("learned", "sinusoidal", "rotary")
WINDOWS = ("slide", "shift", "ring")  # what decoding does past block_size: see attnlab.generation


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


PRESETS: dict[str, dict] = {
    "baby": dict(n_layer=4, n_head=4, d_model=128, block_size=64),  # nanoGPT's CPU config
    "small": dict(n_layer=6, n_head=6, d_model=384, block_size=256),
    "gpt2": dict(n_layer=12, n_head=12, d_model=768, block_size=1024),
}


class GPT(nn.Module):
    """Decoder-only transformer. ``forward(ids)`` returns logits (B, T, vocab)."""

    config_class = GPTConfig
    model_type = "gpt"
    tied_weights_keys = ("lm_head.weight",)  # tied to tok_embed.weight when config.tie_weights
    causal = True  # output t depends on ids 0..t only (checked by `attnlab check`)
    uses_padding = False

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

    # -- incremental decoding: the protocol of attnlab.generation -----------------------------

    def start(
        self, prompt: Tensor, max_len: int, window: str = "slide", use_cache: bool = True
    ) -> DecodeState:
        """Decoding state for ``prompt`` (B, T0), for at most ``max_len`` steps.

        Nothing runs yet: the first ``step`` feeds the prompt's last token (B,) and, in the
        same pass, the rest of the prompt. ``window`` says what happens once the context
        outgrows block_size (slide, shift, ring: see ``attnlab.generation``); without
        ``use_cache`` every step recomputes its whole window.
        """
        c = self.config
        self.check_window(window, use_cache)
        B, T0 = prompt.shape
        if T0 == 0:
            raise ValueError("a GPT needs a prompt of at least one token")
        ids = prompt.new_zeros(B, T0 + max_len)  # (B, capacity) the prompt, then every token fed
        ids[:, : T0 - 1] = prompt[:, :-1]
        cache = None
        if use_cache:
            cache = self.new_cache(B, min(c.block_size, T0 + max_len), ring=window == "ring")
        return DecodeState(ids, T0 - 1, 0, window, cache)

    def check_window(self, window: str, use_cache: bool = True) -> None:
        """ValueError (one line) unless this model can decode with ``window``."""
        c = self.config
        if window not in WINDOWS:
            raise ValueError(f"unknown window {window!r}; choose from {', '.join(WINDOWS)}")
        if window == "ring" and c.pos != "rotary":
            raise ValueError(
                f"the ring window needs rotary positions; this model's are {c.pos}, which a "
                "kept token would have to change (use the slide or shift window)"
            )
        if window == "ring" and (not use_cache or c.block_size < 2):
            raise ValueError("the ring window is a KV-cache layout: it needs the cache and a "
                             "block_size of at least 2")  # fmt: skip

    def step(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Feed ``tokens`` (B,) (or (B, T)) -> log-probabilities of the next token (B, V)."""
        tokens = tokens.reshape(tokens.size(0), -1)  # (B, T)
        n = state.n + tokens.size(1)
        if n > state.ids.size(1):
            raise ValueError(f"fed {n} tokens; start() made room for {state.ids.size(1)}")
        state.ids[:, state.n : n] = tokens
        new = state.ids[:, state.fed : n]  # (B, T') everything not yet through the model
        state.n = state.fed = n
        block = self.config.block_size
        if state.window == "ring":
            logits = self._feed_ring(state.cache, new)
        else:
            start = window_start(n, block, state.window)
            window = state.ids[:, start:n]  # (B, <= block) the context of the next token
            if state.cache is None or (n > block and state.window == "slide"):
                logits = self(window, logits_to_keep=1)  # recompute the window
            elif start != state.start:  # shift: the window moved on; prefill it again
                for layer in state.cache:
                    layer.clear()
                logits = self(window, cache=state.cache, logits_to_keep=1)
            else:
                logits = self(new, cache=state.cache, logits_to_keep=1)
            state.start = start
        return torch.log_softmax(logits[:, -1].float(), dim=-1)

    def _feed_ring(self, cache: list[RingKVCache], new: Tensor) -> Tensor:
        """Feed (B, T) through a ring cache: as one pass while it has room, then one position
        at a time, moving every position down by half a block whenever the next one would
        leave the rotary table. Returns the logits of the last position (B, 1, V)."""
        block = self.config.block_size
        done = max(0, min(new.size(1), cache[0].max_len - cache[0].written))
        logits = self(new[:, :done], cache=cache, logits_to_keep=1) if done > 0 else None
        for t in range(done, new.size(1)):
            if cache[0].length == block:
                shift = self.blocks[0].attn.rotary.shift
                for layer in cache:
                    layer.rebase(block // 2, shift)
            logits = self(new[:, t : t + 1], cache=cache, logits_to_keep=1)
        return logits

    @staticmethod
    def reorder(state: DecodeState, index: Tensor) -> None:
        """Keep rows ``index`` of the batch (beam search)."""
        state.ids = state.ids.index_select(0, index)
        for layer in state.cache or ():
            layer.reorder(index)

    def record_text(self, tokenizer, text: str):
        """Record one forward pass over ``text``: an ``attnlab.inspect.Recording`` whose cache
        holds every named activation (blocks.N.attn.weights (1, H, T, T), ...)."""
        from attnlab.inspect.recording import record_text

        return record_text(self, tokenizer, text)

    def loss(self, ids: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of predicting ``targets`` (B, T) from ``ids`` (B, T)."""
        logits = self(ids)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1
        )


def window_start(n: int, block: int, window: str) -> int:
    """Where the context of the next token starts after ``n`` tokens: the last ``block`` tokens
    (slide), or the first multiple of half a block that leaves at most ``block`` (shift)."""
    over = max(0, n - block)
    if window == "shift":
        half = max(1, block // 2)
        return -(-over // half) * half
    return over


@dataclasses.dataclass
class DecodeState:
    """A GPT's decoding state: ``ids[:, :n]`` is the prompt and every token fed since, of
    which ``ids[:, :fed]`` went through the model. The cache (None without one) holds the keys
    and values of ``ids[:, start:fed]`` (slide within the block, shift), or of the last
    block_size positions (ring)."""

    ids: Tensor  # (B, capacity)
    n: int
    fed: int
    window: str
    cache: list[KVCache] | None
    start: int = 0
