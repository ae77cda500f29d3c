"""A new model kind, defined here and registered, works with every verb and no other change."""

from __future__ import annotations

import dataclasses

import pytest
from test_conformance import build_run, conformance
from torch import Tensor, nn

from attnlab.blocks import Block
from attnlab.config import BaseConfig
from attnlab.hooks import Hook
from attnlab.models.declare import REGISTRY, ModelKind, Unembed, register


@dataclasses.dataclass
class ToyConfig(BaseConfig):
    vocab_size: int = 32
    d_model: int = 16
    n_head: int = 2
    block_size: int = 32
    num_labels: int = 2


class Toy(ModelKind, nn.Module):
    model_type, kind, config_class, predicts = "toy", "toy-classifier", ToyConfig, "class"
    hook_points = {"embed": "token embeddings", "pos": "positions", "blocks.0.*": "the block"}
    examples = (dict(num_labels=2),)

    def __init__(self, config: ToyConfig):
        super().__init__()
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = nn.Embedding(c.block_size, c.d_model)
        self.blocks = nn.ModuleList([Block(c.d_model, c.n_head, causal=False)])
        self.ln_f = nn.LayerNorm(c.d_model)
        self.classifier = nn.Linear(c.d_model, c.num_labels)
        self.hook_embed, self.hook_pos = Hook(), Hook()

    def forward(self, ids: Tensor, mask=None, head=None) -> Tensor:  # as the classify task calls
        pos = self.pos_embed.weight[: ids.size(1)]  # (T, C)
        x = self.hook_embed(self.tok_embed(ids)) + self.hook_pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.readout(x)[:, 0]

    def describe(self) -> str:
        return "a toy: one bidirectional block, its class read from the first token"

    def forward_logits(self, ids: Tensor) -> Tensor:
        return self(ids)[:, None]  # (B, 1, classes): one output position

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        return self.classifier(self.ln_f(h)[:, 0])[:, None]

    def dla_readout(self) -> list:
        return [Unembed(self.classifier.weight, self.classifier.bias, "classifier.bias")]


@pytest.fixture
def toy():
    cls = register(Toy)
    yield cls
    REGISTRY.pop("toy")


def test_a_kind_defined_in_a_test_runs_every_verb_and_keeps_the_identities(toy, tmp_path, capsys):
    run = build_run(toy, toy.examples[0], tmp_path / "run",
                    {"task": "classify", "labels": ["river", "money"]})  # fmt: skip
    data = tmp_path / "labelled.tsv"
    data.write_text("river\tthe bank of the river\nmoney\tthe bank of the green\n")
    out = conformance(capsys, run, data)
    assert {"trace", "attention", "lens", "dla", "patch", "ablate", "importance", "predict",
            "eval"} <= set(out)  # fmt: skip
    assert out["trace"]["about"]["kind"] == "toy-classifier"
    assert out["predict"]["predictions"][0]["classes"][0]["label"] in ("river", "money")
