"""The recording protocol: how any model hands its activations to the look-inside tools.

Every tool in ``attnlab.inspect`` (trace, attention, similarity, influence, explore, check) reads
a ``Recording`` and never special-cases a model. A model plugs in by doing three things:

1. Route its activations through ``attnlab.hooks.Hook`` points, so ``attnlab.hooks.record``
   captures them in an ``ActivationCache`` keyed by module path. Attention maps are found BY
   NAME: any key ending in ``attn.weights`` (self-attention) or ``cross.weights``
   (cross-attention), with an optional stack prefix, each shaped (B, H, T, S)::

       blocks.0.attn.weights                 GPT / encoder-only (single stack, prefix "")
       encoder.blocks.0.attn.weights         encoder self-attention of a seq2seq model
       decoder.blocks.1.attn.weights         decoder self-attention
       decoder.blocks.1.cross.weights        decoder queries over encoder keys
       decoder.attn.weights                  an LSTM decoder's attention (H = 1)

   Next to a map ``P.weights`` the tools also use, when present: ``P.v`` (B, H, S, d_v) and the
   module at path ``P`` with an ``out_proj`` (for influence); and per block ``resid_pre``,
   ``resid_mid``, ``resid_cross``, ``resid_post``, ``ln1`` (for trace, similarity, influence).
   A tool skips what a model does not record rather than failing.

2. Declare itself (``attnlab.models.declare.ModelKind``): ``record`` below reads its
   ``prepare`` (the input made ready, each stack's tokens), ``record_logits``, ``memory_stack``
   (the stack cross-attention reads its keys from), ``kind`` and ``describe()``. A model never
   builds a Recording itself.

3. Declare capabilities and probes (``ModelKind``'s, each with a default), read by
   ``attnlab.inspect.check`` and the head scores (``attnlab.training.probes``):

   ``causal``          True if output t may depend on inputs 0..t only (GPT). Default False.
   ``uses_padding``    True if the model masks padded keys. It then has ``pad_id`` (int):
                       positions whose id equals ``pad_id`` must not change other outputs.
   ``kv_cache``        True with ``new_cache(batch, max_len)`` and ``forward(ids, cache=...)``:
                       incremental decoding, checked against a full forward pass.
   ``decoded_by``      its decoder (``attnlab.decoding.Decoder``: start / step / reorder, its
                       special tokens); ``decodes`` says it has one.
   ``probe_forward(x) -> Tensor (B, T, ...)``: what the checks and head scores call. Default:
                       ``model(x)`` (the first element if it returns a tuple). A seq2seq model
                       runs the decoder on ``x`` with a fixed source.
   ``probe_inputs(batch, seed, length) -> Tensor``: the random inputs the checks use. Default:
                       token ids of ``probe_vocab_size`` without ``pad_id`` (a ViT returns
                       random images (B, C, H, W)).
   ``cache_difference(ids)``, ``padding_difference(ids)``: a kind's own measures of those two
                       checks (an encoder-decoder's); None (default): the checks' own.

Labels: for a map named ``<stack>.<...>.attn.weights`` the query AND key tokens are the
stack's tokens; for ``cross.weights`` the keys are ``tokens[memory_stack]``. A self-attention
map whose key length does not match its stack but matches ``memory_stack`` (an LSTM decoder's
``decoder.attn.weights``) is labelled as cross-attention. ``key_stacks`` overrides any of this
per map name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab import hooks
from attnlab.errors import AttnlabError
from attnlab.generation import greedy
from attnlab.hooks import ActivationCache
from attnlab.models import declare
from attnlab.models.declare import (
    InputError,
    ModelKind,
    max_positions,
    output_tensor,
    token_strings,
)

MAP_SUFFIXES = ("attn.weights", "cross.weights")
LAYER_RE = re.compile(r"(?:^|\.)(?:blocks|layers)\.(\d+)\.")  # blocks.3.attn.weights -> 3


__all__ = ["AttentionInfo", "InspectError", "Recording", "encode_text", "max_positions",
           "output_tensor", "record", "token_strings"]  # fmt: skip


class InspectError(AttnlabError):
    """Input the look-inside tools cannot use (text too long, unknown layer or head)."""


@dataclass
class AttentionInfo:
    """Where one attention map sits: its cache name, stack, layer, kind and label stacks."""

    name: str  # cache key, e.g. "decoder.blocks.1.cross.weights"
    stack: str  # "" for single-stack models
    layer: int | None  # the N of "blocks.N", None if the name has none
    kind: str  # "self" or "cross"
    query_stack: str
    key_stack: str
    n_heads: int

    @property
    def module_path(self) -> str:
        """Path of the attention module (the name minus ``.weights``)."""
        return self.name.rsplit(".", 1)[0]

    @property
    def label(self) -> str:
        """Short human label: 'layer 1 self' or 'decoder layer 1 cross'."""
        inner = self.module_path[len(self.stack) + 1 :] if self.stack else self.module_path
        where = f"layer {self.layer}" if self.layer is not None else inner
        return " ".join(p for p in (self.stack, where, self.kind) if p)


@dataclass
class Recording:
    """One recorded forward pass: the activations plus the tokens that label them.

    ``cache`` holds (B=1) activations by name. ``tokens`` maps each stack to its token strings,
    ``{"": tokens}`` for a single-stack model. ``ids`` likewise holds the token ids.
    ``memory_stack`` names the stack cross-attention reads from (None without one).
    ``logits`` is the model's output (1, T, vocab) where it has one (``output``: a GPT's is
    a ``LaterLogits``, made whole when ``logits`` is first read; ``last_logits`` reads the
    last position without that). ``extra`` holds what a
    model adds (an encoder-decoder: ``translation`` and ``predicted`` decoder tokens; a ViT: the
    ``image``). ``kind`` and ``description`` say what the model is (``model.kind`` and
    ``model.describe()``); every tool's JSON carries them as ``about``.
    """

    cache: ActivationCache
    tokens: dict[str, list[str]]
    ids: dict[str, list[int]] = field(default_factory=dict)
    memory_stack: str | None = None
    output: Tensor | declare.LaterLogits | None = None  # what ``logits`` reads
    model_type: str = ""
    key_stacks: dict[str, str] = field(default_factory=dict)
    map_kinds: dict[str, str] = field(default_factory=dict)  # map name -> its kind, if declared
    extra: dict = field(default_factory=dict)  # model-specific: e.g. a translation and its tokens
    kind: str = ""  # gpt, mlm, text-classifier, encoder, seq2seq-transformer, lstm-attention, ...
    description: str = ""
    text: str = ""  # the input as given (set by ``record``)
    derived: dict = field(default_factory=dict, repr=False, compare=False)  # see ``once``

    def once(self, key: tuple, compute):
        """``compute()`` the first time ``key`` is asked of this recording, the same result
        after: what several tools read of one forward pass (influence, the trace) is computed
        once however many ask (the workbench's panels; ``explore`` and ``influence``). The
        key names the tool, the model and every argument that changes the result."""
        if key not in self.derived:
            self.derived[key] = compute()
        return self.derived[key]

    @property
    def logits(self) -> Tensor | None:
        """The model's output (1, T, vocab), None where it has none."""
        if isinstance(self.output, declare.LaterLogits):
            with torch.no_grad():
                self.output = self.output.rest()
        return self.output

    @property
    def has_logits(self) -> bool:
        """Whether the model has an output (``logits`` is not None), without computing it."""
        return self.output is not None

    @property
    def last_logits(self) -> Tensor | None:
        """The output at the last position (1, vocab), without computing the others."""
        if isinstance(self.output, declare.LaterLogits):
            return self.output.last[:, -1]
        return None if self.output is None else self.output[:, -1]

    @property
    def about(self) -> dict:
        """What the recorded model is: {"kind", "model_type", "description"}."""
        return {"kind": self.kind or self.model_type, "model_type": self.model_type,
                "description": self.description}  # fmt: skip

    # -- attention maps ----------------------------------------------------------------------

    def stack_of(self, name: str) -> str:
        """The stack a cache name belongs to: the longest stack name that prefixes it."""
        best = ""
        for s in self.tokens:
            if s and (name == s or name.startswith(s + ".")) and len(s) > len(best):
                best = s
        return best if best or "" in self.tokens else next(iter(self.tokens))

    def maps(self) -> list[AttentionInfo]:
        """Every attention map in the cache, in recording order."""
        out = []
        for name, t in self.cache.items():
            if not name.endswith(MAP_SUFFIXES) or t.dim() != 4:
                continue
            stack = self.stack_of(name)
            m = LAYER_RE.search(name)
            kind = "cross" if name.endswith("cross.weights") else "self"
            key_stack = stack if kind == "self" else (self.memory_stack or stack)
            S = t.size(-1)
            if (
                kind == "self"
                and self.memory_stack
                and len(self.tokens.get(stack, [])) != S
                and len(self.tokens.get(self.memory_stack, [])) == S
            ):
                kind, key_stack = "cross", self.memory_stack  # e.g. an LSTM decoder's attention
            key_stack = self.key_stacks.get(name, key_stack)
            kind = self.map_kinds.get(name, kind)
            out.append(
                AttentionInfo(
                    name, stack, int(m.group(1)) if m else None, kind, stack, key_stack, t.size(1)
                )
            )
        return out

    def labels(self, name: str) -> tuple[list[str], list[str]]:
        """(query tokens, key tokens) for the attention map ``name``."""
        info = self.map_info(name)
        return self.tokens[info.query_stack], self.tokens[info.key_stack]

    def map_info(self, name: str) -> AttentionInfo:
        for info in self.maps():
            if info.name == name:
                return info
        raise InspectError(
            f"no attention map named {name!r}; recorded: {', '.join(self.map_names())}"
        )

    def map_names(self) -> list[str]:
        return [m.name for m in self.maps()]

    def weights(self, name: str) -> Tensor:
        """The map's weights for the first (only) sequence: (H, T, S)."""
        return self.cache[name][0].float()

    def select(self, layer: int | None = None, name: str | None = None) -> AttentionInfo:
        """Pick one map: ``name`` is an exact cache key, a substring filter (e.g. "decoder") or a
        kind ("self", "cross": an LSTM's ``decoder.attn`` reads the source, so it is cross);
        ``layer`` then picks by block index (default: the first map that passes)."""
        maps = self.maps()
        if not maps:
            about = f": {self.description}" if self.description else ""
            raise InspectError(f"this model has no attention maps{about}")
        if name:
            exact = [m for m in maps if m.name == name]
            maps = exact or [m for m in maps if name in m.name or name == m.kind]
            if not maps:
                raise InspectError(
                    f"no attention map matches {name!r}; recorded: {', '.join(self.map_names())}"
                )
        layered = [m for m in maps if m.layer is not None]
        if layer is None or (not layered and layer == 0):  # an LSTM's one map has no layer
            return maps[0]
        hit = [m for m in maps if m.layer == layer]
        if not hit:
            layers = sorted({m.layer for m in maps if m.layer is not None})
            raise InspectError(f"no layer {layer}; this model has layers {_ranges(layers)}")
        return hit[0]

    def blocks(self, stack: str | None = None) -> list[str]:
        """Prefixes of every block that recorded resid_pre and resid_post, in order
        ("blocks.0.", "encoder.blocks.1.", ...), optionally only those of one stack."""
        out = []
        for name in self.cache:
            if name.endswith("resid_pre"):
                prefix = name[: -len("resid_pre")]
                if prefix + "resid_post" in self.cache and (
                    stack is None or self.stack_of(name) == stack
                ):
                    out.append(prefix)
        return out

    def tokens_of(self, name: str) -> list[str]:
        return self.tokens[self.stack_of(name)]

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s or 'tokens'}={len(t)}" for s, t in self.tokens.items())
        return (
            f"Recording({self.model_type or 'model'}: {sizes}, {len(self.maps())} attention maps)"
        )

    def _repr_html_(self) -> str:
        """In a notebook: what was recorded, each stack's tokens under their positions, and
        the attention maps (name, kind, heads, queries x keys)."""
        import html

        from attnlab.render.display import table_html, tokens_html

        what = html.escape(self.description or self.kind or self.model_type or "a model")
        parts = [f"<div><b>Recording</b> of one forward pass: <i>{what}</i></div>"]
        if self.text:
            parts.append(f"<div>input: <code>{html.escape(self.text)}</code></div>")
        for stack, toks in self.tokens.items():
            parts.append(tokens_html(toks, stack or "tokens"))
        if self.extra.get("translation") is not None:
            parts.append(f"<div>output: <code>{html.escape(str(self.extra['translation']))}"
                         "</code></div>")  # fmt: skip
        maps = self.maps()
        if maps:
            rows = [[m.name, m.kind, m.n_heads,
                     f"{len(self.tokens[m.query_stack])} x {len(self.tokens[m.key_stack])}"]
                    for m in maps]  # fmt: skip
            parts.append(table_html(["attention map", "kind", "heads", "queries x keys"], rows))
        parts.append(f"<div><i>{len(self.cache)} named activations in <code>.cache</code>"
                     "</i></div>")  # fmt: skip
        return "\n".join(parts)


