"""Encoder: a BERT-style bidirectional transformer, with masked-LM and classification heads.

    ids (B, T) -> token + position + token-type embeddings -> LayerNorm (BERT)
               -> n_layer blocks, every token attending to every other non-padding token
               -> hidden states (B, T, C)
    heads:  masked-LM  h -> dense -> act -> LayerNorm -> decoder tied to the embedding -> (B, T, V)
            classify   h[:, 0] -> (pooler: tanh(W h + b)) -> linear -> (B, num_labels)

Nothing here is causal: the only mask is padding, given as Hugging Face's ``attention_mask``
(B, S), 1 = a real token, 0 = padding. BERT's blocks are post-norm, x = LN(x + Sublayer(x));
``norm_first=True`` switches to pre-norm and adds a final LayerNorm.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.attention import from_hf_attention_mask
from attnlab.blocks import ACTIVATIONS, block_parameters, block_stack, layout_name
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.models.declare import (
    SPECIAL,
    Gate,
    Linear,
    ModelKind,
    Norm,
    Prepared,
    Unembed,
    encode_text,
    register,
    token_strings,
)
from attnlab.positional import POSITIONAL

IGNORE_INDEX = -100  # label of a position the masked-LM loss skips (HF's convention)
TIED_READOUT_NOTE = (
    "this encoder has no prediction head: its outputs are read through the token embedding, "
    "logit(t) = h . E[t]"
)


@dataclasses.dataclass
class EncoderConfig(BaseConfig):
    vocab_size: int = 512
    block_size: int = 128  # most positions (BERT's max_position_embeddings)
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_ff: int | None = None  # None = 4 * d_model
    type_vocab_size: int = 2  # segments A/B; 0 = no token-type embedding
    dropout: float = 0.1
    bias: bool = True
    pos: str = "learned"
    norm_first: bool = False  # BERT is post-norm
    embed_norm: bool = True  # BERT normalises the summed embeddings
    activation: str = "gelu"
    ln_eps: float = 1e-12
    pooler: bool = False  # tanh(W h[:, 0] + b), BERT's pooled output
    mlm_head: bool = False  # masked-LM head with a decoder tied to the token embedding
    num_labels: int = 0  # > 0: a sequence-classification head on the first token
    pad_id: int = 0
    tie_weights: bool = True

    def validate(self) -> None:
        self._positive("vocab_size", "block_size", "n_layer", "n_head", "d_model")
        self._positive_or_none("d_ff")
        self._divisible("d_model", "n_head")
        self._one_of("pos", POSITIONAL)
        self._one_of("activation", ACTIVATIONS)
        self._fraction("dropout")
        self._positive("ln_eps")
        if self.type_vocab_size < 0 or self.num_labels < 0:
            raise ConfigError("type_vocab_size and num_labels must be >= 0")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(
                f"pad_id {self.pad_id} is outside the vocabulary of {self.vocab_size}"
            )

    def estimate_parameters(self) -> int:
        """About how many parameters an encoder of this config has, from its sizes alone: the
        blocks, token, position and segment embeddings, and the heads the config asks for."""
        c = self.d_model
        n = self.n_layer * block_parameters(c, self.d_ff or 4 * c)
        n += (self.vocab_size + self.block_size + self.type_vocab_size) * c
        n += (c * c + self.vocab_size) if self.mlm_head else 0  # dense + decoder bias (tied)
        n += (c * c if self.pooler else 0) + c * self.num_labels
        return n + (0 if self.tie_weights or not self.mlm_head else self.vocab_size * c)

    @property
    def block_layout(self) -> str:
        """The blocks' layout (``attnlab.blocks.LAYOUTS``): post (BERT) or pre."""
        return layout_name(self.norm_first)


ENCODER_PRESETS: dict[str, dict] = {
    "baby": dict(n_layer=4, n_head=4, d_model=128, block_size=128),
    "small": dict(n_layer=6, n_head=6, d_model=384, block_size=256),  # MiniLM-L6 sized
    "bert-base": dict(n_layer=12, n_head=12, d_model=768, block_size=512),
}


