"""attnlab's layers only point down (shared/DESIGN.md, "Layers").

Every module under src/attnlab is read with ``ast`` (nothing is imported, so this takes well
under a second): each ``import`` and ``from ... import`` statement, those inside functions and
under ``if TYPE_CHECKING:`` included, is an edge from the importing module to the attnlab module
it names. An edge must point to a lower layer of LAYERS, or sideways within one layer; the
modules must have no import cycle; and no module imports another module's private (``_name``)
names. Run it alone to see the layering:

    python -m pytest -q tests/unit/test_layers.py

Each violation prints as ``a.py -> b.py (layer X above layer Y)``. KNOWN lists the violations
that branches in flight remove; the test fails when one of them no longer occurs, so the list
only shrinks.
"""

from __future__ import annotations

import ast
import fnmatch
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Top to bottom. A module belongs to the first layer with a pattern that matches its dotted
# name (a package is its __init__.py). A module no pattern matches fails the test: place it.
LAYERS: list[tuple[str, list[str]]] = [
    # What a user calls: the command line, the demo, and the package root (its lazy exports and
    # TYPE_CHECKING imports name modules of every layer).
    (
        "front",
        [
            "attnlab",
            "attnlab.__main__",
            "attnlab.cli",
            "attnlab.cli.*",
            "attnlab.demo",
            "attnlab.experiments",
            "attnlab.experiments.*",
            "attnlab.serve",
            "attnlab.serve.*",
        ],
    ),
    # The doors to a run: Run (open, predict, score, generate), and Hugging Face in and out.
    ("verbs", ["attnlab.run", "attnlab.interop", "attnlab.interop.*"]),
    # Reading models: recording, pictures of attention, head scores and snapshots, and the
    # interventions (ablate, patch, lens, DLA, ...). embeddings.py (the embed verb's vectors)
    # reads an encoder's hidden states as inspect/ does.
    (
        "inspect",
        [
            "attnlab.inspect",
            "attnlab.inspect.*",
            "attnlab.interventions",
            "attnlab.interventions.*",
            "attnlab.embeddings",
        ],
    ),  # fmt: skip
    # The one training loop and what it is made of, the train verb that plans a run and wires
    # the loop's callbacks (snapshots, with the head scores they take: training/probes.py). The
    # run directory object it writes through lives in rundir/, below.
    ("training", ["attnlab.training", "attnlab.training.*"]),
    # Data, loss, figures, predict and score per task; evaluation.py is the scored figures
    # (Evaluation, Figure) every task's score returns.
    ("tasks", ["attnlab.tasks", "attnlab.tasks.*", "attnlab.evaluation"]),
    # The run directory (the one package that knows its files): reading and checking config.json,
    # the tokenizer and the weights, building the model they describe, and the locked writer.
    ("rundir", ["attnlab.rundir", "attnlab.rundir.*"]),
    # Decoding any model: greedy, sampling, beam search, speaking the decoding protocol alone.
    ("generation", ["attnlab.generation"]),
    # The architectures and their declarations.
    ("models", ["attnlab.models", "attnlab.models.*"]),
    # What models are built from: attention and its masks, blocks, positions, norms, hook points; the
    # eval-mode context; checks.py, the causality and decoding checks the models' own
    # conformance methods call; decoding.py, the decoding protocol a model declares its decoder
    # by, and a GPT's decoder (its KV cache, windows and FastForward).
    (
        "components",
        [
            "attnlab.attention",
            "attnlab.blocks",
            "attnlab.positional",
            "attnlab.norms",
            "attnlab.hooks",
            "attnlab.modes",
            "attnlab.checks",
            "attnlab.decoding",
        ],
    ),  # fmt: skip
    # Data: corpora, token files and shards, generated tasks, images (it encodes with the
    # tokenizers below; a ViT run's image "tokenizer" is read by the run directory's reader).
    ("data", ["attnlab.data", "attnlab.data.*"]),
    # Leaves anything may use: files and the safetensors header, tokenizers, metrics,
    # rendering (tables, heatmaps, PNG), the runtime (threads, device), progress heartbeats.
    (
        "base",
        [
            "attnlab.files",
            "attnlab.safetensors_io",
            "attnlab.tokenizers",
            "attnlab.metrics",
            "attnlab.render",
            "attnlab.render.*",
            "attnlab.runtime",
            "attnlab.heartbeat",
        ],
    ),  # fmt: skip
    # Self-validating configs (TrainConfig too: tasks state their defaults with it), the
    # root of every user error
    # and the one way things of a sort register (registry.py).
    ("config", ["attnlab.config", "attnlab.train_config", "attnlab.errors", "attnlab.registry"]),
]

# Modules placed above that land with branches being merged now; absent until then. Remove a
# name once its module exists (the test says when).
COMING: set[str] = set()

