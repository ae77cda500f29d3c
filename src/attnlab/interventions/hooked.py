"""What ``Run.hooks`` returns: one forward pass's recorded activations, edited where asked.

h = run.hooks("I like to eat apples", ["blocks.0.attn.weights"])
h.cache["blocks.0.attn.weights"]          # (1, H, T, S)
h.logits                                  # the output with the edits applied
h.log.describe()                          # how many values each edit changed
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnlab.interventions.edits import EditLog
from attnlab.render.display import Result, table_html


@dataclass
class Hooked(Result):
    text: str
    tokens: list[str]  # the input's tokens
    cache: dict[str, Tensor]  # hook name -> the activation recorded (detached)
    logits: Tensor  # the model's output, with the edits applied
    log: EditLog  # per edited hook: calls, values changed, values seen

    def rows(self) -> list[list]:
        return [[name, " x ".join(map(str, t.shape))] for name, t in self.cache.items()]

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        t = FitTable()
        t.add_column("recorded")
        t.add_column("shape", justify="right")
        for row in self.rows():
            t.add_row(*row)
        return Group(Text(f"{self.text!r}: {len(self.tokens)} tokens", style="bold"), t,
                     Text(f"edits: {self.log.describe()}", style="dim"))  # fmt: skip

    def to_dict(self) -> dict:
        return {"text": self.text, "tokens": self.tokens,
                "recorded": {n: list(t.shape) for n, t in self.cache.items()},
                "logits_shape": list(self.logits.shape), "edits": self.log.to_dict()}  # fmt: skip

    def _repr_html_(self) -> str:
        return table_html(["recorded", "shape"], self.rows(), title=repr(self.text),
                          caption=f"edits: {self.log.describe()}")  # fmt: skip
