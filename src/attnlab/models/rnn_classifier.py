"""LSTM classifier with additive attention: the model of Jain & Wallace (2019) and Wiegreffe &
Pinter (2019).

    ids (B, T) -> token embeddings e_t (B, T, E)
               -> states h_t (B, T, C): a BiLSTM (forward and backward states joined, C = 2 H),
                  a one-way LSTM, or (``encoder="mlp"``) h_t = tanh(W e_t), which sees no
                  context: Wiegreffe & Pinter's guided MLP
    e_t = v . tanh(W h_t + b)       additive (Bahdanau) score of each state, one per token
    a   = softmax_t(e)              attention over the tokens, 0 on padding, sums to 1
    c   = sum_t a_t h_t             the context vector: the text as one vector (B, C)
    logits = W_o c + b_o            (B, num_labels)

``attention="uniform"`` gives every real token the same weight, a_t = 1 / T (Wiegreffe &
Pinter's baseline trained with it). ``forward(..., weights=a)`` imposes given weights (B, T)
instead of the model's own: their frozen-attention diagnostic trains a model that way.

Recorded (``attnlab.hooks``): ``embed`` (B, T, E), ``states`` (B, T, C), ``attn.scores`` and
``attn.weights`` shaped (B, 1, 1, T) like one head whose one query is the text, ``attn.z``
(B, 1, 1, C) the context vector, ``class_logits`` (B, num_labels).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab import hooks
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.models.declare import (
    HeadGroup,
    InputError,
    ModelKind,
    Prepared,
    WalkStep,
    register,
)

ENCODERS = ("bilstm", "lstm", "mlp")
SCORES = ("additive", "uniform")


@dataclasses.dataclass
class LSTMClassifierConfig(BaseConfig):
    vocab_size: int = 512
    d_embed: int = 64
    d_hidden: int = 64  # per direction: a BiLSTM's states are 2 * d_hidden wide
    encoder: str = "bilstm"  # bilstm | lstm | mlp (no context: tanh(W e_t))
    attention: str = "additive"  # additive | uniform
    num_labels: int = 2
    block_size: int = 128  # most tokens read
    dropout: float = 0.0
    pad_id: int = 0

    def validate(self) -> None:
        self._positive("vocab_size", "d_embed", "d_hidden", "num_labels", "block_size")
        self._one_of("encoder", ENCODERS)
        self._one_of("attention", SCORES)
        self._fraction("dropout")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"pad_id {self.pad_id} is outside the vocabulary of "
                              f"{self.vocab_size}")  # fmt: skip

    @property
    def width(self) -> int:
        """C, the width of a state h_t."""
        return 2 * self.d_hidden if self.encoder == "bilstm" else self.d_hidden

    def estimate_parameters(self) -> int:
        """About how many parameters: the embedding, the encoder (4 H (E + H) + 8 H per LSTM
        direction; E H + H for the MLP), the attention (C C + 2 C) and the output layer."""
        e, h, c = self.d_embed, self.d_hidden, self.width
        directions = {"bilstm": 2, "lstm": 1, "mlp": 0}[self.encoder]
        enc = directions * (4 * h * (e + h) + 8 * h) if directions else e * h + h
        return self.vocab_size * e + enc + c * c + 2 * c + (c + 1) * self.num_labels


class AdditivePooling(nn.Module):
    """One additive-attention query over the states: a (B, T) = softmax(v . tanh(W h + b))."""

    def __init__(self, width: int, score: str):
        super().__init__()
        self.score = score
        self.w = nn.Linear(width, width)
        self.v = nn.Linear(width, 1, bias=False)
        self.hook_scores, self.hook_weights, self.hook_z = Hook(), Hook(), Hook()

    def forward(self, h: Tensor, mask: Tensor, imposed: Tensor | None = None) -> Tensor:
        """h (B, T, C), mask (B, T) True = a real token -> context (B, C)."""
        if self.score == "uniform":
            scores = torch.zeros(h.shape[:2], dtype=h.dtype, device=h.device)  # (B, T)
        else:
            scores = self.v(torch.tanh(self.w(h))).squeeze(-1)  # (B, T)
        scores = self.hook_scores(scores[:, None, None])  # (B, 1, 1, T): one head, one query
        keep = mask[:, None, None]
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1).masked_fill(~keep, 0.0)  # (B, 1, 1, T)
        if imposed is not None:  # weights from elsewhere (the frozen-attention diagnostic)
            weights = imposed.to(h.dtype)[:, None, None].masked_fill(~keep, 0.0)
        weights = self.hook_weights(weights)
        z = self.hook_z(weights @ h[:, None])  # (B, 1, 1, C): the context vector, one head
        return z[:, 0, 0]  # (B, C)


@register
class LSTMClassifier(ModelKind, nn.Module):
    """(Bi)LSTM encoder, one additive attention pooling its states, a linear classifier.
    ``forward(ids, attention_mask, head="classify", weights=None)`` -> class logits (B, K)."""

    config_class = LSTMClassifierConfig
    model_type = "lstm-classifier"
    kind = "lstm-classifier"
    predicts = "class"
    uses_padding = True
    stacks = ()  # no transformer stacks: an LSTM's state is rewritten, not added to
    residual = False
    examples = (dict(d_embed=8, d_hidden=8, num_labels=3, block_size=32),
                dict(d_embed=8, d_hidden=8, num_labels=2, block_size=32, encoder="mlp",
                     attention="uniform"))  # fmt: skip
    hook_points = {
        "embed": "token embeddings (B, T, E)",
        "states": "the encoder's state at each token (B, T, C), zeros on padding",
        "attn.scores": "the additive score of each token, v . tanh(W h_t + b) (B, 1, 1, T)",
        "attn.weights": "the attention over the tokens, softmax of the scores (B, 1, 1, T)",
        "attn.z": "the context vector, the states weighted by the attention (B, 1, 1, C)",
        "class_logits": "class logits (B, num_labels)",
    }

    def __init__(self, config: LSTMClassifierConfig):
        super().__init__()
        self.config = c = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_embed, padding_idx=c.pad_id)
        self.drop = nn.Dropout(c.dropout)
        if c.encoder == "mlp":
            self.mlp = nn.Linear(c.d_embed, c.d_hidden)
        else:
            self.lstm = nn.LSTM(c.d_embed, c.d_hidden, batch_first=True,
                                bidirectional=c.encoder == "bilstm")  # fmt: skip
        self.attn = AdditivePooling(c.width, c.attention)
        self.classifier = nn.Linear(c.width, c.num_labels)
        self.hook_embed, self.hook_states, self.hook_class_logits = Hook(), Hook(), Hook()

    def describe(self) -> str:
        """What this model is, in one sentence (the look-inside verbs start with it)."""
        c = self.config
        enc = {"bilstm": f"bidirectional LSTM ({c.d_hidden} units each way)",
               "lstm": f"LSTM ({c.d_hidden} units)",
               "mlp": f"per-token layer tanh(W e_t) ({c.d_hidden} units, no context)"}[c.encoder]  # fmt: skip
        pool = ("uniform attention (every token weighs 1/T)" if c.attention == "uniform" else
                "additive attention, a_t = softmax_t(v . tanh(W h_t + b))")  # fmt: skip
        return (f"{enc} classifier: {pool} pools the states h_t into one context vector "
                f"c = sum_t a_t h_t, from which a linear layer names one of {c.num_labels} "
                "classes")  # fmt: skip

    @property
    def pad_id(self) -> int:
        return self.config.pad_id

    @classmethod
    def default_task(cls, config: dict) -> str | None:
        return "classify"

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None, head: str = "classify",
                weights: Tensor | None = None) -> Tensor:  # fmt: skip
        """ids (B, T), attention_mask (B, T) 1 = a real token (None: every id but pad_id),
        ``weights`` (B, T) imposed attention -> class logits (B, num_labels). Padding is on
        the right."""
        if head != "classify":
            raise ValueError(f"an LSTM classifier has one head, classify; not {head!r}")
        mask = (ids != self.config.pad_id) if attention_mask is None else attention_mask.bool()
        x = self.drop(self.hook_embed(self.tok_embed(ids)))  # (B, T, E)
        if self.config.encoder == "mlp":
            h = torch.tanh(self.mlp(x))  # (B, T, C): each token alone
        else:
            h = self._lstm(x, mask)  # (B, T, C)
        h = self.hook_states(h * mask[..., None].to(h.dtype))
        context = self.attn(h, mask, weights)  # (B, C)
        return self.hook_class_logits(self.classifier(self.drop(context)))  # (B, K)

    def _lstm(self, x: Tensor, mask: Tensor) -> Tensor:
        """The LSTM's states, run over each row's real tokens only (packed by length), so a
        backward direction starts at the last real token. In float32 with autocast off: CPU
        autocast has no bfloat16 LSTM kernel (see ``attnlab.models.rnn._lstm``)."""
        lengths = mask.sum(1).clamp(min=1).cpu()
        with torch.autocast(x.device.type, enabled=False):
            packed = pack_padded_sequence(x.float(), lengths, batch_first=True,
                                          enforce_sorted=False)  # fmt: skip
            out, _ = self.lstm(packed)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return out  # (B, T, C)

    @torch.no_grad()
    def attention(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The model's own attention (B, T) over ``ids``: what it would impose on another."""
        with hooks.record(self) as cache:
            self(ids, attention_mask)
        return cache["attn.weights"][:, 0, 0]

    # -- the declaration (attnlab.models.declare) ---------------------------------------------

    class_reads = "the context vector c alone"
    # its one query ("query", the learned v) over the text's tokens
    key_stacks = {"attn.weights": ""}
    map_kinds = {"attn.weights": "pooling"}
    QUERY = "query"

    def prepare(self, tokenizer, text: str, like: Prepared | None = None, decode=None) -> Prepared:
        """Token ids (1, T); one output, the class, read at the first position; the attention's
        one query is labelled as the stack ``attn`` (``key_stacks`` names the keys' stack)."""
        p = super().prepare(tokenizer, text, like, decode)
        p.stack_tokens["attn"], p.stack_ids["attn"] = [self.QUERY], []
        return p

    def walkthrough(self, cache: dict, tokens: list[str]) -> list[WalkStep]:
        """Embeddings, the states, the additive scores, the attention and the context vector."""
        c = self.config
        states = {"bilstm": "a BiLSTM reads the text both ways; h_t joins its forward state "
                            "(tokens 1..t) and its backward state (tokens t..T)",
                  "lstm": "an LSTM reads the text left to right; h_t is its state after "
                          "token t, so it knows token t and what came before it",
                  "mlp": "h_t = tanh(W e_t): each token alone, no context"}[c.encoder]  # fmt: skip
        score = ("every score is 0: uniform attention" if c.attention == "uniform" else
                 "e_t = v . tanh(W h_t + b), the additive (Bahdanau) score of each state")  # fmt: skip
        return [
            WalkStep("embed", "token embeddings e_t", "each token id looks up a learned vector "
                     "(no position vector: the LSTM's reading order is the position).",
                     cache["embed"][0]),
            WalkStep("states", "states h_t (a row per token)", states + ".", cache["states"][0]),
            WalkStep("scores", "scores e_t", score + ".", cache["attn.scores"][0, 0], None,
                     tokens),
            WalkStep("attention", "attention a = softmax_t(e)", "the weight of each token, "
                     "summing to 1: how much of its state goes into the context.",
                     cache["attn.weights"][0, 0], None, tokens),
            WalkStep("context", "context c = sum_t a_t h_t", "the states weighted by the "
                     "attention: the whole text as one vector.", cache["attn.z"][0, 0, 0]),
        ]  # fmt: skip

    def forward_logits(self, ids: Tensor) -> Tensor:
        return self(ids)[:, None]  # (B, 1, K): one output, read at the first token

    def head_groups(self) -> list[HeadGroup]:
        note = "uniform attention pooling" if self.config.attention == "uniform" else (
            "additive attention pooling the LSTM states")  # fmt: skip
        return [HeadGroup("context", 0, "attn", 1, note)]

    def points(self, stack=None, sublayers: bool = False):
        raise InputError(
            "an LSTM has no residual stream (its state is rewritten at every step, not added to)"
        )

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        raise InputError("an LSTM has no residual stream to read logits from")
