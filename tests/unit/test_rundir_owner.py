"""One package owns the run directory: no module outside attnlab/rundir/ builds the path of a
run's file from its name (``run_dir / "config.json"``, ``open("trainer_state.json")``); they call
the package (``rundir.read_trainer_state``, ``rundir.CONFIG_FILE``, ...). Read with ``ast``, as
tests/unit/test_layers.py reads the imports."""

from __future__ import annotations

import ast
from pathlib import Path

from attnlab.rundir import layout

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"

# every name layout.py gives, but explorer.html: also the explorer's template (a resource of
# attnlab.inspect) and the page a quick look writes into a folder of the caller's
RUN_NAMES = {value for name, value in vars(layout).items() if name.isupper()
             and isinstance(value, str) and name not in ("SNAPSHOT_PREFIX", "EXPLORER_FILE")}  # fmt: skip
# A Hugging Face model directory has files of the same names (config.json, model.safetensors,
# tokenizer.json): interop/ reads and writes those, in Hugging Face's format, not a run's.
HF_NAMES = {layout.CONFIG_FILE, layout.MODEL_FILE, layout.TOKENIZER_FILE}


def _named_paths(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every path built from a run file's name: ``x / "name"``,
    ``Path("name")``, ``open("name")``, ``x.joinpath("name")``."""
    found = []
    for node in ast.walk(tree):
        args: list[ast.AST] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            args = [node.right]
        elif isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in ("Path", "open", "joinpath"):
                args = list(node.args)
        for a in args:
            if isinstance(a, ast.Constant) and a.value in RUN_NAMES:
                found.append((node.lineno, a.value))
    return found


def test_no_module_outside_the_package_names_a_run_file():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("rundir/"):
            continue
        for line, name in _named_paths(ast.parse(path.read_text(encoding="utf-8"))):
            if rel.startswith("interop/") and name in HF_NAMES:
                continue
            bad.append(f"{rel}:{line} names {name}")
    assert not bad, "run files named outside attnlab/rundir:\n" + "\n".join(bad)


def test_the_check_sees_a_named_run_file():
    tree = ast.parse('from pathlib import Path\nx = Path("r") / "trainer_state.json"\n'
                     'y = open("metrics.jsonl")\nz = Path("r") / "notes.txt"\n')  # fmt: skip
    assert _named_paths(tree) == [(2, "trainer_state.json"), (3, "metrics.jsonl")]