class MLMHead(nn.Module):
    """BERT's prediction head: logits = LN(act(h W_t + b_t)) E^T + b, E the token embedding."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(c.d_model, c.d_model, bias=c.bias)
        self.act = ACTIVATIONS[c.activation]
        self.ln = nn.LayerNorm(c.d_model, eps=c.ln_eps, bias=c.bias)
        self.decoder = nn.Linear(c.d_model, c.vocab_size, bias=True)

    def forward(self, h: Tensor) -> Tensor:
        return self.decoder(self.ln(self.act(self.dense(h))))  # (B, T, vocab)


@register
class Encoder(ModelKind, nn.Module):
    """Bidirectional transformer. ``forward(ids, attention_mask)`` returns hidden states (B, T, C).

    Heads are parts of the model described by the config (``mlm_head``, ``pooler``,
    ``num_labels``), so a run directory rebuilds exactly with ``Encoder(config)``.
    """

    config_class = EncoderConfig
    model_type = "encoder"
    causal = False  # every token sees every other (read by `attnlab check`)
    uses_padding = True
    tied_weights_keys = ("mlm.decoder.weight",)  # tied to tok_embed.weight when config.tie_weights

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = c = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = POSITIONAL[c.pos](c.block_size, c.d_model)
        self.type_embed = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        self.embed_ln = (
            nn.LayerNorm(c.d_model, eps=c.ln_eps, bias=c.bias) if c.embed_norm else nn.Identity()
        )
        self.drop = nn.Dropout(c.dropout)
        self.blocks = block_stack(c, causal=False)
        self.ln_f = (
            nn.LayerNorm(c.d_model, eps=c.ln_eps, bias=c.bias) if c.norm_first else nn.Identity()
        )
        self.pooler = nn.Linear(c.d_model, c.d_model, bias=c.bias) if c.pooler else None
        self.mlm = MLMHead(c) if c.mlm_head else None
        if self.mlm is not None and c.tie_weights:
            self.mlm.decoder.weight = self.tok_embed.weight
        self.classifier = nn.Linear(c.d_model, c.num_labels) if c.num_labels else None
        names = ("embed", "pos", "type", "ln_f", "pooled", "mlm_logits", "class_logits")
        for name in names + (("embed_sum",) if c.embed_norm else ()):
            setattr(self, f"hook_{name}", Hook())
        self.apply(self._init_weights)

    @property
    def kind(self) -> str:
        """mlm (a masked-LM head), text-classifier (a classification head), or encoder (none)."""
        if self.config.mlm_head:
            return "mlm"
        return "text-classifier" if self.config.num_labels else "encoder"

    def describe(self) -> str:
        """What this model is, in one sentence (the look-inside verbs start with it)."""
        c = self.config
        head = {
            "mlm": "a masked-LM head predicts the token at each [MASK] position",
            "text-classifier": f"a classification head reads the [CLS] state "
            f"{'through the tanh pooler ' if c.pooler else ''}and names one of "
            f"{c.num_labels} classes",
            "encoder": "it has no prediction head: its output is one contextual vector per "
            "token (`attnlab embed` pools them into a sentence embedding)",
        }[self.kind]
        return (f"BERT-style encoder ({c.n_layer} layers, {c.n_head} heads, width {c.d_model}): "
                "bidirectional, every token attends to every other token, before and after it "
                f"(only padding is hidden), so it reads a whole text rather than continuing one; "
                f"{head}")  # fmt: skip

    # -- the declaration (attnlab.models.declare) ---------------------------------------------

    sentence_embedding = True  # `attnlab embed` pools its token states
    examples = tuple(
        dict(n_layer=2, n_head=2, d_model=16, block_size=32, dropout=0.0, **head)
        for head in (dict(mlm_head=True), dict(num_labels=3, pooler=True), {})
    )
    hook_points = {
        "embed": "token embeddings (B, T, C)",
        "pos": "position embeddings (T, C)",
        "type": "token-type (segment) embeddings (B, T, C)",
        "embed_sum": "embed + pos + type, before the embedding LayerNorm (with embed_norm)",
        "blocks.{i}.resid_pre": "the residual stream entering block i",
        "blocks.{i}.attn.weights": "attention probabilities (B, H, T, T), padding masked",
        "blocks.{i}.attn.z": "each head's output before the projection (B, H, T, d_v)",
        "blocks.{i}.resid_mid": "the residual stream after attention",
        "blocks.{i}.mlp_out": "the feed-forward's output",
        "blocks.{i}.resid_post": "the residual stream leaving block i",
        "ln_f": "the final hidden states (B, T, C)",
        "pooled": "the [CLS] state through the pooler (B, C)",
        "mlm_logits": "masked-LM logits (B, T, vocab)",
        "class_logits": "class logits (B, num_labels)",
    }

    @classmethod
    def default_task(cls, config: dict) -> str | None:
        """mlm or classify by the head config.json describes; None without one."""
        if config.get("mlm_head"):
            return "mlm"
        return "classify" if config.get("num_labels") else None

    @property
    def predicts(self) -> str:
        if self.mlm is not None:
            return "masked-token"
        return "class" if self.classifier is not None else "nothing"

    @property
    def notes(self) -> tuple[str, ...]:
        """A headless encoder is read through its token embedding, and says so."""
        return (TIED_READOUT_NOTE,) if self.predicts == "nothing" else ()

    def prepare(self, tokenizer, text: str, like: Prepared | None = None, decode=None) -> Prepared:
        """Token ids (1, T), [CLS] .. [SEP]: a masked LM predicts each (non-special) token at
        its own position, the first [MASK] by default; a classifier one class at [CLS], the
        model's own answer as its target."""
        ids = encode_text(self, tokenizer, text)
        toks = token_strings(tokenizer, text, ids)
        x = torch.tensor([ids], dtype=torch.long, device=next(self.parameters()).device)
        T = len(ids)
        stacks = dict(stack_tokens={"": toks}, stack_ids={"": list(ids)})
        if self.predicts == "class":
            return super().prepare(tokenizer, text, like, decode)
        targets = torch.full((T,), -100, dtype=torch.long)
        keep = [i for i, t in enumerate(toks) if t not in SPECIAL]
        targets[keep] = torch.tensor([ids[i] for i in keep], dtype=torch.long)
        masks = [i for i, t in enumerate(toks) if t == "[MASK]"]
        position = masks[0] if masks else (keep[-1] if keep else T - 1)
        return Prepared(text, (x,), toks, list(ids), toks, targets, position, **stacks)

    def forward_logits(self, ids: Tensor) -> Tensor:
        if self.predicts == "masked-token":
            return self.mlm_logits(ids)
        if self.predicts == "class":
            return self.classify(ids)[:, None]
        return self.readout(self(ids))

    def logits_at(self, args: tuple, position: int) -> Tensor:
        if self.predicts == "masked-token":  # one position through the head, not all T
            return self.mlm(self(args[0])[:, position])
        if self.predicts == "nothing":
            return self.readout(self(args[0])[:, position : position + 1])[:, 0]
        return self.forward_logits(*args)[:, position]

    def record_logits(self, args: tuple) -> Tensor | None:
        """Every head this model has runs (and records); the masked-LM logits, else the class
        logits as (1, 1, num_labels), else None: an encoder without a head predicts nothing."""
        hidden = self(args[0])  # (1, T, C)
        mlm = self._mlm_logits(hidden) if self.mlm is not None else None
        cls = self._class_logits(hidden) if self.classifier is not None else None
        return mlm if mlm is not None else (cls[:, None] if cls is not None else None)

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        if self.predicts == "masked-token":
            return self.mlm(self.ln_f(h))
        if self.predicts == "class":
            return self.classifier(self.pooled(self.ln_f(h)))[:, None]
        return self.ln_f(h) @ self.tok_embed.weight.T  # (B, T, V) the tied readout

    def dla_embeddings(self, cache, position: int) -> list[tuple[str, Tensor]]:
        out = super().dla_embeddings(cache, position)
        if "type" in cache:
            out.append(("type", cache["type"][0, position]))
        return out

    def embed_norm(self):
        return self.embed_ln, "embed_ln.bias", "the embedding LayerNorm's scale (embed_ln)"

    def dla_readout(self) -> list:
        if self.predicts == "masked-token":
            head = self.mlm
            return [Linear(head.dense, "mlm.dense.bias"),
                    Gate(head.act, "the masked-LM head's activation as its gate act(z)/z, and "
                                   "its LayerNorm's scale (mlm.ln)"),
                    Norm(head.ln, "mlm.ln.bias"),
                    Unembed(head.decoder.weight, head.decoder.bias, "mlm.decoder.bias")]  # fmt: skip
        if self.predicts == "class":
            steps = []
            if self.pooler is not None:
                steps = [Linear(self.pooler, "pooler.bias"),
                         Gate(torch.tanh, "the pooler's tanh as its gate tanh(z)/z")]  # fmt: skip
            return [*steps, Unembed(self.classifier.weight, self.classifier.bias,
                                    "classifier.bias")]  # fmt: skip
        return [Unembed(self.tok_embed.weight)]

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    # -----------------------------------------------------------------------------------------
    # The encoder proper
    # -----------------------------------------------------------------------------------------

    @property
    def pad_id(self) -> int:
        return self.config.pad_id

    @torch.no_grad()
    def padding_difference(self, ids: Tensor, n_pad: int = 3) -> float:
        """Largest change at real positions when ``n_pad`` masked pad tokens are appended."""
        B, T = ids.shape
        T = min(T, self.config.block_size - n_pad)
        ids = ids[:, :T]
        padded = torch.cat([ids, ids.new_full((B, n_pad), self.config.pad_id)], dim=1)
        mask = torch.ones_like(padded)
        mask[:, T:] = 0  # HF convention: 0 = padding
        plain = self(ids)
        return float((self(padded, attention_mask=mask)[:, :T] - plain).abs().max())

    def forward(
        self,
        ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        record: bool = False,
        head: str | None = None,
    ):
        """ids (B, T) -> hidden states (B, T, C); with ``record=True``, (output, activation cache).

        ``attention_mask`` (B, T): 1 = real token, 0 = padding (keys that nobody attends to).
        ``token_type_ids`` (B, T): segment of each token (0 = first sentence), default all 0.
        ``head``: ``"mlm"`` returns masked-LM logits (B, T, vocab), ``"classify"`` class logits
        (B, num_labels). Training calls the heads through here, so that the wrappers of
        DistributedDataParallel and ``torch.compile`` (which see only ``forward``) see them.
        """
        if record:
            with hooks.record(self) as acts:
                out = self.forward(ids, attention_mask, token_type_ids, head=head)
            return out, acts
        if head is not None:
            hidden = self.forward(ids, attention_mask, token_type_ids)
            if head == "mlm":
                return self._mlm_logits(hidden)
            if head == "classify":
                return self._class_logits(hidden)
            raise ValueError(f"head must be None, 'mlm' or 'classify', got {head!r}")
        B, T = ids.shape
        limit = self.config.block_size
        if ids.size(1) > limit:
            raise ValueError(f"sequence of {T} tokens exceeds block_size {limit}")
        x = self.hook_embed(self.tok_embed(ids))  # (B, T, C) one vector per token
        x = x + self.hook_pos(self.pos_embed(T))  # (T, C) broadcast over the batch
        if self.type_embed is not None:
            types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids
            x = x + self.hook_type(self.type_embed(types))  # (B, T, C)
        if self.config.embed_norm:
            x = self.hook_embed_sum(x)  # (B, T, C) the sum, before the embedding LayerNorm
        x = self.drop(self.embed_ln(x))
        mask = (
            None if attention_mask is None else from_hf_attention_mask(attention_mask)
        )  # (B, 1, 1, T)
        for block in self.blocks:
            x = block(x, mask=mask)
        return self.hook_ln_f(self.ln_f(x))  # (B, T, C)

    # -----------------------------------------------------------------------------------------
    # Heads
    # -----------------------------------------------------------------------------------------

    def pooled(self, hidden: Tensor) -> Tensor:
        """The first token's state (B, C), through the tanh pooler when the model has one."""
        first = hidden[:, 0]  # (B, C) the [CLS] position
        return self.hook_pooled(
            torch.tanh(self.pooler(first)) if self.pooler is not None else first
        )

    def mlm_logits(
        self, ids: Tensor, attention_mask: Tensor | None = None, token_type_ids=None
    ) -> Tensor:
        """Masked-LM logits (B, T, vocab)."""
        return self(ids, attention_mask, token_type_ids, head="mlm")

    def _mlm_logits(self, hidden: Tensor) -> Tensor:
        if self.mlm is None:
            raise ValueError("this encoder has no masked-LM head (config.mlm_head is False)")
        return self.hook_mlm_logits(self.mlm(hidden))  # (B, T, vocab)

    def classify(
        self, ids: Tensor, attention_mask: Tensor | None = None, token_type_ids=None
    ) -> Tensor:
        """Class logits (B, num_labels) from the first token ([CLS])."""
        return self(ids, attention_mask, token_type_ids, head="classify")

    def _class_logits(self, hidden: Tensor) -> Tensor:
        if self.classifier is None:
            raise ValueError("this encoder has no classification head (config.num_labels is 0)")
        pooled = self.drop(self.pooled(hidden))  # (B, C)
        return self.hook_class_logits(self.classifier(pooled))  # (B, num_labels)

    def mlm_loss(self, ids: Tensor, labels: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Mean cross-entropy over the positions whose label is not IGNORE_INDEX."""
        logits = self.mlm_logits(ids, attention_mask)
        if not bool((labels != IGNORE_INDEX).any()):
            return logits.sum() * 0.0  # nothing selected in this batch: a zero that has a gradient
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
        )

    @torch.no_grad()
    def embed(
        self, ids: Tensor, attention_mask: Tensor | None = None, pool: str = "mean"
    ) -> Tensor:
        """Sentence embeddings (B, C): the mean of the real tokens' states, or the first token's."""
        hidden = self(ids, attention_mask)  # (B, T, C)
        if pool == "cls":
            return hidden[:, 0]
        if pool != "mean":
            raise ValueError(f"pool must be 'mean' or 'cls', got {pool!r}")
        keep = torch.ones_like(ids) if attention_mask is None else attention_mask
        keep = keep.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
        return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1e-9)  # (B, C)


def mask_tokens(
    ids: Tensor,
    mask_id: int,
    vocab_size: int,
    special_ids: list[int] | tuple[int, ...] = (),
    p: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masking. Returns (inputs, labels), both (B, T).

    Each non-special token is selected with probability ``p``; a selected token becomes
    [MASK] 80% of the time, a random token 10%, and stays itself 10%. ``labels`` hold the
    original id at selected positions and IGNORE_INDEX everywhere else.
    """
    g = dict(generator=generator, device=ids.device)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    for s in special_ids:
        maskable &= ids != s
    selected = (torch.rand(ids.shape, **g) < p) & maskable  # (B, T)
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE_INDEX))
    roll = torch.rand(ids.shape, **g)  # one draw decides [MASK] / random / keep
    to_mask = selected & (roll < 0.8)
    to_random = selected & (roll >= 0.8) & (roll < 0.9)
    inputs = ids.masked_fill(to_mask, mask_id)
    random_ids = torch.randint(vocab_size, ids.shape, **g, dtype=ids.dtype)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels
