"""T5 (Raffel et al., "Exploring the Limits of Transfer Learning", 2020): the encoder-decoder of
``seq2seq.py`` rebuilt from the pieces the T5 family uses instead of the paper's.

    src ids (B, S) -> shared embedding (no sqrt(C) scale, no position vectors) -> encoder blocks
                   (self-attention + relative position bias, bidirectional)   -> RMS norm: memory
    tgt ids (B, T) -> shared embedding -> decoder blocks (causal self-attention + causal
                   relative bias, cross-attention over memory, no bias)      -> RMS norm
                   -> (x d_model^-0.5 when the output is tied) -> LM head    -> logits (B, T, V)

What differs from the paper's Transformer, each a component of attnlab:
- pre-norm blocks whose norm is an RMSNorm (no mean, no bias; ``attnlab.norms``);
- no position vectors: a learned scalar per head and relative-position bucket is added to the
  self-attention scores (``attnlab.positional.RelativePositionBias``). Each stack computes it
  once, in its first layer, and every later layer of the stack reuses it;
- attention is unscaled: softmax(Q K^T + bias), with no 1/sqrt(d_k) (T5 folds it into the
  initialisation), and heads of width ``d_kv``, which need not be d_model / n_head;
- no biases in any linear layer; a ReLU feed-forward (T5) or a gated GELU one (T5 v1.1, flan:
  W_o (gelu(W_i0 x) * W_i1 x));
- one embedding matrix shared by encoder and decoder; the LM head is that matrix too (tied, the
  original T5, whose decoder output is scaled by d_model^-0.5 first) or a matrix of its own.

Ids follow the T5 vocabulary, not attnlab's pair tokenizers: 0 <pad>, 1 </s> (end), 2 <unk>;
decoding starts from <pad> (``decoder_start_id``). Recorded names are the seq2seq ones
(``encoder.blocks.{i}.attn.weights`` ...), plus ``encoder.position_bias`` and
``decoder.position_bias`` (1, H, T, S), the bias each stack's layers add to their scores.

This is a module of its own rather than options of ``Seq2SeqTransformer``: the embedding, the
positions, the ids and the output all differ, so the options would branch through every method
of that model; here the incremental decoding (start / step / reorder), the loss and the recording
are inherited, and only the two halves are written again.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from attnlab.attention import KVCache, StaticKV, padding_mask
from attnlab.blocks import ACTIVATIONS, Block
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.models.declare import InputError, Unembed, register, text_token_id
from attnlab.models.seq2seq import DecoderCache, Seq2SeqDecoder, Seq2SeqTransformer
from attnlab.norms import RMSNorm
from attnlab.positional import RelativePositionBias


@dataclasses.dataclass
class T5Config(BaseConfig):
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64  # width of one head (T5's heads need not split d_model evenly)
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    n_head: int = 8
    num_buckets: int = 32  # relative position buckets, half exact and half log-spaced
    max_distance: int = 128  # relative distances beyond this share the last bucket
    max_len: int = 512  # longest source or output attnlab will run (cache size); T5 has no limit
    dropout: float = 0.1
    ln_eps: float = 1e-6
    ffn: str = "mlp"  # "mlp" (T5) or "gated" (T5 v1.1 / flan)
    activation: str = "relu"  # relu (T5), gelu_new (gated-gelu)
    tie_weights: bool = True  # LM head = the shared embedding
    scale_output: bool = True  # decoder output x d_model^-0.5 before the LM head (original T5)
    label_smoothing: float = 0.0
    pad_id: int = 0
    eos_id: int = 1
    decoder_start_id: int = 0

    def validate(self) -> None:
        self._positive("vocab_size", "d_model", "d_kv", "d_ff", "n_head", "max_len")
        self._positive("n_encoder_layers", "n_decoder_layers", "num_buckets", "max_distance")
        self._one_of("ffn", ("mlp", "gated"))
        self._one_of("activation", ACTIVATIONS)
        self._fraction("dropout")
        self._fraction("label_smoothing")
        self._positive("ln_eps")
        for name in ("pad_id", "eos_id", "decoder_start_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ConfigError(f"{name} must be an id of the vocabulary (0 .. vocab_size - 1)")

    def estimate_parameters(self) -> int:
        """About how many parameters this T5 has, from its sizes alone (what a training run
        checks against memory before building it): each attention's four projections, each
        feed-forward's two (three when gated), the shared embedding and an untied head."""
        c, inner = self.d_model, self.n_head * self.d_kv
        attn = 4 * c * inner
        ffn = (3 if self.ffn == "gated" else 2) * c * self.d_ff
        n = self.n_encoder_layers * (attn + ffn) + self.n_decoder_layers * (2 * attn + ffn)
        return n + self.vocab_size * c * (1 if self.tie_weights else 2)

    # the names attnlab's encoder-decoder tools read (one vocabulary on both sides)
    @property
    def src_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.vocab_size


