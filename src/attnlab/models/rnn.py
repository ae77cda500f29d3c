"""LSTM encoder-decoder, without attention (Sutskever et al., 2014) and with it (Luong et al.).

Without attention the encoder's final (h, c) is the decoder's initial state and the ONLY thing
the decoder knows about the source: one fixed-size context vector, however long the input.

With attention every decoder step t also looks at every encoder output s:
    e_ts = score(h_t, s)         dot:      h_t . s
                                 scaled-dot: h_t . s / sqrt(C)               (Vaswani's scale)
                                 general:  h_t . (W_a s)                       (Luong)
                                 additive: v . tanh(W_q h_t + W_k s)           (Bahdanau)
    a_t  = softmax_s(e_t)        weights over the source, 0 on padding, sum to 1
    c_t  = sum_s a_ts s          context vector
    h~_t = tanh(W_c [c_t; h_t])  the attentional state that predicts the next token
The score uses the current decoder state h_t (Luong's order); the decoder is fed only the
previous target token (teacher forcing in training), so a whole target runs in one LSTM call.
``attend_eos=False`` keeps the attention off the source's <eos> state (the encoder still reads
<eos>): the weights fall on the source's words only, as in the notes' picture, whose source
has no <eos>. With a plain dot score the last state, which has read the whole source, takes
all the weight (1.00 on <eos> for "let's go" on the phrase book); scaled and off <eos>, the
weights split over the words (docs/interpretability.md, "The notes, by hand").

Recorded (``attnlab.hooks``): ``decoder.attn.scores`` and ``decoder.attn.weights``, shaped
(B, 1, T, S) like a one-head attention layer; ``decoder.attn.z`` (B, 1, T, C), the context
vectors c_t (a head's output, as in multi-head attention); ``encoder.embed`` (B, S, E) the
source token embeddings; ``encoder.out`` (B, S, C); ``decoder.hidden`` (B, T, C);
``decoder.logits``. Token ids 0, 1, 2 are <pad>, <bos>, <eos>.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab import hooks
from attnlab.attention import padding_mask
from attnlab.checks import DecoderProbes
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.models.declare import EncoderDecoder, HeadGroup, InputError, SourceDecoder, register
from attnlab.tokenizers import EOS, PAD

ATTENTION = ("none", "dot", "scaled-dot", "general", "additive")
SCORE_FORMULAS = {  # e_ts, the score of encoder output s for the decoder state h_t
    "dot": "e_ts = h_t . s",
    "scaled-dot": "e_ts = h_t . s / sqrt(C)",
    "general": "e_ts = h_t . (W_a s)",
    "additive": "e_ts = v . tanh(W_q h_t + W_k s)",
}


@dataclasses.dataclass
class RNNConfig(BaseConfig):
    src_vocab_size: int = 64
    tgt_vocab_size: int = 64
    d_embed: int = 64
    d_hidden: int = 128
    n_layer: int = 1
    attention: str = "dot"  # none | dot (the notes' similarity) | scaled-dot | general | additive
    attend_eos: bool = True  # False: the attention reads the source's words, not its <eos>
    dropout: float = 0.0
    label_smoothing: float = 0.0

    def validate(self) -> None:
        self._positive("src_vocab_size", "tgt_vocab_size", "d_embed", "d_hidden", "n_layer")
        if self.src_vocab_size <= EOS or self.tgt_vocab_size <= EOS:
            raise ConfigError("vocabularies need room for <pad>, <bos> and <eos> (ids 0-2)")
        self._one_of("attention", ATTENTION)
        self._fraction("dropout")
        self._fraction("label_smoothing")
        if not self.attend_eos and self.attention == "none":
            raise ConfigError("attend_eos=False keeps the attention off <eos>: an LSTM without "
                              "attention has none")  # fmt: skip

    def estimate_parameters(self) -> int:
        """About how many parameters this LSTM encoder-decoder has, from its sizes alone:
        4 h (e + h) per LSTM layer (the first reads the embedding e, the rest h), both
        embeddings, the attention's combination layer and the output layer."""
        h, e, n = self.d_hidden, self.d_embed, self.n_layer
        lstm = 4 * h * (e + h) + (n - 1) * 4 * h * (2 * h)
        embed = (self.src_vocab_size + self.tgt_vocab_size) * e
        return 2 * lstm + embed + 2 * h * h + (h + 1) * self.tgt_vocab_size


