"""The encoder-decoder Transformer of "Attention is all you need" (Vaswani et al., 2017).

    src ids (B, S) -> embed * sqrt(C) + sinusoidal positions -> encoder blocks
                   (self-attention over the source, padding masked)            -> memory (B, S, C)
    tgt ids (B, T) -> embed * sqrt(C) + positions -> decoder blocks
                   (masked self-attention, then cross-attention over memory)  -> logits (B, T, V)

The paper's choices are the defaults: post-norm blocks x = LN(x + Sublayer(x)) (``norm_first``
switches to pre-norm), ReLU feed-forward, sinusoidal positions, the output projection tied to
the decoder's embedding, label smoothing 0.1, and optionally one embedding matrix shared by
source, target and output (``share_embeddings``, for a joint vocabulary). Its learning-rate
schedule is ``noam_lr``.

Token ids 0, 1, 2 are <pad>, <bos>, <eos> on both sides (see ``attnlab.tokenizers.PairTokenizer``).
Recorded names: ``encoder.blocks.{i}.attn.weights`` (B, H, S, S),
``decoder.blocks.{i}.attn.weights`` (B, H, T, T), ``decoder.blocks.{i}.cross.weights``
(B, H, T, S), and every other block hook.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.attention import KVCache, StaticKV, padding_mask
from attnlab.blocks import ACTIVATIONS, Block, block_parameters
from attnlab.checks import DecoderProbes
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.models.declare import EncoderDecoder, InputError, SourceDecoder, Unembed, register
from attnlab.positional import POSITIONAL
from attnlab.tokenizers import EOS, PAD


@dataclasses.dataclass
class Seq2SeqConfig(BaseConfig):
    src_vocab_size: int = 64
    tgt_vocab_size: int = 64
    max_len: int = 256  # longest source or target, in tokens (incl. <bos>/<eos>)
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    n_head: int = 4
    d_model: int = 128
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.1
    norm_first: bool = False  # the paper is post-norm
    activation: str = "relu"
    pos: str = "sinusoidal"
    tie_weights: bool = True  # output projection = decoder embedding (the paper)
    share_embeddings: bool = False  # one matrix for source, target and output (joint vocabulary)
    label_smoothing: float = 0.1

    def validate(self) -> None:
        self._positive("src_vocab_size", "tgt_vocab_size", "max_len", "n_head", "d_model")
        self._positive("n_encoder_layers", "n_decoder_layers")
        self._positive_or_none("d_ff")
        self._divisible("d_model", "n_head")
        if self.src_vocab_size <= EOS or self.tgt_vocab_size <= EOS:
            raise ConfigError("vocabularies need room for <pad>, <bos> and <eos> (ids 0-2)")
        self._one_of("activation", ACTIVATIONS)
        self._one_of("pos", POSITIONAL)
        self._fraction("dropout")
        self._fraction("label_smoothing")
        if self.share_embeddings:
            if self.src_vocab_size != self.tgt_vocab_size:
                raise ConfigError("share_embeddings needs src_vocab_size == tgt_vocab_size")
            if not self.tie_weights:
                raise ConfigError("share_embeddings ties all three matrices: it needs tie_weights")

    def estimate_parameters(self) -> int:
        """About how many parameters this encoder-decoder has, from its sizes alone: encoder
        blocks, decoder blocks (with cross-attention), both embeddings (one when shared),
        learned positions, and the output layer when it is not tied."""
        c = self.d_model
        ff = self.d_ff or 4 * c
        n = self.n_encoder_layers * block_parameters(c, ff)
        n += self.n_decoder_layers * block_parameters(c, ff, cross=True)
        n += (0 if self.share_embeddings else self.src_vocab_size) * c
        n += self.tgt_vocab_size * c + (2 * self.max_len * c if self.pos == "learned" else 0)
        return n + (0 if self.tie_weights else self.tgt_vocab_size * c)


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's schedule: lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Rises linearly for ``warmup`` steps, then decays as 1/sqrt(step); ``step`` counts from 1.
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


class DecoderCache:
    """Per decoder layer: a ``KVCache`` for masked self-attention and a ``StaticKV`` for the
    cross-attention keys/values, which are computed from the memory once, at the first step."""

    def __init__(self, self_kv: list[KVCache], cross_kv: list[StaticKV]):
        self.self_kv, self.cross_kv = self_kv, cross_kv

    @property
    def length(self) -> int:
        return self.self_kv[0].length

    def reorder(self, index: Tensor) -> None:
        for c in (*self.self_kv, *self.cross_kv):
            c.reorder(index)


class _Stack(nn.Module):
    """Token embedding * sqrt(C) + positions, then blocks (and a final LayerNorm if pre-norm)."""

    def __init__(self, c: Seq2SeqConfig, vocab: int, n_layer: int, decoder: bool):
        super().__init__()
        self.scale = math.sqrt(c.d_model)
        self.tok_embed = nn.Embedding(vocab, c.d_model)
        self.pos_embed = POSITIONAL[c.pos](c.max_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(c.d_model, c.n_head, c.d_ff, c.dropout, causal=decoder, cross_attention=decoder,
                  norm_first=c.norm_first, activation=c.activation)
            for _ in range(n_layer)
        )  # fmt: skip
        self.ln_f = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.hook_embed, self.hook_out = Hook(), Hook()
        self.hook_token, self.hook_pos = Hook(), Hook()

    def embed(self, ids: Tensor, offset: int = 0) -> Tensor:
        T = ids.size(1)
        tok = self.hook_token(self.tok_embed(ids) * self.scale)  # (B, T, C)
        x = tok + self.hook_pos(self.pos_embed(T, offset))  # (T, C) broadcast over the batch
        return self.drop(self.hook_embed(x))


class Seq2SeqDecoder(SourceDecoder):
    """Decodes the encoder-decoder Transformer: ``start`` encodes the source once and makes a
    cache for the decoder's steps; each step runs the decoder on the new tokens only."""

    def start(self, src: Tensor, max_len: int, window: str = "slide",
              use_cache: bool = True) -> dict:  # fmt: skip
        """Decoding state for ``src`` (B, S): memory, mask and an empty cache for max_len steps."""
        self.check_window(window, use_cache)
        memory, src_mask = self.model.encode(src)
        return {
            "memory": memory,
            "src_mask": src_mask,
            "cache": self.model.new_cache(src.size(0), max_len),
        }

    def step(self, state: dict, tokens: Tensor) -> Tensor:
        """Feed tokens (B,) (or (B, T)) -> log-probabilities of the next (B, V); updates the
        cache."""
        tokens = tokens.reshape(tokens.size(0), -1)  # (B, T)
        logits = self.model.decode(tokens, state["memory"], state["src_mask"], state["cache"])
        return torch.log_softmax(logits[:, -1].float(), dim=-1)

    def reorder(self, state: dict, index: Tensor) -> None:
        state["memory"] = state["memory"].index_select(0, index)
        state["src_mask"] = state["src_mask"].index_select(0, index)
        state["cache"].reorder(index)


