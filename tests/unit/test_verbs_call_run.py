"""Every CLI verb that acts on one run calls the ``Run`` method of its name, the one place its
logic lives (issue 27): the verb's module parses options, calls ``<run>.<verb>(...)`` and prints
what it returns, and imports no function of that name from the library. The verbs not yet moved,
and the verbs that do not act on a loaded run, are listed here with the reason, and every
registered verb is in exactly one list, so a new verb has to say which it is."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from attnlab.cli import registered
from attnlab.run import Run

# verb -> the Run method it calls (the verb's name, with '-' as '_')
ON_RUN = ["predict", "generate", "translate", "classify", "what-if", "ablate", "patch",
          "circuit", "lens", "attribute", "heads", "trace", "similarity", "influence", "check",
          "embed", "eval", "attention", "why", "weights", "explore", "align", "walk"]  # fmt: skip

# the verb's logic lives in one library function of its name, not in Run: no loaded run to act on
NOT_A_RUN = {
    "train": "makes a run (attnlab.training.train)",
    "serve": "serves a directory of runs (attnlab.serve.serve)",
    "import-hf": "makes a run from a Hugging Face model",
    "export-hf": "writes a run's files in Hugging Face's layout",
    "experiment": "runs a grid of training runs",
    "timeline": "reads the run's snapshots and runs no model: Run would load weights it never "
    "reads",
}

# act on a run, not moved yet: their logic is still in the CLI module or a library function
NOT_YET = {
    "paths": "calls Run.path_patch (the method keeps the technique's name)",
}

# the workbench's views of the same verbs: each calls the Run method the verb calls
SERVED = {"explorer": "explore", "align": "align", "walk": "walk", "predict": "predict"}


def _module(verb: str) -> Path:
    return Path(importlib.import_module(registered()[verb].add.__module__).__file__)


def test_every_verb_is_in_exactly_one_list():
    lists = [set(ON_RUN), set(NOT_A_RUN), set(NOT_YET)]
    assert sum(map(len, lists)) == len(set().union(*lists))
    assert set().union(*lists) == set(registered())


@pytest.mark.parametrize("verb", ON_RUN)
def test_the_verb_calls_the_run_method_of_its_name(verb):
    method = verb.replace("-", "_")
    assert callable(getattr(Run, method, None)), f"Run has no method {method}"
    tree = ast.parse(_module(verb).read_text())
    called = {n.func.attr for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}  # fmt: skip
    assert method in called
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}  # fmt: skip
    assert method not in imported  # no library function of its name called beside the method


@pytest.mark.parametrize("verb", sorted(NOT_YET))
def test_the_verbs_not_moved_yet_are_listed_honestly(verb):
    """A verb listed as not moved really does not call its Run method yet: once it does, it
    moves to ON_RUN (and its test above)."""
    method = verb.replace("-", "_")
    tree = ast.parse(_module(verb).read_text())
    called = {n.func.attr for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}  # fmt: skip
    assert not (hasattr(Run, method) and method in called)


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {n.func.attr for n in ast.walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}  # fmt: skip


@pytest.mark.parametrize("view", sorted(SERVED))
def test_the_workbench_view_calls_the_same_run_method(view):
    """serve's view of a verb reads the Run method the verb calls, not a copy of its logic
    (explore, align and walk each assembled their answer a second time in serve/views.py)."""
    from attnlab.serve import views

    tree = ast.parse(Path(views.__file__).read_text())
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert SERVED[view] in _calls(fns[view]), f"view {view} does not call Run.{SERVED[view]}"
