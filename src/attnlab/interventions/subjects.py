"""What an intervention runs on: a model, its tokenizer, and one input made ready to run.

Every intervention (ablation, patching, lens, attribution) needs the same few things from a
model, whatever its kind: run it on an input and get logits (B, T, V) at the positions it
predicts; name its residual stream points and its attention heads; read a token's id. The
model's declaration (``attnlab.models.declare.ModelKind``, the one view of a model that
``inspect/`` reads too) answers every one of them: its stacks, head groups and their names
(``parse_heads``), ``prepare`` (and the prepared input's ``loss``), ``metric_position``,
``forward_logits``, ``readout`` and output vocabulary. A ``Subject`` is that view bound to a
tokenizer and class names: each of its methods hands the question to the model with them, and
turns an input the model cannot read into an InterventionError. It decides nothing itself
(tests/unit/test_model_probes.py checks that each method is one delegating statement).
"""

from __future__ import annotations

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
        """Heads from ``"L.H,L.H"``, ``"decoder.L.H"``, ``"cross.L.H"``, ``"encoder.L.H"``,
        ``"context"`` or (layer, head) tuples (``ModelKind.parse_heads``)."""
        return _checked(self.model.parse_heads, spec)

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
        """``position`` checked, or the model's default (``ModelKind.metric_position``)."""
        return _checked(self.model.metric_position, p, position, target)

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
        """Cross-entropy per output position (B, T), 0 where there is no target
        (``Prepared.loss``)."""
        return p.loss(logits)

    def mean_loss(self, logits: Tensor, p: Prepared) -> Tensor:
        """(B,) the mean cross-entropy over positions that have a target."""
        return p.mean_loss(logits)

    @property
    def notes(self) -> list[str]:
        return list(self.model.notes)
