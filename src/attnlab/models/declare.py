"""What a model kind declares about itself, once, in its own module.

Every model class derives from ``ModelKind`` and registers under the ``model_type`` its run
directories' config.json names (``@register``). The look-inside tools (``attnlab.inspect``),
the interventions, ``Run``, the checkpoint loader and the CLI read these declarations and never
ask which model they hold:

    what it is      kind (the project's one vocabulary: gpt, mlm, text-classifier, encoder,
                    seq2seq-transformer, t5, lstm-attention, lstm, lstm-classifier, vit),
                    describe(), model_type and config_class (config.json), tokenizer_fields
                    (what the tokenizer must match)
    its structure   stacks, output_stack, input_stack, memory_stack, memory_site; head_groups()
                    and parse_heads("L.H,..."); source_attention(); points(); graph() (the residual graph: writers,
                    readers and edges per stream, from each block's residual steps);
                    hook_points (name pattern -> meaning); residual (has a residual stream)
    its input       reads ("text", "image" or "source"); prepare(tokenizer, text) -> Prepared
                    (its targets, and its loss(logits)); metric_position(p, position, target)
    its readout     predicts ("next-token", "masked-token", "class", "decoder-step" or
                    "nothing"); forward_logits(*args), logits_at(args, position);
                    record_logits(args) (a recording's: a tensor, or LaterLogits);
                    readout(h, stack) (a residual vector -> logits: the lens);
                    dla_embeddings(cache, position) and dla_readout() (the same readout as
                    parts, for direct logit attribution); output_name(i) and output_id(token)
    capabilities    causal, uses_padding and pad_id, decoded_by (its decoder:
                    ``attnlab.decoding.Decoder``, start/step/reorder, its special tokens, how
                    text becomes its input) and decodes, notes
    its probes      what the checks and the head scores run it on: probe_vocab_size (the ids
                    probe_forward reads), probe_inputs(batch, seed, length), probe_forward(x);
                    cache_difference(ids) and padding_difference(ids) (a kind's own probes of
                    `attnlab check`'s cache and padding checks; None: the checks' own)
    walk-through    walkthrough(cache, tokens): the steps of a forward pass a model with no
                    transformer blocks explains itself (``attnlab trace``); class_reads

The defaults below describe a single-stack transformer whose blocks are ``self.blocks``, read
as ``model(ids)`` with token ids (1, T); a kind overrides what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.decoding import Decoder
from attnlab.errors import AttnlabError
from attnlab.models.graph import ResidualGraph, residual_graph
from attnlab.registry import Registry

SPECIAL = {"[CLS]", "[SEP]", "[MASK]", "[PAD]", "<pad>", "<bos>", "<eos>"}

# model_type -> class: a kind is a module of attnlab.models whose class registers itself
# (``@register``); ``registered()`` imports every module of the package first
KINDS = Registry("attnlab.models", key="model_type")
REGISTRY: dict[str, type] = KINDS.found


def register(cls: type) -> type:
    """Class decorator: make ``cls`` the model that config.json's ``model_type`` names. To add
    a kind, add a module to ``attnlab.models`` whose ``ModelKind`` class is decorated with it."""
    return KINDS.register(cls)


def model_for(config) -> nn.Module:
    """A new model of the registered class whose ``config_class`` ``config`` is."""
    for cls in registered().values():
        if type(config) is cls.config_class:
            return cls(config)
    raise TypeError(f"no registered model is configured by a {type(config).__name__}")


def registered() -> dict[str, type]:
    """Every registered model class by model_type; the modules of ``attnlab.models`` (each a
    kind) are imported first, so a new module there is found without being listed."""
    return KINDS.registered()


class InputError(AttnlabError):
    """An input a model cannot read (empty, too long, no tokenizer for it): one clear line."""


# ---------------------------------------------------------------------------------------------
# Structure
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaterLogits:
    """A recorded pass's logits whose last position is computed and the rest only when first
    read (``record_logits``): ``last`` (B, 1, V); ``rest()`` gives all of them (B, T, V), whose
    last row is ``last``."""

    last: Tensor
    rest: Callable[[], Tensor]


@dataclass(frozen=True)
class HeadGroup:
    """One attention layer's heads: ``kind`` is attn (single stack), encoder, decoder, cross
    or context (an LSTM's one attention); ``path`` the module path whose ``z`` holds the heads."""

    kind: str
    layer: int
    path: str
    n_heads: int
    note: str = ""  # what the group is where its kind does not say (an LSTM's context vector)

    def label(self, head: int) -> str:
        if self.kind == "context":
            return "context"
        return f"{self.layer}.{head}" if self.kind == "attn" else f"{self.kind}.{self.layer}.{head}"


@dataclass(frozen=True)
class HeadRef:
    group: HeadGroup
    head: int

    @property
    def label(self) -> str:
        return self.group.label(self.head)


@dataclass(frozen=True)
class Point:
    """A residual stream point: ``layer`` i is the input of block i; i = n_layer is the output
    of the last block (the final residual). ``name`` is the hook that records it."""

    stack: str
    layer: int
    name: str
    label: str


@dataclass
class Prepared:
    """One input made ready to run (batch 1): the forward pass's arguments and its labels."""

    text: str
    args: tuple  # tensors of the forward pass, batch 1
    tokens: list[str]  # labels of the output positions (decoder tokens for an encoder-decoder)
    ids: list[int]  # ids at those positions
    input_tokens: list[str]  # labels of the input stack (source tokens, patches)
    targets: Tensor  # (T,) the token each position should predict, -100 where none
    position: int  # default metric position
    extra: dict = field(default_factory=dict)
    stack_tokens: dict[str, list[str]] = field(default_factory=dict)  # each stack's labels
    stack_ids: dict[str, list[int]] = field(default_factory=dict)
    shown: dict = field(default_factory=dict)  # what a Recording of it adds (its ``extra``)

    def batch(self, n: int) -> tuple:
        """The arguments repeated ``n`` times along the batch."""
        return tuple(a.expand(n, *a.shape[1:]) for a in self.args)

    def loss(self, logits: Tensor) -> Tensor:
        """Cross-entropy of ``logits`` (B, T, V) against ``targets`` per output position
        (B, T); 0 where there is no target. GPT: the next token; a masked LM: each token at its
        own (unmasked) position; an encoder-decoder: the clean greedy translation, <eos> last;
        a classifier: the true or the clean class."""
        B, T, V = logits.shape
        targets = self.targets.to(logits.device).expand(B, T)
        ce = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1),
                             ignore_index=-100, reduction="none")  # fmt: skip
        return ce.view(B, T)

    def mean_loss(self, logits: Tensor) -> Tensor:
        """(B,) the mean cross-entropy over positions that have a target."""
        n = (self.targets != -100).sum().clamp(min=1)
        return self.loss(logits).sum(-1) / n