@register
class Seq2SeqTransformer(DecoderProbes, EncoderDecoder, nn.Module):
    """Encoder-decoder Transformer. ``forward(src, tgt)`` gives logits (B, T, tgt_vocab)."""

    config_class = Seq2SeqConfig
    model_type = "seq2seq"

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = c = config
        self.encoder = _Stack(c, c.src_vocab_size, c.n_encoder_layers, decoder=False)
        self.decoder = _Stack(c, c.tgt_vocab_size, c.n_decoder_layers, decoder=True)
        self.decoder.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.decoder.hook_logits = Hook()
        self.apply(self._init_weights)
        if c.share_embeddings:
            self.decoder.tok_embed.weight = self.encoder.tok_embed.weight
        if c.tie_weights:
            self.decoder.lm_head.weight = self.decoder.tok_embed.weight

    @property
    def tied_weights_keys(self) -> tuple[str, ...]:
        """Copies not stored in a checkpoint (the constructor ties them again)."""
        keys = ("decoder.lm_head.weight",) if self.config.tie_weights else ()
        return keys + (("decoder.tok_embed.weight",) if self.config.share_embeddings else ())

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):  # * sqrt(C) in embed() brings rows to unit scale
            nn.init.normal_(m.weight, std=self.config.d_model**-0.5)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    kind = "seq2seq-transformer"

    def describe(self) -> str:
        """What this model is, in one sentence (the look-inside verbs start with it)."""
        c = self.config
        return (f"encoder-decoder Transformer ({c.n_encoder_layers} encoder + "
                f"{c.n_decoder_layers} decoder layers, {c.n_head} heads, width {c.d_model}): the "
                "encoder reads the source both ways; at each output step the decoder attends to "
                "the output so far (causal self-attention) and to every source token "
                "(cross-attention), then predicts the next output token")  # fmt: skip

    # -- the two halves --------------------------------------------------------------------

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, C) and the source key mask (B, 1, 1, S), True = token."""
        if src.size(1) > self.config.max_len:
            raise ValueError(
                f"source of {src.size(1)} tokens exceeds max_len {self.config.max_len}"
            )
        src_mask = padding_mask(ids=src, pad_id=PAD)  # (B, 1, 1, S)
        x = self.encoder.embed(src)
        for block in self.encoder.blocks:
            x = block(x, mask=src_mask)
        return self.encoder.hook_out(self.encoder.ln_f(x)), src_mask

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache | None = None
    ) -> Tensor:
        """tgt (B, T) decoder inputs (<bos> first) -> logits (B, T, V).

        With ``cache``, ``tgt`` holds only the new positions; earlier ones are in the cache.
        """
        offset = cache.length if cache is not None else 0
        if offset + tgt.size(1) > self.config.max_len:
            raise ValueError(f"target of {offset + tgt.size(1)} tokens exceeds max_len")
        x = self.decoder.embed(tgt, offset)  # (B, T, C)
        for i, block in enumerate(self.decoder.blocks):
            kv, cross = (cache.self_kv[i], cache.cross_kv[i]) if cache is not None else (None, None)
            x = block(x, memory=memory, memory_mask=src_mask, cache=kv, cross_cache=cross)
        x = self.decoder.hook_out(self.decoder.ln_f(x))
        return self.decoder.hook_logits(self.decoder.lm_head(x))  # (B, T, V)

    def forward(self, src: Tensor, tgt: Tensor, record: bool = False):
        """Teacher-forced pass: src (B, S), tgt (B, T) -> logits (B, T, V).

        With ``record=True`` returns ``(logits, ActivationCache)``.
        """
        if record:
            with hooks.record(self) as acts:
                logits = self.forward(src, tgt)
            return logits, acts
        memory, src_mask = self.encode(src)
        return self.decode(tgt, memory, src_mask)

    def loss(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, smoothing: float | None = None):
        """Label-smoothed cross-entropy of ``tgt_out`` (B, T), <pad> positions ignored."""
        eps = self.config.label_smoothing if smoothing is None else smoothing
        logits = self(src, tgt_in)
        flat = logits.reshape(-1, logits.size(-1)).float()
        return F.cross_entropy(flat, tgt_out.reshape(-1), ignore_index=PAD, label_smoothing=eps)

    # -- incremental decoding: its decoder (Seq2SeqDecoder) keeps a cache of it -------------

    def new_cache(self, batch: int, max_len: int | None = None) -> DecoderCache:
        c, p = self.config, next(self.parameters())
        hd, max_len = c.d_model // c.n_head, max_len or c.max_len
        self_kv = [KVCache(batch, max_len, c.n_head, hd, hd, dtype=p.dtype, device=p.device)
                   for _ in self.decoder.blocks]  # fmt: skip
        return DecoderCache(self_kv, [StaticKV() for _ in self.decoder.blocks])

    # -- the declaration (attnlab.models.declare; the rest is EncoderDecoder's) ----------------

    decoded_by = Seq2SeqDecoder
    gradient_note = "baseline: the source positions without their tokens"
    examples = (dict(max_len=32, n_encoder_layers=2, n_decoder_layers=2, n_head=2, d_model=16,
                     dropout=0.0),)  # fmt: skip
    hook_points = {
        "{stack}.token": "token embeddings * sqrt(C) (B, T, C)",
        "{stack}.pos": "sinusoidal positions (T, C)",
        "encoder.embed": "source token embeddings * sqrt(C) + positions (B, S, C)",
        "encoder.blocks.{i}.attn.weights": "source self-attention (B, H, S, S)",
        "decoder.embed": "target token embeddings * sqrt(C) + positions (B, T, C)",
        "decoder.blocks.{i}.attn.weights": "causal decoder self-attention (B, H, T, T)",
        "decoder.blocks.{i}.cross.weights": "decoder queries over the source (B, H, T, S)",
        "{stack}.blocks.{i}.resid_pre|resid_mid|resid_cross|resid_post": "residual stream",
        "decoder.logits": "logits of each decoder step (B, T, V)",
    }

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        if (stack or "decoder") != "decoder":
            raise InputError("only the decoder's residual stream reaches the logits")
        return self.decoder.lm_head(self.decoder.ln_f(h))

    def dla_embeddings(self, cache, position: int) -> list[tuple[str, Tensor]]:
        return [("decoder.embed", cache["decoder.embed"][0, position])]  # token + position

    def dla_readout(self) -> list:
        return [Unembed(self.decoder.lm_head.weight)]

    def gradient_baseline(self, x: Tensor) -> Tensor:
        """The source positions without their tokens (``encoder.embed`` includes them)."""
        return self.encoder.pos_embed(x.size(1), 0)[None].expand_as(x).to(x)  # (1, S, C)
