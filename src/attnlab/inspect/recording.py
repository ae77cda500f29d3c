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

2. Provide ``record_text(tokenizer, text) -> Recording``. GPT has one. ``record_text`` below is
   the generic default for any single-stack model called as ``model(ids)`` with ids (1, T): an
   encoder-only model gets it for free (call ``record_text(model, tokenizer, text)``). A
   seq2seq model overrides it and fills ``tokens`` with one list per stack, e.g.
   ``{"encoder": src_tokens, "decoder": tgt_tokens}``, and sets ``memory_stack="encoder"``
   (the stack cross-attention reads its keys from).

3. Declare capabilities as class attributes, read by ``attnlab.inspect.check``:

   ``causal``          True if output t may depend on inputs 0..t only (GPT). Default False.
   ``uses_padding``    True if the model masks padded keys. It then needs ``pad_id`` (int):
                       positions whose id equals ``pad_id`` must not change other outputs.
   ``new_cache(batch, max_len)`` and ``forward(ids, cache=...)``: incremental decoding, checked
                       against a full forward pass.
   ``conformance_forward(ids) -> Tensor (B, T, ...)``: optional; what the checks call. Default:
                       ``model(ids)`` (the first element if it returns a tuple). A seq2seq model
                       defines it to run the decoder on ``ids`` with a fixed source.
   ``conformance_inputs(batch, seed) -> Tensor``: optional; the random inputs the checks use
                       instead of random token ids (a ViT returns random images (B, C, H, W)).

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
from attnlab.hooks import ActivationCache

MAP_SUFFIXES = ("attn.weights", "cross.weights")
LAYER_RE = re.compile(r"(?:^|\.)(?:blocks|layers)\.(\d+)\.")  # blocks.3.attn.weights -> 3


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
    ``logits`` is the model's output (1, T, vocab) where it has one. ``extra`` holds what a
    model adds (an encoder-decoder: ``translation`` and ``predicted`` decoder tokens; a ViT: the
    ``image``). ``kind`` and ``description`` say what the model is (``model.kind`` and
    ``model.describe()``); every tool's JSON carries them as ``about``.
    """

    cache: ActivationCache
    tokens: dict[str, list[str]]
    ids: dict[str, list[int]] = field(default_factory=dict)
    memory_stack: str | None = None
    logits: Tensor | None = None
    model_type: str = ""
    key_stacks: dict[str, str] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # model-specific: e.g. a translation and its tokens
    kind: str = ""  # gpt, mlm, text-classifier, encoder, seq2seq-transformer, lstm-attention, ...
    description: str = ""
    text: str = ""  # the input as given (set by ``record``)

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


def token_strings(tokenizer, text: str, ids: list[int]) -> list[str]:
    """Labels for ``ids``: the tokenizer's own token strings when they line up, else decode."""
    try:
        toks = list(tokenizer.tokens(text))
    except Exception:
        toks = []
    if len(toks) != len(ids):
        toks = [tokenizer.decode([i]) for i in ids]
    return toks


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
        raise InspectError("this run has no tokenizer.json, so it cannot read text")
    ids = tokenizer.encode(text)
    if not ids:
        raise InspectError("the text has no tokens")
    limit = max_positions(model)
    if limit is not None and len(ids) > limit:
        raise InspectError(
            f"the text is {len(ids)} tokens; this model reads at most {limit} "
            "(its block_size): shorten it"
        )
    return ids


def output_tensor(out) -> Tensor:
    """The main output of a model call: the tensor itself, or a tuple's first element."""
    if isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, dict):
        out = out.get("logits", next(iter(out.values())))
    return out


@torch.no_grad()
def record_text(model: nn.Module, tokenizer, text: str) -> Recording:
    """Generic recording for a single-stack model called as ``model(ids)`` with ids (1, T).

    Every hook is recorded; attention therefore runs the reference path (same outputs).
    """
    ids = encode_text(model, tokenizer, text)
    device = next(model.parameters()).device
    x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    with hooks.record(model) as cache:
        logits = output_tensor(model(x))
    return Recording(
        cache,
        {"": token_strings(tokenizer, text, ids)},
        {"": ids},
        logits=logits.detach(),
        model_type=getattr(model, "model_type", ""),
    )


@torch.no_grad()
def record_translation(model: nn.Module, tokenizer, text: str, max_len: int | None = None):
    """An encoder-decoder's recording: translate ``text`` greedily, then record one
    teacher-forced pass on (source, output).

    Attention maps by name, (1, H, T, S); tokens {"encoder": source tokens, "decoder": decoder
    input tokens, <bos> first}; cross-attention reads the "encoder" stack; ``extra`` holds
    ``predicted`` (the token each decoder position produced, <eos> last) and ``translation``.
    """
    from attnlab.generation import BOS, EOS, greedy, pad_ids

    device = next(model.parameters()).device
    src_ids = tokenizer.encode_source(text)
    src = pad_ids([src_ids], device=device)
    out = greedy(model, src, max_len)[0]
    tgt_in = pad_ids([[BOS, *out]], device=device)
    logits, acts = model(src, tgt_in, record=True)
    return Recording(
        acts,
        {
            "encoder": tokenizer.source_tokens(src_ids),
            "decoder": tokenizer.target_tokens([BOS, *out]),
        },
        ids={"encoder": list(src_ids), "decoder": [BOS, *out]},
        memory_stack="encoder",
        logits=logits.detach(),
        model_type=model.model_type,
        extra={
            "predicted": tokenizer.target_tokens([*out, EOS]),
            "translation": tokenizer.decode_target(out),
        },
    )


def record(model: nn.Module, tokenizer, text: str) -> Recording:
    """The model's own ``record_text`` if it has one, else the generic single-stack default;
    ``kind`` and ``description`` are filled from the model when it declares them."""
    rec = (
        model.record_text(tokenizer, text)
        if hasattr(model, "record_text")
        else record_text(model, tokenizer, text)
    )
    rec.kind = rec.kind or getattr(model, "kind", "") or rec.model_type
    rec.text = rec.text or (text if isinstance(text, str) else "")
    if not rec.description and hasattr(model, "describe"):
        rec.description = model.describe()
    return rec
