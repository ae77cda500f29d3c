"""No code outside ``models/`` probes a model with ``getattr`` / ``hasattr`` (issue 27, item 2).

A model says what it is through its declaration (``attnlab.models.declare.ModelKind``: its
capabilities with defaults, its probes, its decoder), so a reader asks it, never guesses. This
test reads every module of ``src/attnlab`` outside ``models/`` with ``ast`` (nothing is
imported) and fails on each probe of a model, printed as ``path:line: code``.

What counts as a probe of a model:
- a call ``hasattr(X, ...)``, or ``getattr(X, name, default)`` with a default (a read that
  falls back when the attribute is missing), where
- X is a model: an expression that names a model or one of its parts. A name is a model when
  it is one of MODEL_NAMES (``model``, ``raw_model``, ``module``, ...) or an attribute
  ``.model`` / ``.raw_model`` of anything (``run.model``, ``self.model``); anything reached
  from a model (``model.config``, ``model.blocks[0].attn``, ``next(model.modules())``) is one;
  and within a function a name assigned from a model expression (``cfg = model.config``, ``for
  m in model.modules()``, ``attn = block.attn``) is one from then on.
A two-argument ``getattr(X, name)`` is an ordinary read that fails loudly (a name the
declaration gives, such as a residual step's norm), not a probe. A config on its own (a
``cfg`` parameter, an options object), a tokenizer, a task or an argparse namespace is not a
model: the memory estimates read configs before any model is built.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"
MODEL_NAMES = {"model", "raw_model", "module", "net", "inner", "attn", "block", "layer", "mha"}
MODEL_ATTRS = {"model", "raw_model"}


def _names(target: ast.AST) -> set[str]:
    """The names an assignment to ``target`` binds (``a``, ``a, (b, c)``, ``*d``; not ``x.a``
    or ``x[i]``, which bind no name)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_names(e) for e in target.elts))
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return set()


def _is_model(node: ast.AST, models: set[str]) -> bool:
    """Whether expression ``node`` names a model or something reached from one."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in models:
            return True
        if isinstance(n, ast.Attribute) and n.attr in MODEL_ATTRS:
            return True
    return False


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        return [node.target]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [node.target]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [node.optional_vars]
    return []


def _value(node: ast.AST) -> ast.AST | None:
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        return node.value
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return node.iter
    if isinstance(node, ast.withitem):
        return node.context_expr
    return None


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` outside the functions and classes defined in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(n))


def _walk(scope: ast.AST, outer: set[str], found: dict[int, str]) -> None:
    """Record the probes in ``scope``, whose enclosing scopes hold the model names ``outer``."""
    models = set(outer)
    nodes = list(_own_nodes(scope))
    for _ in range(3):  # a name assigned from a model is one (chains of a few steps)
        for n in nodes:
            value = _value(n)
            if value is not None and _is_model(value, models):
                for t in _targets(n):
                    models |= _names(t)
    for n in nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            _walk(n, models, found)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.args:
            probing = n.func.id == "hasattr" or (n.func.id == "getattr" and len(n.args) == 3)
            if probing and _is_model(n.args[0], models):
                found[n.lineno] = ast.unparse(n)


def probes_in(source: str) -> list[tuple[int, str]]:
    """(line, code) of every probe of a model in ``source`` (the rules are the docstring's)."""
    found: dict[int, str] = {}
    _walk(ast.parse(source), MODEL_NAMES, found)
    return sorted(found.items())


def test_no_module_outside_models_probes_a_model():
    probes = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "models":
            continue
        probes += [f"{rel}:{line}: {code}" for line, code in probes_in(path.read_text())]
    assert probes == [], "probes of a model outside models/:\n" + "\n".join(probes)


def test_the_walk_catches_the_probes_it_exists_for():
    """The shapes the issue counted on main: a model's attribute with a fallback, hasattr on a
    model or its part, its config read through a name, a part found by walking the model."""
    caught = probes_in(
        "def f(model, run, tokenizer, cfg, args):\n"
        "    a = getattr(model, 'conformance_forward', None)\n"  # 2
        "    b = hasattr(run.model, 'decodes')\n"  # 3
        "    c = model.config\n"
        "    d = getattr(c, 'vocab_size', 0)\n"  # 5
        "    for m in model.modules():\n"
        "        e = getattr(m, 'use_fused', True)\n"  # 7
        "    f = getattr(self.model.blocks[0].attn, 'rotary', None)\n"  # 8
        "    g = getattr(tokenizer, 'special_tokens', {})\n"  # not a model
        "    h = getattr(cfg, 'max_len', None)\n"  # a config alone: not a model
        "    i = getattr(args, 'json', False)\n"  # not a model
        "    j = getattr(model, c.norm)\n"  # a read of a declared name: not a probe
    )
    assert [line for line, _ in caught] == [2, 3, 5, 7, 8]


def test_an_interventions_subject_decides_nothing_itself():
    """One view of a model (issue 27, item 2): ``Subject`` is the model's declaration bound to
    a tokenizer and class names, so each of its methods is one statement that hands the question
    on (to the model, the tokenizer or the prepared input); head names, the metric's position
    and the loss are the model's (``ModelKind.parse_heads``, ``metric_position``,
    ``Prepared.loss``), which inspect/ reads too."""
    tree = ast.parse((SRC / "interventions" / "subjects.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Subject"]
    long = []
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue
        body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
        if len(body) != 1:
            long.append(f"Subject.{fn.name}: {len(body)} statements")
    assert long == [], "\n".join(long)