# ---------------------------------------------------------------------------------------------
# The readout as parts, for direct logit attribution: steps from the final residual to a logit
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Linear:
    """h -> W h + b (a dense layer inside a head): linear, so each part goes through alone."""

    module: nn.Linear
    bias_name: str


@dataclass(frozen=True)
class Gate:
    """An elementwise nonlinearity act(z), frozen at this input as the gate act(z) / z."""

    act: object
    frozen: str  # what the result says it froze


@dataclass(frozen=True)
class Norm:
    """A LayerNorm whose scale is frozen at this input."""

    module: nn.Module
    bias_name: str
    frozen: str = ""


@dataclass(frozen=True)
class Unembed:
    """The last step: logit(t) = W[t] . h (+ b[t], named ``bias_name``); with ``softcap``,
    cap tanh(logit / cap) (Gemma 2's final logits; DLA freezes it as a gate)."""

    weight: Tensor
    bias: Tensor | None = None
    bias_name: str = ""
    softcap: float | None = None


@dataclass(frozen=True)
class WalkStep:
    """One step of a forward pass as the model explains it (``ModelKind.walkthrough``):
    ``value`` is a recorded tensor, ``rows`` and ``cols`` label its axes by token."""

    name: str
    title: str
    meaning: str
    value: Tensor
    rows: list[str] | None = None
    cols: list[str] | None = None


