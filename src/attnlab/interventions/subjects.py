"""What an intervention runs on: a model, its tokenizer, and one input made ready to run.

Every intervention (ablation, patching, lens, attribution) needs the same few things from a
model, whatever its kind: run it on an input and get logits (B, T, V) at the positions it
predicts; name its residual stream points and its attention heads; read a token's id. A
``Subject`` answers them from the model's declaration (``attnlab.models.declare``): its stacks,
head groups, ``prepare``, ``forward_logits``, ``readout`` and output vocabulary. It never asks
which kind of model it holds.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.errors import AttnlabError
from attnlab.generation import greedy
from attnlab.models.declare import (
    SPECIAL,
    HeadGroup,
    HeadRef,
    InputError,
    ModelKind,
    Point,
    Prepared,
)
from attnlab.models.encoder import TIED_READOUT_NOTE

__all__ = ["SPECIAL", "TIED_READOUT_NOTE", "HeadGroup", "HeadRef", "InterventionError", "Point",
           "Prepared", "Subject"]  # fmt: skip


class InterventionError(AttnlabError):
    """Input an intervention cannot use: one clear line (the CLI exits 2)."""


def _checked(fn, *args, **kwargs):
    """``fn(...)``, an input the model cannot read as an InterventionError."""
    try:
        return fn(*args, **kwargs)
    except InputError as e:
        raise InterventionError(str(e)) from None


class Subject:
    """A model and its tokenizer, seen the same way by every intervention (see module doc)."""

    def __init__(self, model: nn.Module, tokenizer=None, classes: list[str] | None = None):
        if not isinstance(model, ModelKind):
            raise InterventionError(f"interventions read a model's declaration "
                                    f"(attnlab.models.declare); {type(model).__name__} has none")  # fmt: skip
        self.model = model
        self.tokenizer = tokenizer
        self.kind = model.kind
        self.classes = classes or getattr(tokenizer, "classes", None)
        self.points_by_name = hooks.hook_points(model)

    # -- structure ----------------------------------------------------------------------------

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def stacks(self) -> list[str]:
        """Prefixes of the transformer stacks: "" for one stack, "encoder"/"decoder"."""
        return list(self.model.stacks)

    @property
    def output_stack(self) -> str:
        return self.model.output_stack

    @property
    def input_stack(self) -> str:
        return self.model.input_stack

    def blocks(self, stack: str = "") -> nn.ModuleList:
        return self.model.stack_blocks(stack)

    def n_layers(self, stack: str = "") -> int:
        return len(self.blocks(stack))

    def points(self, stack: str | None = None, sublayers: bool = False) -> list[Point]:
        """Residual stream points of a stack: block inputs and the final output; with
        ``sublayers`` also after each attention (and cross-attention) inside a block."""
        return _checked(self.model.points, stack, sublayers)

    def head_groups(self) -> list[HeadGroup]:
        """Every attention layer with heads, in forward order."""
        return self.model.head_groups()

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
            if parts == ["context"] or (kinds == ["context"] and parts in (["0", "0"],)):
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
        return self.model.output_name(self.tokenizer, self.classes, i)

    def token_id(self, token: str) -> int:
        """The id of ``token`` in the output vocabulary (it must be exactly one token)."""
        return _checked(self.model.output_id, self.tokenizer, self.classes, token)

    # -- inputs -------------------------------------------------------------------------------

    def prepare(self, text: str, decoder_like: Prepared | None = None) -> Prepared:
        """``text`` made ready to run. For an encoder-decoder the decoder reads <bos> + the
        greedy translation of ``text``, or the same decoder input as ``decoder_like``."""
        return _checked(self.model.prepare, self.tokenizer, text, decoder_like, greedy)

    def metric_position(self, p: Prepared, position: int | None, target: int | None) -> int:
        """``position`` checked against the output length, or the default: for an
        encoder-decoder the first position whose clean output is ``target``, else the last."""
        T = len(p.tokens)
        if position is not None:
            if not -T <= position < T:
                raise InterventionError(f"--position {position}: the output has positions "
                                        f"0..{T - 1}")  # fmt: skip
            return position % T
        if self.model.predicts == "decoder-step" and target is not None:
            hits = [i for i, t in enumerate(p.targets.tolist()) if t == target]
            if hits:
                return hits[0]
        return p.position

    # -- running ------------------------------------------------------------------------------

    def forward(self, *args) -> Tensor:
        """Logits (B, T, V) of one forward pass (B, 1, n_classes for classifiers)."""
        return self.model.forward_logits(*args)

    def logits(self, p: Prepared, batch: int = 1) -> Tensor:
        return self.forward(*p.batch(batch))

    def logits_at(self, p: Prepared, position: int, batch: int = 1) -> Tensor:
        """Logits (B, V) at one output position only: the same numbers as
        ``logits(p)[:, position]``, without reading out every other position (a 30k-token
        vocabulary costs as much as the model itself)."""
        return self.model.logits_at(p.batch(batch), position)

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        """What the model's head makes of a residual stream ``h`` (B, T, C): the logit lens.
        Applied to the last block's output it is the model's own logits."""
        return _checked(self.model.readout, h, stack)

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
        return list(self.model.notes)