class SourceAttention(nn.Module):
    """One-head attention of decoder states (B, T, C) over encoder outputs (B, S, C)."""

    def __init__(self, d: int, score: str):
        super().__init__()
        self.score = score
        if score == "general":
            self.w_a = nn.Linear(d, d, bias=False)
        elif score == "additive":
            self.w_q = nn.Linear(d, d, bias=False)
            self.w_k = nn.Linear(d, d, bias=True)
            self.v = nn.Linear(d, 1, bias=False)
        self.hook_scores, self.hook_weights, self.hook_z = Hook(), Hook(), Hook()

    def forward(self, h: Tensor, enc: Tensor, mask: Tensor) -> Tensor:
        """h (B, T, C), enc (B, S, C), mask (B, 1, 1, S) True = token -> context (B, T, C)."""
        if self.score == "dot":
            scores = h @ enc.transpose(1, 2)  # (B, T, S)
        elif self.score == "scaled-dot":  # divided by sqrt(C), as a Transformer's scores are
            scores = h @ enc.transpose(1, 2) / h.size(-1) ** 0.5  # (B, T, S)
        elif self.score == "general":
            scores = h @ self.w_a(enc).transpose(1, 2)  # (B, T, S)
        else:
            hidden = torch.tanh(self.w_q(h)[:, :, None] + self.w_k(enc)[:, None])  # (B, T, S, C)
            scores = self.v(hidden).squeeze(-1)  # (B, T, S)
        scores = self.hook_scores(scores[:, None])  # (B, 1, T, S): one head
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # no weight on padding
        weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)  # (B, 1, T, S)
        weights = self.hook_weights(weights)
        z = self.hook_z(weights @ enc[:, None])  # (B, 1, T, C): the context vectors, one head
        return z.squeeze(1)  # (B, T, C)


class _Encoder(nn.Module):
    def __init__(self, c: RNNConfig):
        super().__init__()
        self.tok_embed = nn.Embedding(c.src_vocab_size, c.d_embed, padding_idx=PAD)
        drop = c.dropout if c.n_layer > 1 else 0.0
        self.lstm = nn.LSTM(c.d_embed, c.d_hidden, c.n_layer, batch_first=True, dropout=drop)
        self.drop = nn.Dropout(c.dropout)
        self.hook_embed, self.hook_out = Hook(), Hook()


class _Decoder(nn.Module):
    def __init__(self, c: RNNConfig):
        super().__init__()
        self.tok_embed = nn.Embedding(c.tgt_vocab_size, c.d_embed, padding_idx=PAD)
        drop = c.dropout if c.n_layer > 1 else 0.0
        self.lstm = nn.LSTM(c.d_embed, c.d_hidden, c.n_layer, batch_first=True, dropout=drop)
        self.drop = nn.Dropout(c.dropout)
        if c.attention != "none":
            self.attn = SourceAttention(c.d_hidden, c.attention)
            self.combine = nn.Linear(2 * c.d_hidden, c.d_hidden, bias=False)  # W_c [c_t; h_t]
        self.lm_head = nn.Linear(c.d_hidden, c.tgt_vocab_size)
        self.hook_hidden, self.hook_logits = Hook(), Hook()


def _lstm(lstm: nn.LSTM, x: Tensor, state: tuple[Tensor, Tensor]):
    """``lstm(x, state)``; under CPU autocast in float32, because oneDNN has no bfloat16 kernel
    for an unpacked LSTM ("could not create a primitive descriptor", torch 2.13)."""
    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return lstm(x.float(), tuple(s.float() for s in state))
    return lstm(x, state)


class LSTMDecoder(SourceDecoder):
    """Decodes the LSTM encoder-decoder: ``start`` encodes the source (its outputs and final
    (h, c)); each step runs the decoder LSTM on from the state it left."""

    def start(self, src: Tensor, max_len: int, window: str = "slide",
              use_cache: bool = True) -> dict:  # fmt: skip
        """Decoding state for ``src`` (B, S): the encoder's outputs and final (h, c) (an LSTM
        needs no room for ``max_len`` steps)."""
        self.check_window(window, use_cache)
        return self.model.encode(src)

    def step(self, state: dict, tokens: Tensor) -> Tensor:
        """Feed tokens (B,) (or (B, T)) -> log-probabilities of the next (B, V)."""
        logits = self.model.decode(tokens.reshape(tokens.size(0), -1), state)
        return torch.log_softmax(logits[:, -1].float(), dim=-1)

    def reorder(self, state: dict, index: Tensor) -> None:
        for k in ("enc", "src_mask"):
            state[k] = state[k].index_select(0, index)
        for k in ("h", "c"):
            state[k] = state[k].index_select(1, index)  # (L, B, C)


