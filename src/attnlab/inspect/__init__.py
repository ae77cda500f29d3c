"""Look inside a model: trace a forward pass, attention maps, similarity, contextual influence,
an HTML explorer and a conformance check. Every tool reads a ``Recording`` (see
``attnlab.inspect.recording`` for the protocol a model implements) and returns a result object
that prints in the terminal, converts to JSON (``to_dict``) and displays itself in Jupyter.

    from attnlab.inspect import record, trace, attention
    rec = record(model, tokenizer, "I like to eat apples")
    attention(rec, layer=0, head=2)          # a labelled token x token heatmap in a notebook
"""

from attnlab.inspect.attention import AttentionGrid, AttentionMap, attention, attention_grid
from attnlab.inspect.by_hand import (
    HandMatrices,
    MatrixError,
    Settings,
    Walk,
    parse_matrix,
    random_matrices,
    read_matrix,
    walk,
)
from attnlab.inspect.check import CheckReport, CheckResult, check
from attnlab.inspect.explorer import Explorer, explore
from attnlab.inspect.influence import Influence, InfluenceRow, influence
from attnlab.inspect.recording import (
    AttentionInfo,
    InspectError,
    Recording,
    record,
)
from attnlab.inspect.similarity import Similarity, similarity
from attnlab.inspect.source_attention import (
    SideBySide,
    SourceAttention,
    side_by_side,
    source_attention,
)
from attnlab.inspect.trace import Step, Trace, trace
from attnlab.inspect.what_if import WhatIf, what_if, what_if_by_hand

__all__ = [
    "AttentionGrid",
    "AttentionInfo",
    "AttentionMap",
    "CheckReport",
    "CheckResult",
    "Explorer",
    "HandMatrices",
    "MatrixError",
    "Settings",
    "SideBySide",
    "SourceAttention",
    "Walk",
    "WhatIf",
    "parse_matrix",
    "random_matrices",
    "read_matrix",
    "side_by_side",
    "source_attention",
    "walk",
    "what_if",
    "what_if_by_hand",
    "Influence",
    "InfluenceRow",
    "InspectError",
    "Recording",
    "Similarity",
    "Step",
    "Trace",
    "attention",
    "attention_grid",
    "check",
    "explore",
    "influence",
    "record",
    "similarity",
    "trace",
    "write_figures",
]


def write_figures(model, tokenizer, text: str, out_dir, layer: int = 0, head: int = 0):
    """Write ``attention.png`` (one head) and ``explorer.html`` for ``text`` into ``out_dir``
    (what ``make demo`` ends with). Returns the two paths."""
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rec = record(model, tokenizer, text)
    png = attention(rec, layer=layer, head=head).save_png(out_dir / "attention.png")
    page = explore(rec, model, title=f"attnlab explorer: {text}", tokenizer=tokenizer)
    html = page.save(out_dir / "explorer.html")
    return png, html