class _T5Stack(nn.Module):
    """One half of T5: the relative position bias, the blocks, and the final RMS norm."""

    def __init__(self, c: T5Config, n_layer: int, decoder: bool):
        super().__init__()
        self.pos_bias = RelativePositionBias(
            c.n_head, c.num_buckets, c.max_distance, bidirectional=not decoder
        )
        self.drop = nn.Dropout(c.dropout)
        attn = {"d_k": c.d_kv, "d_v": c.d_kv, "scale": 1.0}  # unscaled: softmax(Q K^T + bias)
        self.blocks = nn.ModuleList(
            Block(c.d_model, c.n_head, c.d_ff, c.dropout, causal=decoder, cross_attention=decoder,
                  norm_first=True, activation=c.activation, ln_eps=c.ln_eps, bias=False,
                  norm="rms", ffn=c.ffn, attn_options=attn)
            for _ in range(n_layer)
        )  # fmt: skip
        self.ln_f = RMSNorm(c.d_model, c.ln_eps)
        self.hook_embed, self.hook_position_bias, self.hook_out = Hook(), Hook(), Hook()

    def run(self, x: Tensor, mask: Tensor | None = None, offset: int = 0, **block_kw) -> Tensor:
        """x (B, T, C) embedded tokens -> (B, T, C); queries at positions offset .. offset+T-1."""
        T = x.size(1)
        bias = self.hook_position_bias(self.pos_bias(T, offset + T, offset))  # (1, H, T, S)
        x = self.drop(self.hook_embed(x))
        for i, block in enumerate(self.blocks):
            kw = {k: v[i] if isinstance(v, list) else v for k, v in block_kw.items()}
            x = block(x, mask=mask, position_bias=bias, **kw)  # the same bias in every layer
        return self.hook_out(self.drop(self.ln_f(x)))


class T5Decoder(Seq2SeqDecoder):
    """The Transformer's decoder with the ids of T5's vocabulary: it starts from
    ``decoder_start_id`` (<pad>), ends at ``eos_id`` (</s>) and may choose any id."""

    never_emit: tuple[int, ...] = ()  # T5's greedy decoding may choose any id

    @property
    def start_id(self) -> int:
        return self.model.config.decoder_start_id

    @property
    def end_id(self) -> int:
        return self.model.config.eos_id

    @property
    def pad_id(self) -> int:
        return self.model.config.pad_id


