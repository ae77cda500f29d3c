"""What an intervention runs on: a model, its tokenizer, and one input made ready to run.

Every intervention (ablation, patching, lens, attribution) needs the same few things from a
model, whatever its kind: run it on an input and get logits (B, T, V) at the positions it
predicts; name its residual stream points and its attention heads; read a token's id. A
``Subject`` answers these for each kind attnlab has, from the hook names the models declare:

    kind       input                           logits read at            residual stream
    gpt        text -> ids (1, T)              every position (next)     blocks.i.resid_*
    mlm        text -> ids, [CLS] .. [SEP]     every position            blocks.i.resid_*
    encoder    (no output head: MiniLM)        every position, through   blocks.i.resid_*
                                               the token embedding
    classify   text -> ids                     [CLS] -> class labels     blocks.i.resid_*
    seq2seq    source text; the decoder reads  every decoder position    encoder.blocks.i.*,
               <bos> + its greedy translation                            decoder.blocks.i.*
    rnn        as seq2seq                      every decoder position    none (an LSTM)
    vit        an image path or test:N         [CLS] -> class labels     blocks.i.resid_*

An encoder without a prediction head (all-MiniLM-L6-v2 is a sentence encoder) is read through
its token embedding, logit(t) = h . E[t]: the readout a masked-LM head would tie to, without
its transform. Results on such a model say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.errors import AttnlabError

KINDS = ("gpt", "mlm", "encoder", "classify", "seq2seq", "rnn", "vit")
SPECIAL = {"[CLS]", "[SEP]", "[MASK]", "[PAD]", "<pad>", "<bos>", "<eos>"}
TIED_READOUT_NOTE = (
    "this encoder has no prediction head: its outputs are read through the token embedding, "
    "logit(t) = h . E[t]"
)


class InterventionError(AttnlabError):
    """Input an intervention cannot use: one clear line (the CLI exits 2)."""


@dataclass(frozen=True)
class HeadGroup:
    """One attention layer's heads: ``kind`` is attn (single stack), encoder, decoder, cross
    or context (an LSTM's one attention); ``path`` the module path whose ``z`` holds the heads."""

    kind: str
    layer: int
    path: str
    n_heads: int

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

    def batch(self, n: int) -> tuple:
        """The arguments repeated ``n`` times along the batch."""
        return tuple(a.expand(n, *a.shape[1:]) for a in self.args)


def model_kind(model: nn.Module) -> str:
    t = getattr(model, "model_type", "")
    if t == "encoder":
        if model.mlm is not None:
            return "mlm"
        return "classify" if model.classifier is not None else "encoder"
    if t in KINDS:
        return t
    raise InterventionError(f"interventions do not know a model of type {t or type(model)!r}")


class Subject:
    """A model and its tokenizer, seen the same way by every intervention (see module doc)."""

    def __init__(self, model: nn.Module, tokenizer=None, classes: list[str] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.kind = model_kind(model)
        self.classes = classes or getattr(tokenizer, "classes", None)
        self.points_by_name = hooks.hook_points(model)

    # -- structure ----------------------------------------------------------------------------

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def stacks(self) -> list[str]:
        """Prefixes of the transformer stacks: "" for one stack, "encoder"/"decoder"."""
        if self.kind == "seq2seq":
            return ["encoder", "decoder"]
        return [] if self.kind == "rnn" else [""]

    @property
    def output_stack(self) -> str:
        return "decoder" if self.kind in ("seq2seq", "rnn") else ""

    @property
    def input_stack(self) -> str:
        return "encoder" if self.kind in ("seq2seq", "rnn") else ""

    def blocks(self, stack: str = "") -> nn.ModuleList:
        return (self.model.get_submodule(stack) if stack else self.model).blocks

    def n_layers(self, stack: str = "") -> int:
        return len(self.blocks(stack))

    def points(self, stack: str | None = None, sublayers: bool = False) -> list[Point]:
        """Residual stream points of a stack: block inputs and the final output; with
        ``sublayers`` also after each attention (and cross-attention) inside a block."""
        stack = self.output_stack if stack is None else stack
        if self.kind == "rnn":
            raise InterventionError(
                "an LSTM has no residual stream (its state is rewritten at every step, not added to)"
            )
        root = f"{stack}.blocks" if stack else "blocks"
        L = self.n_layers(stack)
        out = [Point(stack, 0, f"{root}.0.resid_pre", "embed")]
        for i, block in enumerate(self.blocks(stack)):
            if sublayers:
                out.append(Point(stack, i + 1, f"{root}.{i}.resid_mid", f"{i}.attn"))
                if getattr(block, "cross", None) is not None:
                    out.append(Point(stack, i + 1, f"{root}.{i}.resid_cross", f"{i}.cross"))
            label = f"{i}.mlp" if sublayers else (f"{i + 1}" if i + 1 < L else "final")
            out.append(Point(stack, i + 1, f"{root}.{i}.resid_post", label))
        return out

    def head_groups(self) -> list[HeadGroup]:
        """Every attention layer with heads, in forward order."""
        if self.kind == "rnn":
            if self.model.config.attention == "none":
                return []
            return [HeadGroup("context", 0, "decoder.attn", 1)]
        out = []
        for stack in self.stacks:
            kind = stack or "attn"
            for i, block in enumerate(self.blocks(stack)):
                root = f"{stack}.blocks.{i}" if stack else f"blocks.{i}"
                out.append(HeadGroup(kind, i, f"{root}.attn", block.attn.n_heads))
                if getattr(block, "cross", None) is not None:
                    out.append(HeadGroup("cross", i, f"{root}.cross", block.cross.n_heads))
        return out

    def parse_heads(self, spec: str | list) -> list[HeadRef]:
        """Heads from ``"L.H,L.H"`` (one stack), ``"decoder.L.H"``, ``"cross.L.H"``,
        ``"encoder.L.H"`` (an encoder-decoder), ``"context"`` (an LSTM), or (layer, head)
        tuples. A layer or head that does not exist is an InterventionError."""
        items = spec.split(",") if isinstance(spec, str) else list(spec)
        groups = self.head_groups()
        if not groups:
            raise InterventionError("this model has no attention (an LSTM without attention)")
        kinds = sorted({g.kind for g in groups})
        out = []
        for item in items:
            if isinstance(item, HeadRef):
                out.append(item)
                continue
            if isinstance(item, tuple):
                parts = [str(p) for p in item]
            else:
                parts = item.strip().split(".")
            if parts == ["context"] or (self.kind == "rnn" and parts in (["0", "0"],)):
                parts = ["context", "0", "0"]
            if len(parts) == 2:
                if kinds != ["attn"]:
                    raise InterventionError(
                        f"head {item!r}: this model has {', '.join(kinds)} heads; write "
                        f"{kinds[0]}.LAYER.HEAD"
                    )
                parts = ["attn", *parts]
            if len(parts) != 3 or not parts[1].lstrip("-").isdigit() or not parts[2].isdigit():
                raise InterventionError(f"head {item!r}: expected LAYER.HEAD, e.g. 1.2")
            kind, layer, head = parts[0], int(parts[1]), int(parts[2])
            hit = [g for g in groups if g.kind == kind]
            if not hit:
                raise InterventionError(f"head {item!r}: this model has no {kind} heads "
                                        f"(it has {', '.join(kinds)})")  # fmt: skip
            group = next((g for g in hit if g.layer == layer), None)
            if group is None:
                raise InterventionError(f"head {item!r}: no layer {layer}; this model has "
                                        f"layers 0..{hit[-1].layer}")  # fmt: skip
            if not 0 <= head < group.n_heads:
                raise InterventionError(f"head {item!r}: no head {head}; layer {layer} has heads "
                                        f"0..{group.n_heads - 1}")  # fmt: skip
            out.append(HeadRef(group, head))
        return out

    # -- tokens -------------------------------------------------------------------------------

    @property
    def output_vocab(self):
        """The tokenizer whose ids the logits index (the target side of an encoder-decoder)."""
        return getattr(self.tokenizer, "target", self.tokenizer)

    def decode(self, i: int) -> str:
        if self.kind in ("classify", "vit"):
            return self.classes[i] if self.classes and i < len(self.classes) else str(i)
        if self.kind in ("seq2seq", "rnn"):
            return self.tokenizer.target_tokens([i])[0]
        return self.tokenizer.decode([i]) if self.tokenizer is not None else str(i)

    def token_id(self, token: str) -> int:
        """The id of ``token`` in the output vocabulary (it must be exactly one token)."""
        if self.kind in ("classify", "vit"):
            names = list(self.classes or [])
            if token in names:
                return names.index(token)
            n = self.model.config.n_classes if self.kind == "vit" else self.model.config.num_labels
            if not names and token.isdigit() and int(token) < n:
                return int(token)  # a run that does not name its classes: class ids
            raise InterventionError(f"{token!r} is not a class of this model; classes: "
                                    f"{', '.join(names) or 'unknown'}")  # fmt: skip
        tok = self.output_vocab
        if tok is None:
            raise InterventionError("this run has no tokenizer, so it cannot read a token")
        inner = getattr(tok, "tok", None)  # a Hugging Face tokenizer: look the token up
        if inner is not None and inner.token_to_id(token) is not None:
            ids = [inner.token_to_id(token)]
        elif inner is not None:
            ids = tok.encode(token, add_special_tokens=False)
        else:
            try:
                ids = tok.encode(token)
            except Exception as e:
                raise InterventionError(f"target {token!r}: {e}") from None
        if len(ids) != 1:
            raise InterventionError(
                f"{token!r} is {len(ids)} tokens in this vocabulary; give exactly one token"
            )
        return ids[0] + (3 if self.kind in ("seq2seq", "rnn") else 0)

    # -- inputs -------------------------------------------------------------------------------

    def prepare(self, text: str, decoder_like: Prepared | None = None) -> Prepared:
        """``text`` made ready to run. For an encoder-decoder the decoder reads <bos> + the
        greedy translation of ``text``, or the same decoder input as ``decoder_like``."""
        from attnlab.inspect.recording import InspectError, encode_text, token_strings

        dev = self.device
        try:
            if self.kind == "vit":
                return self._prepare_image(text)
            if self.kind in ("seq2seq", "rnn"):
                return self._prepare_pair(text, decoder_like)
            ids = encode_text(self.model, self.tokenizer, text)
        except InspectError as e:
            raise InterventionError(str(e)) from None
        toks = token_strings(self.tokenizer, text, ids)
        x = torch.tensor([ids], dtype=torch.long, device=dev)  # (1, T)
        T = len(ids)
        targets = torch.full((T,), -100, dtype=torch.long)
        if self.kind == "gpt":
            targets[:-1] = torch.tensor(ids[1:])  # position t predicts token t + 1
            position = T - 1
        elif self.kind in ("mlm", "encoder"):
            keep = [i for i, t in enumerate(toks) if t not in SPECIAL]
            targets[keep] = torch.tensor([ids[i] for i in keep], dtype=torch.long)
            masks = [i for i, t in enumerate(toks) if t == "[MASK]"]
            position = masks[0] if masks else (keep[-1] if keep else T - 1)
        else:  # classify: one output, at [CLS]
            targets = torch.full((1,), -100, dtype=torch.long)
            position = 0
        p = Prepared(text, (x,), toks, list(ids), toks, targets, position)
        if self.kind == "classify":
            p.tokens, p.ids = ["[CLS]"], [ids[0]]
            with torch.no_grad():
                p.targets = self.logits(p)[0, 0].argmax()[None].cpu()  # the model's own answer
        return p

    def _prepare_image(self, text: str) -> Prepared:
        tok = self.tokenizer
        if tok is None or not hasattr(tok, "read"):
            raise InterventionError("this ViT run has no image tokenizer (tokenizer.json)")
        from attnlab.data import DataError

        try:
            image, label = tok.read(text)  # (C, H, W)
        except DataError as e:
            raise InterventionError(str(e)) from None
        x = image[None].to(self.device)
        p = Prepared(text, (x,), ["[CLS]"], [0], self.model.token_labels(),
                     torch.full((1,), -100), 0, {"image": image, "label": label})  # fmt: skip
        with torch.no_grad():
            pred = int(self.logits(p)[0, 0].argmax())
        truth = self.classes.index(label) if label is not None and self.classes else pred
        p.targets = torch.tensor([truth])
        return p

    def _prepare_pair(self, text: str, like: Prepared | None) -> Prepared:
        from attnlab.generation import greedy, pad_ids
        from attnlab.tokenizers import BOS, EOS

        tok, dev = self.tokenizer, self.device
        src_ids = tok.encode_source(text)
        limit = getattr(self.model.config, "max_len", None)
        if limit and len(src_ids) > limit:
            raise InterventionError(f"the source is {len(src_ids)} tokens; this model reads at "
                                    f"most {limit}")  # fmt: skip
        src = pad_ids([src_ids], device=dev)  # (1, S)
        if like is not None:
            tgt_in, out = like.args[1], like.extra["output"]
        else:
            out = greedy(self.model, src)[0]
            tgt_in = pad_ids([[BOS, *out]], device=dev)  # (1, T)
        targets = torch.tensor([*out, EOS])
        dec_ids = tgt_in[0].tolist()
        return Prepared(text, (src, tgt_in), tok.target_tokens(dec_ids), dec_ids,
                        tok.source_tokens(src_ids), targets, len(dec_ids) - 1,
                        {"output": out, "translation": tok.decode_target(out)})  # fmt: skip

    def metric_position(self, p: Prepared, position: int | None, target: int | None) -> int:
        """``position`` checked against the output length, or the default: for an
        encoder-decoder the first position whose clean output is ``target``, else the last."""
        T = len(p.tokens)
        if position is not None:
            if not -T <= position < T:
                raise InterventionError(f"--position {position}: the output has positions "
                                        f"0..{T - 1}")  # fmt: skip
            return position % T
        if self.kind in ("seq2seq", "rnn") and target is not None:
            hits = [i for i, t in enumerate(p.targets.tolist()) if t == target]
            if hits:
                return hits[0]
        return p.position

    # -- running ------------------------------------------------------------------------------

    def forward(self, *args) -> Tensor:
        """Logits (B, T, V) of one forward pass (B, 1, n_classes for classifiers)."""
        m = self.model
        if self.kind == "gpt":
            return m(args[0])
        if self.kind == "mlm":
            return m.mlm_logits(args[0])
        if self.kind == "encoder":
            return self.readout(m(args[0]))
        if self.kind == "classify":
            return m.classify(args[0])[:, None]
        if self.kind == "vit":
            return m(args[0])[:, None]
        return m(*args)  # seq2seq, rnn: (src, tgt_in)

    def logits(self, p: Prepared, batch: int = 1) -> Tensor:
        return self.forward(*p.batch(batch))

    def logits_at(self, p: Prepared, position: int, batch: int = 1) -> Tensor:
        """Logits (B, V) at one output position only: the same numbers as
        ``logits(p)[:, position]``, without reading out every other position (a 30k-token
        vocabulary costs as much as the model itself)."""
        m, args = self.model, p.batch(batch)
        if self.kind == "mlm":
            return m.mlm(m(args[0])[:, position])
        if self.kind == "encoder":
            return self.readout(m(args[0])[:, position : position + 1])[:, 0]
        return self.forward(*args)[:, position]

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        """What the model's head makes of a residual stream ``h`` (B, T, C): the logit lens.
        Applied to the last block's output it is the model's own logits."""
        m = self.model
        if self.kind == "gpt":
            return m.readout(h)
        if self.kind == "mlm":
            return m.mlm(m.ln_f(h))
        if self.kind == "encoder":
            return m.ln_f(h) @ m.tok_embed.weight.T  # (B, T, V) the tied readout
        if self.kind == "classify":
            return m.classifier(m.pooled(m.ln_f(h)))[:, None]
        if self.kind == "vit":
            return m.head(m.ln_f(h)[:, 0])[:, None]
        if self.kind == "seq2seq":
            if (stack or "decoder") != "decoder":
                raise InterventionError("only the decoder's residual stream reaches the logits")
            d = m.decoder
            return d.lm_head(d.ln_f(h))
        raise InterventionError("an LSTM has no residual stream to read logits from")

    def loss(self, logits: Tensor, p: Prepared) -> Tensor:
        """Cross-entropy per output position (B, T); 0 where there is no target. GPT: the next
        token; a masked LM: each token at its own (unmasked) position; an encoder-decoder: the
        clean greedy translation, <eos> last; a classifier: the true or the clean class."""
        B, T, V = logits.shape
        targets = p.targets.to(logits.device).expand(B, T)
        ce = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1),
                             ignore_index=-100, reduction="none")  # fmt: skip
        return ce.view(B, T)

    def mean_loss(self, logits: Tensor, p: Prepared) -> Tensor:
        """(B,) the mean cross-entropy over positions that have a target."""
        n = (p.targets != -100).sum().clamp(min=1)
        return self.loss(logits, p).sum(-1) / n

    @property
    def notes(self) -> list[str]:
        return [TIED_READOUT_NOTE] if self.kind == "encoder" else []


def load_subject(run: str, device: str = "cpu") -> Subject:
    """The run directory's model and tokenizer on ``device``, as a Subject (class names from
    config.json)."""
    from attnlab.checkpoint import load_run, read_run_config

    model, tokenizer = load_run(run, device)
    return Subject(model, tokenizer, read_run_config(run).get("labels"))