# Violations that branches in flight remove, as (importer, imported) file paths under attnlab/.
KNOWN: dict[tuple[str, str], str] = {}


def _private(name: str) -> bool:
    """``_name`` is a module's own; ``__name__``-style names are Python's, anyone's to read."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "attnlab").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The attnlab module a dotted name is, or is inside of (a name imported from it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path):
    """(imported module, line, private names) for each attnlab import in ``module``'s file,
    and (line, "alias._name") for each private attribute read through an imported module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                target = _resolve(a.name)
                if target:
                    edges.append((target, node.lineno, []))
                    if a.asname:
                        aliases[a.asname] = target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if not base.startswith("attnlab"):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in MODULES:  # a submodule: ``from attnlab import hooks``
                    edges.append((full, node.lineno, []))
                    aliases[a.asname or a.name] = full
                elif base == "attnlab" and a.name == "__version__":
                    continue  # a constant of the package root, imported before any submodule
                else:
                    private = [a.name] if _private(a.name) else []
                    edges.append((_resolve(base), node.lineno, private))
    private_reads = [
        (node.lineno, f"{node.value.id}.{node.attr}")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and _private(node.attr)
        and aliases[node.value.id] != module
    ]
    return [e for e in edges if e[0] and e[0] != module], private_reads


def _layer_of(module: str) -> int | None:
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return i
    return None


def _file(module: str) -> str:
    return MODULES[module].relative_to(SRC / "attnlab").as_posix()


GRAPH: dict[str, dict[str, int]] = {}  # module -> {imported module: first line}
PRIVATE: list[str] = []
for _m, _p in MODULES.items():
    _edges, _reads = _imports(_m, _p)
    GRAPH[_m] = {}
    for _target, _line, _names in _edges:
        GRAPH[_m].setdefault(_target, _line)
        PRIVATE += [f"{_file(_m)}:{_line} imports {_target}.{n}" for n in _names]
    PRIVATE += [f"{_file(_m)}:{_line} reads {attr}" for _line, attr in _reads]


def _upward() -> dict[tuple[str, str], str]:
    out = {}
    for a, targets in GRAPH.items():
        for b, line in targets.items():
            la, lb = _layer_of(a), _layer_of(b)
            if la is not None and lb is not None and lb < la:
                out[(_file(a), _file(b))] = (
                    f"{_file(a)} -> {_file(b)} (layer {LAYERS[lb][0]} above layer "
                    f"{LAYERS[la][0]}; line {line})"
                )
    return out


def _cycles(skip: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), ignoring edges in
    ``skip`` (file pairs): each is at least one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if (_file(v), _file(w)) in skip:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(_file(m) for m in comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _layer_of(m) is None)
    assert not missing, f"modules with no layer (add each to LAYERS): {missing}"


def test_every_layer_entry_names_a_module():
    for name, patterns in LAYERS:
        for p in patterns:
            matched = any(fnmatch.fnmatchcase(m, p) for m in MODULES)
            if p in COMING:
                assert not matched, f"{p} exists now: remove it from COMING"
            else:
                assert matched, f"layer {name}: {p} matches no module (stale entry?)"


def test_imports_only_point_down():
    new = sorted(v for k, v in _upward().items() if k not in KNOWN)
    assert not new, "imports that run back up the layers:\n" + "\n".join(new)


def test_every_known_violation_still_occurs():
    """So that KNOWN only shrinks: an entry whose import is gone must be removed."""
    upward = _upward()
    gone = sorted(f"{a} -> {b}" for (a, b) in KNOWN if (a, b) not in upward)
    assert not gone, "KNOWN entries that no longer occur (remove them):\n" + "\n".join(gone)


def test_no_import_cycles():
    cycles = _cycles(skip=set(KNOWN))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_module_imports_another_modules_private_names():
    assert not PRIVATE, "private names used across modules:\n" + "\n".join(PRIVATE)


def test_the_walk_sees_imports_inside_functions():
    """A lazy import (inside a function) is an edge too: cli/train.py imports training only
    inside ``run``."""
    assert "attnlab.training.run" in GRAPH["attnlab.cli.train"]


def layering() -> str:
    """The layers top to bottom with their modules, and each layer's imports of lower ones."""
    rows = defaultdict(list)
    for m in MODULES:
        rows[_layer_of(m)].append(_file(m))
    lines = []
    for i, (name, _) in enumerate(LAYERS):
        below = sorted({LAYERS[_layer_of(b)][0] for m in MODULES if _layer_of(m) == i
                        for b in GRAPH[m] if _layer_of(b) not in (None, i)})  # fmt: skip
        lines.append(f"{name}: {' '.join(sorted(rows[i]))}")
        lines.append(f"    imports from: {', '.join(below) or '-'}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(layering())