# ---------------------------------------------------------------------------------------------
# Text in
# ---------------------------------------------------------------------------------------------


def token_strings(tokenizer, text: str, ids: list[int]) -> list[str]:
    """Labels for ``ids``: what the model saw, read from the ids (the vocabulary's token for
    each, ``tokenizer.labels``), never from ``text``: a character the vocabulary lacks is
    labelled ``[UNK]``, as the model read it."""
    labels = getattr(tokenizer, "labels", None)
    if labels is not None:
        return list(labels(ids))
    return [tokenizer.decode([i]) for i in ids]


def output_tensor(out) -> Tensor:
    """The main output of a model call: the tensor itself, or a tuple's first element."""
    if isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, dict):
        out = out.get("logits", next(iter(out.values())))
    return out


def max_positions(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    for key in ("block_size", "max_len", "max_positions", "n_positions"):
        v = getattr(cfg, key, None)
        if isinstance(v, int):
            return v
    return None


def encode_text(model: nn.Module, tokenizer, text: str) -> list[int]:
    """Token ids for ``text``; one clear error if it is empty or longer than the model reads."""
    if tokenizer is None:
        raise InputError("this run has no tokenizer.json, so it cannot read text")
    ids = tokenizer.encode(text)
    if not ids:
        raise InputError("the text has no tokens")
    limit = max_positions(model)
    if limit is not None and len(ids) > limit:
        raise InputError(
            f"the text is {len(ids)} tokens; this model reads at most {limit} "
            "(its block_size): shorten it"
        )
    return ids


def text_token_id(tok, token: str) -> int:
    """The id of ``token`` in the vocabulary ``tok`` (it must be exactly one token)."""
    if tok is None:
        raise InputError("this run has no tokenizer, so it cannot read a token")
    inner = getattr(tok, "tok", None)  # a Hugging Face tokenizer: look the token up
    if inner is not None and inner.token_to_id(token) is not None:
        ids = [inner.token_to_id(token)]
    elif inner is not None:
        ids = tok.encode(token, add_special_tokens=False)
    else:
        try:
            ids = tok.encode(token, add_special_tokens=False)
        except Exception as e:
            raise InputError(f"target {token!r}: {e}") from None
    if len(ids) != 1:
        raise InputError(
            f"{token!r} is {len(ids)} tokens in this vocabulary; give exactly one token"
        )
    return ids[0]


def class_id(classes: list[str] | None, n: int, token: str) -> int:
    """The index of class ``token`` (or a class id, for a run that does not name them)."""
    names = list(classes or [])
    if token in names:
        return names.index(token)
    if not names and token.isdigit() and int(token) < n:
        return int(token)
    raise InputError(f"{token!r} is not a class of this model; classes: "
                     f"{', '.join(names) or 'unknown'}")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The declaration
# ---------------------------------------------------------------------------------------------


class ModelKind:
    """The declaration every attnlab model makes (see the module doc); the defaults are a
    single-stack transformer read as ``model(ids)``."""

    model_type: str = ""
    config_class: type | None = None
    kind: str = ""
    causal: bool = False  # output t depends on inputs 0..t only (read by `attnlab check`)
    uses_padding: bool = False  # masks padded keys (then ``pad_id`` must not change outputs)
    pad_id: int | None = None  # the id padding is made of (None: the model reads no padding)
    # its decoder (start / step / reorder, special tokens, text in and out), a class made for
    # the model: generate and beam search run on it (``attnlab.decoding``); None: it does not
    decoded_by: type[Decoder] | None = None
    kv_cache: bool = False  # new_cache(batch, max_len) and forward(ids, cache=...)
    reads: str = "text"  # text | image | source (an encoder-decoder's source text)
    predicts: str = "next-token"  # next-token | masked-token | class | decoder-step | nothing
    stacks: tuple[str, ...] = ("",)  # prefixes of its transformer stacks
    output_stack: str = ""  # the stack whose residual stream reaches the logits
    input_stack: str = ""
    memory_stack: str | None = None  # the stack cross-attention reads its keys from
    memory_site: str | None = None  # the hook of that memory (B, S, C): one vector per source token
    residual: bool = True  # a residual stream: lens, DLA and patching by position apply
    sentence_embedding: bool = False  # `attnlab embed` pools its outputs
    tokenizer_fields: tuple[tuple[str, str, str], ...] = (
        ("vocab_size", "vocab_size", "tokenizer.json"),
    )  # (config field, tokenizer attribute, the file holding that tokenizer)
    gradient_site: str = "embed"  # the hook input attributions are taken at
    gradient_first_token: int = 0  # input tokens before the first one the site holds
    gradient_note: str = ""
    notes: tuple[str, ...] = ()  # said beside every intervention's result
    class_reads: str = "the [CLS] state alone"  # what a classifier's last layer reads
    # attention maps whose keys are another stack's tokens than their queries' (map -> stack)
    key_stacks: dict[str, str] = {}
    # an attention map that is neither self- nor cross-attention, by name -> what it is called
    # (an LSTM classifier's one query pools its states: "pooling")
    map_kinds: dict[str, str] = {}
    # tiny configs of each kind the class makes (vocabulary sizes left to the tokenizer, per
    # ``tokenizer_fields``): the conformance suite runs every verb on a random run of each
    examples: tuple[dict, ...] = ()
    hook_points: dict[str, str] = {
        "embed": "token embeddings (B, T, C)",
        "pos": "position embeddings added to them",
        "blocks.{i}.resid_pre": "the residual stream entering block i",
        "blocks.{i}.ln1": "its normalised input to attention",
        "blocks.{i}.attn.weights": "attention probabilities (B, H, T, S)",
        "blocks.{i}.attn.z": "each head's output before the projection (B, H, T, d_v)",
        "blocks.{i}.resid_mid": "the residual stream after attention",
        "blocks.{i}.mlp_out": "the feed-forward's output (a block with one)",
        "blocks.{i}.resid_post": "the residual stream leaving block i",
        "ln_f": "the final normalised residual stream",
    }

    # parameters that are copies of another when the config ties them (config.tie_weights):
    # stored once in a checkpoint
    tied_weights_keys: tuple[str, ...] = ()

    @property
    def tied_now(self) -> tuple[str, ...]:
        """The parameters this model holds as copies of another now: ``tied_weights_keys``
        where its config ties its weights (``tie_weights``), else none."""
        return tuple(self.tied_weights_keys) if getattr(self.config, "tie_weights", False) else ()

    @property
    def decodes(self) -> bool:
        """It declares a decoder: generate and beam search run on it."""
        return self.decoded_by is not None

    def describe(self) -> str:
        return self.kind

    @classmethod
    def default_task(cls, config: dict) -> str | None:
        """The task of a run that names none (imported weights), from its config.json's
        ``config``; None for a model that predicts nothing."""
        return "lm"

    def walkthrough(self, cache: dict, tokens: list[str]) -> list[WalkStep] | None:
        """The steps between the tokens and the output of a model ``attnlab trace`` cannot
        read as transformer blocks, from a recording ``cache`` (batch 1); None: it can."""
        return None

    # -- structure ----------------------------------------------------------------------------

    def stack_blocks(self, stack: str = "") -> nn.ModuleList:
        return (self.get_submodule(stack) if stack else self).blocks

    def head_groups(self) -> list[HeadGroup]:
        """Every attention layer with heads, in forward order."""
        out = []
        for stack in self.stacks:
            kind = stack or "attn"
            for i, block in enumerate(self.stack_blocks(stack)):
                root = f"{stack}.blocks.{i}" if stack else f"blocks.{i}"
                out.append(HeadGroup(kind, i, f"{root}.attn", block.attn.n_heads))
                if getattr(block, "cross", None) is not None:
                    out.append(HeadGroup("cross", i, f"{root}.cross", block.cross.n_heads))
        return out

    def parse_heads(self, spec: str | list) -> list[HeadRef]:
        """Heads from ``"L.H,L.H"`` (one stack), ``"decoder.L.H"``, ``"cross.L.H"``,
        ``"encoder.L.H"`` (an encoder-decoder), ``"context"`` (an LSTM), or (layer, head)
        tuples. A layer or head that does not exist is an InputError."""
        items = spec.split(",") if isinstance(spec, str) else list(spec)
        groups = self.head_groups()
        if not groups:
            raise InputError("this model has no attention (an LSTM without attention)")
        kinds = sorted({g.kind for g in groups})
        out = []
        for item in items:
            if isinstance(item, HeadRef):
                out.append(item)
                continue
            parts = [str(p) for p in item] if isinstance(item, tuple) else item.strip().split(".")
            if parts == ["context"] or (kinds == ["context"] and parts in (["0", "0"],)):
                parts = ["context", "0", "0"]
            if len(parts) == 2:
                if kinds != ["attn"]:
                    raise InputError(f"head {item!r}: this model has {', '.join(kinds)} heads; "
                                     f"write {kinds[0]}.LAYER.HEAD")  # fmt: skip
                parts = ["attn", *parts]
            if len(parts) != 3 or not parts[1].lstrip("-").isdigit() or not parts[2].isdigit():
                raise InputError(f"head {item!r}: expected LAYER.HEAD, e.g. 1.2")
            kind, layer, head = parts[0], int(parts[1]), int(parts[2])
            hit = [g for g in groups if g.kind == kind]
            if not hit:
                raise InputError(f"head {item!r}: this model has no {kind} heads (it has "
                                 f"{', '.join(kinds)})")  # fmt: skip
            group = next((g for g in hit if g.layer == layer), None)
            if group is None:
                raise InputError(f"head {item!r}: no layer {layer}; this model has layers "
                                 f"0..{hit[-1].layer}")  # fmt: skip
            if not 0 <= head < group.n_heads:
                raise InputError(f"head {item!r}: no head {head}; layer {layer} has heads "
                                 f"0..{group.n_heads - 1}")  # fmt: skip
            out.append(HeadRef(group, head))
        return out

    def source_attention(self) -> list[HeadGroup]:
        """The head groups whose keys are the source tokens (``memory_site``'s positions): an
        encoder-decoder's cross-attention, an LSTM's context; none in a single-stack model."""
        return [g for g in self.head_groups() if g.kind in ("cross", "context")]

    def points(self, stack: str | None = None, sublayers: bool = False) -> list[Point]:
        """Residual stream points of a stack: block inputs and the final output; with
        ``sublayers`` also after each attention (and cross-attention) inside a block."""
        stack = self.output_stack if stack is None else stack
        root = f"{stack}.blocks" if stack else "blocks"
        blocks = self.stack_blocks(stack)
        L = len(blocks)
        out = [Point(stack, 0, f"{root}.0.resid_pre", "embed")]
        for i, block in enumerate(blocks):
            if sublayers:
                out.append(Point(stack, i + 1, f"{root}.{i}.resid_mid", f"{i}.attn"))
                if getattr(block, "cross", None) is not None:
                    out.append(Point(stack, i + 1, f"{root}.{i}.resid_cross", f"{i}.cross"))
            label = f"{i}.mlp" if sublayers else (f"{i + 1}" if i + 1 < L else "final")
            out.append(Point(stack, i + 1, f"{root}.{i}.resid_post", label))
        return out

    # -- input --------------------------------------------------------------------------------

    def prepare(self, tokenizer, text: str, like: Prepared | None = None, decode=None) -> Prepared:
        """``text`` made ready to run: token ids (1, T). Position t predicts token t + 1; a
        model that ``predicts`` a class has one output, at the first token ([CLS]), whose
        target is the model's own answer."""
        ids = encode_text(self, tokenizer, text)
        toks = token_strings(tokenizer, text, ids)
        x = torch.tensor([ids], dtype=torch.long, device=_device(self))  # (1, T)
        stacks = dict(stack_tokens={"": toks}, stack_ids={"": list(ids)})
        if self.predicts == "class":
            p = Prepared(text, (x,), [toks[0]], [ids[0]], toks,
                         torch.full((1,), -100, dtype=torch.long), 0, **stacks)  # fmt: skip
            with torch.no_grad():
                p.targets = self.forward_logits(x)[0, 0].argmax()[None].cpu()
            return p
        targets = torch.full((len(ids),), -100, dtype=torch.long)
        targets[:-1] = torch.tensor(ids[1:])
        return Prepared(text, (x,), toks, list(ids), toks, targets, len(ids) - 1, **stacks)

    def metric_position(self, p: Prepared, position: int | None, target: int | None) -> int:
        """``position`` checked against ``p``'s output length, or the default: for a model that
        predicts decoder steps the first position whose clean output is ``target``, else
        ``p.position`` (the last; a masked LM's first mask). An InputError past the output."""
        T = len(p.tokens)
        if position is not None:
            if not -T <= position < T:
                raise InputError(f"--position {position}: the output has positions 0..{T - 1}")
            return position % T
        if self.predicts == "decoder-step" and target is not None:
            hits = [i for i, t in enumerate(p.targets.tolist()) if t == target]
            if hits:
                return hits[0]
        return p.position

    # -- readout ------------------------------------------------------------------------------

    def forward_logits(self, *args) -> Tensor:
        """Logits (B, T, V) of one forward pass (B, 1, n_classes for a classifier)."""
        return self(*args)

    def logits_at(self, args: tuple, position: int) -> Tensor:
        """Logits (B, V) at one output position: ``forward_logits(*args)[:, position]``."""
        return self.forward_logits(*args)[:, position]

    def record_logits(self, args: tuple) -> Tensor | LaterLogits | None:
        """What a Recording keeps as its ``logits``: the forward pass's, None for a model that
        predicts nothing, or a ``LaterLogits`` (a GPT: the last position now, the rest when
        read)."""
        return self.forward_logits(*args)

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        """What the model's head makes of a residual stream ``h`` (B, T, C): the logit lens.
        Applied to the last block's output it is the model's own logits."""
        return self.lm_head(self.ln_f(h))

    def final_norm(self, stack: str | None = None) -> nn.Module:
        """The norm on a stack's final stream (default: the output stack's, between the last
        block and the head; an Identity where there is none)."""
        stack = self.output_stack if stack is None else stack
        module = self.get_submodule(stack) if stack else self
        return module.ln_f if "ln_f" in module._modules else nn.Identity()

    def graph(self) -> ResidualGraph:
        """The residual graph: every writer to and reader of each residual stream and the
        edges between them (``attnlab.models.graph``), from the stacks' blocks' declared
        residual steps. A model with no residual stream (``residual`` False) has none: an
        InputError."""
        if not self.residual:
            raise InputError(f"a {self.kind} has no residual stream, so no residual graph")
        return residual_graph(self)

    def dla_embeddings(self, cache, position: int) -> list[tuple[str, Tensor]]:
        """The residual stream before block 0 at ``position``, as named parts."""
        out = [("embed", _row(cache["embed"], position))]
        if "pos" in cache:
            out.append(("pos", _row(cache["pos"], position)))
        return out

    def embed_norm(self) -> tuple[nn.Module | None, str, str]:
        """(a LayerNorm applied to the summed embeddings, its bias name, what freezing it says)."""
        return None, "", ""

    def dla_readout(self) -> list:
        """The head after the final norm, as steps (``Linear``, ``Gate``, ``Norm``, ``Unembed``)."""
        return [Unembed(self.lm_head.weight)]

    def output_name(self, tokenizer, classes: list[str] | None, i: int) -> str:
        """How results name output ``i``: a token, or a class."""
        if self.predicts == "class":
            return classes[i] if classes and i < len(classes) else str(i)
        return tokenizer.decode([i]) if tokenizer is not None else str(i)

    def output_id(self, tokenizer, classes: list[str] | None, token: str) -> int:
        """The output index of ``token`` (exactly one token, or a class name)."""
        if self.predicts == "class":
            return class_id(classes, self.config.num_labels, token)
        return text_token_id(tokenizer, token)

    def gradient_baseline(self, x: Tensor) -> Tensor:
        """The "no input" point at ``gradient_site``: zero vectors."""
        return torch.zeros_like(x)

    # -- probes: what `attnlab check` and the head scores run it on ---------------------------

    @property
    def probe_vocab_size(self) -> int | None:
        """How many token ids ``probe_forward`` reads (its probes are drawn from them); None
        for a model that reads no token ids (images)."""
        return None if self.reads == "image" else self.config.vocab_size

    def probe_inputs(self, batch: int = 2, seed: int = 0, length: int = 16) -> Tensor:
        """Random inputs for ``probe_forward``: token ids (batch, T) of the probe vocabulary,
        T = ``length`` within the model's positions, the pad id left out."""
        vocab = self.probe_vocab_size or 16
        limit = max_positions(self)
        T = min(length, limit) if limit else length
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (batch, T), generator=g)
        if self.pad_id is not None and vocab > 1:
            ids = torch.where(ids == self.pad_id, (ids + 1) % vocab, ids)
        return ids.to(_device(self))

    def probe_forward(self, x: Tensor) -> Tensor:
        """One forward pass over probe inputs ``x`` (``probe_inputs``, or token ids (B, T)),
        its main output (B, T, ...): what the conformance checks compare and the head scores
        record."""
        return output_tensor(self(x))

    def cache_difference(self, ids: Tensor) -> float | None:
        """The kind's own measure of "KV cache == no cache" on probe inputs ``ids``; None: the
        check's own (``new_cache``, where ``kv_cache``)."""
        return None

    def padding_difference(self, ids: Tensor) -> float | None:
        """The kind's own measure of "padding changes no output" on ``ids``; None: the check's
        own (``pad_id`` appended)."""
        return None