@register
class RNNSeq2Seq(DecoderProbes, EncoderDecoder, nn.Module):
    """LSTM encoder-decoder; ``config.attention`` picks none, dot, general or additive."""

    config_class = RNNConfig
    model_type = "rnn"

    def __init__(self, config: RNNConfig):
        super().__init__()
        self.config = config
        self.encoder = _Encoder(config)
        self.decoder = _Decoder(config)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def kind(self) -> str:
        return "lstm" if self.config.attention == "none" else "lstm-attention"

    def describe(self) -> str:
        """What this model is, in one sentence (the look-inside verbs start with it)."""
        c, a = self.config, self.config.attention
        size = f"{c.n_layer} layer{'s' if c.n_layer > 1 else ''} of {c.d_hidden} units"
        if a == "none":
            return (f"LSTM encoder-decoder without attention ({size}): the encoder's final "
                    "state (h, c) is the only thing the decoder knows about the source, one "
                    "fixed-size vector however long the input")  # fmt: skip
        which = (
            "every encoder output s" if c.attend_eos else "each source word's state s (not <eos>'s)"
        )
        return (f"LSTM encoder-decoder with {a} attention ({size}): at each output step t the "
                f"decoder state h_t scores {which} ({SCORE_FORMULAS[a]}), "
                "a_t = softmax_s(e_t) is its alignment over the source, and the context "
                "c_t = sum_s a_ts s joins h_t to predict the next output token")  # fmt: skip

    def encode(self, src: Tensor) -> dict:
        """src (B, S) -> encoder outputs (B, S, C), source mask (B, 1, 1, S) and final (h, c)."""
        lengths = (src != PAD).sum(1).clamp(min=1).cpu()
        x = self.encoder.drop(self.encoder.hook_embed(self.encoder.tok_embed(src)))  # (B, S, E)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = self.encoder.lstm(packed)  # h, c: (L, B, C) at each row's last token
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        out = self.encoder.hook_out(out)  # (B, S, C), zeros on padding
        mask = padding_mask(ids=src, pad_id=PAD)  # (B, 1, 1, S) True = a token
        if not self.config.attend_eos:
            mask = mask & (src != EOS)[:, None, None, :]  # the words only
        return {"enc": out, "src_mask": mask, "h": h, "c": c}

    def decode(self, tgt: Tensor, state: dict) -> Tensor:
        """tgt (B, T) from <bos> -> logits (B, T, V); advances state's (h, c) past ``tgt``."""
        d = self.decoder
        x = d.drop(d.tok_embed(tgt))  # (B, T, E)
        out, (state["h"], state["c"]) = _lstm(d.lstm, x, (state["h"], state["c"]))  # (B, T, C)
        if self.config.attention != "none":
            context = d.attn(out, state["enc"], state["src_mask"])  # (B, T, C)
            out = torch.tanh(d.combine(torch.cat([context, out], dim=-1)))  # (B, T, C)
        out = d.hook_hidden(d.drop(out))
        return d.hook_logits(d.lm_head(out))  # (B, T, V)

    def forward(self, src: Tensor, tgt: Tensor, record: bool = False):
        """Teacher-forced pass: src (B, S), tgt (B, T) -> logits (B, T, V) (and the recording)."""
        if record:
            with hooks.record(self) as acts:
                logits = self.forward(src, tgt)
            return logits, acts
        return self.decode(tgt, self.encode(src))

    def loss(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, smoothing: float | None = None):
        """Cross-entropy of ``tgt_out`` (B, T) (label-smoothed if configured), pads ignored."""
        eps = self.config.label_smoothing if smoothing is None else smoothing
        logits = self(src, tgt_in)
        flat = logits.reshape(-1, logits.size(-1)).float()
        return F.cross_entropy(flat, tgt_out.reshape(-1), ignore_index=PAD, label_smoothing=eps)

    # -- the declaration (attnlab.models.declare; the rest is EncoderDecoder's) ----------------

    decoded_by = LSTMDecoder

    stacks = ()  # no transformer stacks: an LSTM's state is rewritten, not added to
    residual = False
    examples = (dict(d_embed=8, d_hidden=16, attention="dot"), dict(d_embed=8, d_hidden=16,
                                                                    attention="none"))  # fmt: skip
    hook_points = {
        "encoder.embed": "source token embeddings (B, S, E)",
        "encoder.out": "the encoder LSTM's outputs (B, S, C), zeros on padding",
        "decoder.attn.weights": "the alignment of each output step over the source (B, 1, T, S)",
        "decoder.attn.z": "the context vector of each output step (B, 1, T, C)",
        "decoder.hidden": "the decoder state that predicts each output (B, T, C)",
        "decoder.logits": "logits of each decoder step (B, T, V)",
    }

    def head_groups(self) -> list[HeadGroup]:
        if self.config.attention == "none":
            return []
        return [HeadGroup("context", 0, "decoder.attn", 1, "LSTM context vector")]

    def points(self, stack=None, sublayers: bool = False):
        raise InputError(
            "an LSTM has no residual stream (its state is rewritten at every step, not added to)"
        )

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        raise InputError("an LSTM has no residual stream to read logits from")