@register
class T5(Seq2SeqTransformer):
    """T5 encoder-decoder. ``forward(src, tgt)`` gives logits (B, T, vocab_size)."""

    config_class = T5Config
    model_type = "t5"
    kind = "t5"  # an encoder-decoder of its own shape (relative bias, RMS norms, one vocabulary)

    def __init__(self, config: T5Config):
        nn.Module.__init__(self)
        self.config = c = config
        self.shared = nn.Embedding(c.vocab_size, c.d_model)  # (V, C) both stacks' embedding
        self.encoder = _T5Stack(c, c.n_encoder_layers, decoder=False)
        self.decoder = _T5Stack(c, c.n_decoder_layers, decoder=True)
        self.decoder.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.decoder.hook_logits = Hook()
        self.output_scale = c.d_model**-0.5 if c.scale_output else 1.0
        self.apply(self._init_weights)
        if c.tie_weights:
            self.decoder.lm_head.weight = self.shared.weight

    @property
    def tied_weights_keys(self) -> tuple[str, ...]:
        return ("decoder.lm_head.weight",) if self.config.tie_weights else ()

    def _init_weights(self, m: nn.Module) -> None:
        """T5's initialisation: the attention scale folded in (q ~ (d_model d_kv)^-0.5)."""
        c = self.config
        if isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=1.0)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=m.in_features**-0.5)
        if isinstance(m, Block):
            nn.init.normal_(m.attn.q_proj.weight, std=(c.d_model * c.d_kv) ** -0.5)

    def describe(self) -> str:
        c = self.config
        ffn = "gated-GELU" if c.ffn == "gated" else c.activation
        return (f"T5 encoder-decoder ({c.n_encoder_layers} encoder + {c.n_decoder_layers} "
                f"decoder layers, {c.n_head} heads of width {c.d_kv}, model width {c.d_model}, "
                f"{ffn} feed-forward): the encoder reads the source both ways; at each output step "
                "the decoder attends to the output so far and to every source token; positions "
                "enter only as a learned bias on the attention scores per relative distance")  # fmt: skip

    # -- the two halves --------------------------------------------------------------------

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, C) and the source key mask (B, 1, 1, S), True = token."""
        if src.size(1) > self.config.max_len:
            raise ValueError(
                f"source of {src.size(1)} tokens exceeds max_len {self.config.max_len}"
            )
        src_mask = padding_mask(ids=src, pad_id=self.config.pad_id)  # (B, 1, 1, S)
        return self.encoder.run(self.shared(src), mask=src_mask), src_mask

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache | None = None
    ) -> Tensor:
        """tgt (B, T) decoder inputs (<pad> first: the start id) -> logits (B, T, V).

        With ``cache``, ``tgt`` holds only the new positions; earlier ones are in the cache."""
        offset = cache.length if cache is not None else 0
        if offset + tgt.size(1) > self.config.max_len:
            raise ValueError(f"target of {offset + tgt.size(1)} tokens exceeds max_len")
        kv = {"cache": cache.self_kv, "cross_cache": cache.cross_kv} if cache is not None else {}
        x = self.decoder.run(self.shared(tgt), offset=offset, memory=memory,
                             memory_mask=src_mask, **kv)  # fmt: skip
        x = x * self.output_scale  # tied output: x d_model^-0.5 (original T5), else 1
        return self.decoder.hook_logits(self.decoder.lm_head(x))  # (B, T, V)

    # -- the declaration (attnlab.models.declare; the rest is Seq2SeqTransformer's) ------------

    decoded_by = T5Decoder

    tokenizer_fields = (("vocab_size", "vocab_size", "tokenizer.json"),)  # one vocabulary
    gradient_note = "baseline: zero source embeddings (T5 has no position vectors)"
    examples = (dict(max_len=32, n_encoder_layers=2, n_decoder_layers=1, n_head=2, d_model=16,
                     d_kv=8, d_ff=24, num_buckets=8, max_distance=16, dropout=0.0),
                dict(max_len=32, n_encoder_layers=1, n_decoder_layers=2, n_head=2, d_model=16,
                     d_kv=6, d_ff=24, num_buckets=8, max_distance=16, dropout=0.0, ffn="gated",
                     activation="gelu_new", tie_weights=False, scale_output=False))  # fmt: skip
    hook_points = {
        "encoder.embed": "source token embeddings, the shared matrix, unscaled (B, S, C)",
        "encoder.position_bias": "the encoder's relative position bias, every layer (1, H, S, S)",
        "encoder.blocks.{i}.attn.weights": "source self-attention (B, H, S, S)",
        "decoder.embed": "decoder input embeddings, the shared matrix (B, T, C)",
        "decoder.position_bias": "the decoder's causal relative position bias (1, H, T, T)",
        "decoder.blocks.{i}.attn.weights": "causal decoder self-attention (B, H, T, T)",
        "decoder.blocks.{i}.cross.weights": "decoder queries over the source (B, H, T, S)",
        "{stack}.blocks.{i}.resid_pre|resid_mid|resid_cross|resid_post": "residual stream",
        "decoder.logits": "logits of each decoder step (B, T, V)",
    }

    @classmethod
    def example_tokenizer(cls, text: str):
        """T5's shape of tokenizer over the characters of ``text``: <pad> 0, </s> 1, <unk> 2,
        then one id per character, </s> appended to a source."""
        from tokenizers import Regex, decoders, models, pre_tokenizers, processors
        from tokenizers import Tokenizer as HFTok

        from attnlab.tokenizers import HFTokenizer, SharedPairTokenizer

        vocab = {t: i for i, t in enumerate(["<pad>", "</s>", "<unk>", *sorted(set(text))])}
        tok = HFTok(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                           special_tokens=[("</s>", 1)])  # fmt: skip
        tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
        return SharedPairTokenizer(HFTokenizer(tok))

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        if (stack or "decoder") != "decoder":
            raise InputError("only the decoder's residual stream reaches the logits")
        return self.decoder.lm_head(self.decoder.ln_f(h) * self.output_scale)

    def dla_readout(self) -> list:
        return [Unembed(self.decoder.lm_head.weight * self.output_scale)]  # the tied scale folded

    def gradient_baseline(self, x: Tensor) -> Tensor:
        return x.new_zeros(x.shape)

    def output_id(self, tokenizer, classes, token: str) -> int:
        """T5's ids are its tokenizer's own (no reserved ids in front)."""
        return text_token_id(getattr(tokenizer, "tok", tokenizer), token)

    def new_cache(self, batch: int, max_len: int | None = None) -> DecoderCache:
        c, p = self.config, next(self.parameters())
        max_len = max_len or c.max_len
        self_kv = [KVCache(batch, max_len, c.n_head, c.d_kv, c.d_kv, dtype=p.dtype,
                           device=p.device) for _ in self.decoder.blocks]  # fmt: skip
        return DecoderCache(self_kv, [StaticKV() for _ in self.decoder.blocks])