def _device(model: nn.Module):
    return next(model.parameters()).device


def _row(x: Tensor, pos: int) -> Tensor:
    return x[0, pos] if x.dim() == 3 else x[pos]


class SourceDecoder(Decoder):
    """An encoder-decoder's side of the decoding protocol: ``start`` encodes the source once,
    the first step feeds the start id, and an output ends at the end id. The ids are attnlab's
    pair tokenizers' (``attnlab.tokenizers``): <pad> 0, <bos> 1 (the start), <eos> 2 (the end),
    and <pad> and <bos> are never emitted; a kind with its own vocabulary says its ids (T5).
    Its text is a source in (``encode_source``) and a target out (``decode_target``). Its
    positions end at ``max_len`` where its config has one; it reads no window policy."""

    start_id, end_id, never_emit, pad_id = 1, 2, (0, 1), 0
    what = "encoder-decoder"

    def first_tokens(self, src: Tensor) -> Tensor:
        return torch.full((src.size(0),), self.start_id, dtype=torch.long, device=src.device)

    def check_window(self, window: str, use_cache: bool = True) -> None:
        if window != "slide" or not use_cache:
            raise ValueError("window policies and --no-cache apply to a GPT's context, "
                             "not to an encoder-decoder")  # fmt: skip

    def encode(self, tokenizer, text: str) -> list[int]:
        return tokenizer.encode_source(text)

    def decode(self, tokenizer, ids: list[int]) -> str:
        return tokenizer.decode_target(ids)

    @property
    def vocab_size(self) -> int:
        return self.model.config.tgt_vocab_size

    @property
    def max_positions(self) -> int | None:
        return max_positions(self.model)  # a Transformer's max_len (<bos> included); an LSTM: none


