"""examples/walkthrough.ipynb: it uses the README's Python API, and `jupyter nbconvert --to html
--execute` renders it into a page of labelled HTML tables with no ANSI codes (CI runs it)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from html_helpers import ANSI, Page, texts

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "walkthrough.ipynb"
SENTENCE = "I like to eat apples"


def readme_python() -> str:
    """The code block of the README's "From Python" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## From Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def notebook_python() -> str:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def api(source: str) -> tuple[set, set, set]:
    """(what it imports from attnlab, which of those it calls, which ``run.`` members it uses)."""
    tree = ast.parse(source)
    imported = {(n.module, a.name) for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module.startswith("attnlab")
                for a in n.names}  # fmt: skip
    names = {name for _, name in imported}
    called = {n.func.id for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names}  # fmt: skip
    members = {n.attr for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "run"}  # fmt: skip
    return imported, called, members


def test_the_walkthrough_uses_the_readmes_api():
    readme, notebook = api(readme_python()), api(notebook_python())
    assert readme[0] == notebook[0], "the same imports from attnlab"
    assert readme[1] == notebook[1] == {name for _, name in readme[0]}, "each one is used"
    assert readme[2] == notebook[2], "the same Run methods"
    assert {"predict", "generate", "evaluate", "record"} <= readme[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_walkthrough_renders_to_html_tables_without_ansi_codes(tmp_path):
    for package in ("nbconvert", "ipykernel"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (pip install 'attnlab[notebook]'): the "
                        "walkthrough was NOT rendered")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    cmd = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--execute",
           str(NOTEBOOK), "--output-dir", str(tmp_path), "--ExecutePreprocessor.timeout=600",
           "--ExecutePreprocessor.kernel_name=python3"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "walkthrough.html").read_text(encoding="utf-8")
    assert ANSI not in page
    assert not re.search(r'class="[^"]*\bansi-', page), "terminal colours converted to HTML"
    tables = Page(page).tables
    tokens = [c.replace(" ", "␣") for c in SENTENCE]

    def having(header: list[str]) -> list:
        return [t for t in tables if t and texts(t[0])[: len(header)] == header]

    # the attention map (and the trace's token x token steps): a heatmap labelled by tokens
    maps = having(["", *tokens])
    assert maps and all(len(t) == len(SENTENCE) + 1 for t in maps)
    assert any(
        [r[0]["text"] for r in t[1:]] == tokens
        and all(abs(sum(float(c["text"]) for c in r[1:]) - 1) < 0.06 for r in t[1:])
        for t in maps
    ), "a table whose rows are attention weights summing to 1"
    recording = [t for t in tables if len(t) == 2 and texts(t[1]) == ["tokens", *tokens]]
    assert recording, "the recording's tokens under their positions"
    (report,) = having(["check", "result"])
    assert report[1:] and {r[1]["text"] for r in report[1:]} <= {"PASS", "skip"}
    assert having(["layer", "pos", "token", "context", "rel change"]), "influence's ranked table"
    assert having(["figure", "value"]), "the evaluation's figures"
    runs = [t for t in tables if texts(t[0]) == ["run", ""]]
    assert runs and {r[0]["text"] for r in runs[0][1:]} >= {"path", "kind", "parameters"}
    assert "<iframe srcdoc=" in page, "the explorer inline"
    images = re.findall(r"<img\b[^>]*>", page)  # nbconvert may reorder the attributes
    assert any('src="data:image/png;base64,' in i and re.search(r'alt="[^"]*every layer x head', i)
               for i in images), "the grid, titled"  # fmt: skip