def _ranges(xs: list[int]) -> str:
    if not xs:
        return "none"
    return f"{xs[0]}..{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) else ", ".join(map(str, xs))


def encode_text(model: nn.Module, tokenizer, text: str) -> list[int]:
    """Token ids for ``text``; one clear error if it is empty or longer than the model reads."""
    try:
        return declare.encode_text(model, tokenizer, text)
    except InputError as e:
        raise InspectError(str(e)) from None


@torch.no_grad()
def record(model: nn.Module, tokenizer, text: str) -> Recording:
    """One recorded forward pass over ``text`` (an image path or ``test:N`` for a ViT): the
    model's declaration makes the input ready (``prepare``), ``hooks.record`` captures every
    named activation (attention therefore runs the reference path: the same outputs), and
    ``record_logits`` is kept as the Recording's ``logits`` (a GPT's: computed past the last
    position only when read, and not in the cache); tokens, ids, the memory stack,
    what the model adds (a translation, an image), ``kind`` and ``description`` come from the
    declaration too."""
    if not isinstance(model, ModelKind):
        raise InspectError(f"record reads a model's declaration (attnlab.models.declare); "
                           f"{type(model).__name__} has none")  # fmt: skip
    try:
        p = model.prepare(tokenizer, text, decode=greedy)
    except InputError as e:
        raise InspectError(str(e)) from None
    with hooks.record(model) as cache:
        logits = model.record_logits(p.args)
    return Recording(
        cache,
        {s: list(t) for s, t in p.stack_tokens.items()},
        {s: list(i) for s, i in p.stack_ids.items()},
        memory_stack=model.memory_stack,
        key_stacks=dict(model.key_stacks),
        map_kinds=dict(model.map_kinds),
        output=logits.detach() if isinstance(logits, Tensor) else logits,
        model_type=model.model_type,
        extra=dict(p.shown),
        kind=model.kind,
        description=model.describe(),
        text=text if isinstance(text, str) else "",
    )