class EncoderDecoder(ModelKind):
    """The declaration shared by the encoder-decoders: a source text in, the decoder reading
    <bos> + its own greedy translation; every decoder step predicts the next output token.
    Each declares its ``SourceDecoder`` (``decoded_by``)."""

    reads = "source"
    predicts = "decoder-step"
    stacks = ("encoder", "decoder")
    output_stack = "decoder"
    input_stack = "encoder"
    memory_stack = "encoder"
    memory_site = "encoder.out"
    tokenizer_fields = (
        ("src_vocab_size", "src_vocab_size", "tokenizer.json"),
        ("tgt_vocab_size", "tgt_vocab_size", "target_tokenizer.json"),
    )
    gradient_site = "encoder.embed"

    @classmethod
    def default_task(cls, config: dict) -> str | None:
        return "seq2seq"

    @property
    def probe_vocab_size(self) -> int | None:
        """Its probes run the decoder (``probe_forward``): the target vocabulary."""
        return self.config.tgt_vocab_size

    @classmethod
    def example_tokenizer(cls, text: str):
        """A tokenizer of the characters of ``text`` for a test run of this kind: attnlab's
        pair tokenizer (<pad>, <bos>, <eos> in front of each side's ids)."""
        from attnlab.tokenizers import CharTokenizer, PairTokenizer

        return PairTokenizer(CharTokenizer(text), CharTokenizer(text))

    def prepare(self, tokenizer, text: str, like: Prepared | None = None, decode=None) -> Prepared:
        """The source ids (1, S) and the decoder's input (1, T): <bos> + the greedy
        translation of ``text`` (``decode(model, src)``: the caller's greedy decoder, which
        lives above the models), or the same decoder input as ``like``."""
        from attnlab.tokenizers import PAD

        dec = self.decoded_by(self)
        BOS, EOS = dec.start_id, dec.end_id
        if tokenizer is None:
            raise InputError("this run has no tokenizer.json, so it cannot read text")
        dev = _device(self)
        src_ids = tokenizer.encode_source(text)
        limit = getattr(self.config, "max_len", None)
        if limit and len(src_ids) > limit:
            raise InputError(f"the source is {len(src_ids)} tokens; this model reads at most "
                             f"{limit}")  # fmt: skip
        src = torch.tensor([src_ids or [PAD]], dtype=torch.long, device=dev)  # (1, S)
        if like is not None:
            tgt_in, out = like.args[1], like.extra["output"]
        elif decode is None:
            raise InputError("an encoder-decoder's input needs its output decoded: pass decode")
        else:
            out = decode(self, src)[0]
            tgt_in = torch.tensor([[BOS, *out]], dtype=torch.long, device=dev)  # (1, T)
        targets = torch.tensor([*out, EOS])
        dec_ids = tgt_in[0].tolist()
        src_toks, dec_toks = tokenizer.source_tokens(src_ids), tokenizer.target_tokens(dec_ids)
        translation = tokenizer.decode_target(out)
        return Prepared(text, (src, tgt_in), dec_toks, dec_ids, src_toks, targets,
                        len(dec_ids) - 1, {"output": out, "translation": translation},
                        {"encoder": src_toks, "decoder": dec_toks},
                        {"encoder": list(src_ids), "decoder": dec_ids},
                        {"predicted": tokenizer.target_tokens([*out, EOS]),
                         "translation": translation})  # fmt: skip

    def output_name(self, tokenizer, classes, i: int) -> str:
        return tokenizer.target_tokens([i])[0]

    def output_id(self, tokenizer, classes, token: str) -> int:
        """Target ids count <pad>, <bos>, <eos> first (``PairTokenizer``)."""
        return text_token_id(getattr(tokenizer, "target", tokenizer), token) + 3
