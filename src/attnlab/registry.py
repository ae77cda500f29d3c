"""The one way things of a sort register: a module of their own, found, not listed.

Model kinds (``attnlab.models``), tasks (``attnlab.tasks``), experiments
(``attnlab.experiments``), Hugging Face families (``attnlab.interop``) and CLI verbs
(``attnlab.cli``) each have a ``Registry`` of their package. A thing registers itself in its
own module, with the registry's ``register`` (a decorator for a class, a call for an object)::

    KINDS = Registry("attnlab.models", key="model_type")   # in the package's base module

    @KINDS.register                                        # in attnlab/models/toy.py
    class Toy(ModelKind): model_type = "toy"; ...

``registered()`` first imports every module of the package, so a new module is found without
being named anywhere else: adding a thing is one module (and its tests). It returns
{name: thing}, ordered by each thing's ``order`` (where a listing shows users an order:
``attnlab --help``'s verbs, ``--task``'s choices; lower first), then by registration.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


class Registry:
    """Things of one sort by name; ``package``'s modules are imported before any listing."""

    def __init__(self, package: str, key: str = "name"):
        self.package = package
        self.key = key  # the attribute that names a thing (a model's is model_type)
        self.found: dict[str, Any] = {}  # name -> thing, in registration order
        self._scanned: tuple[str, ...] | None = None  # the package's folders, once imported

    def register(self, thing: Any) -> Any:
        """Register ``thing`` under its ``key`` attribute and return it, so that it decorates a
        class (``@REG.register``) as well as it wraps an object
        (``EXPERIMENT = REG.register(Experiment(...))``). A name registered twice is a bug."""
        name = getattr(thing, self.key)
        held = self.found.get(name)
        if held is not None and _origin(held) != _origin(thing):
            raise TypeError(f"{self.package}: {name!r} is registered twice "
                            f"({_origin(held)} and {_origin(thing)})")  # fmt: skip
        self.found[name] = thing
        return thing

    def registered(self) -> dict[str, Any]:
        """Every thing of the package by name, in order (module docstring)."""
        package = importlib.import_module(self.package)
        if self._scanned != tuple(package.__path__):  # once (again if a folder is added)
            for info in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.package}.{info.name}")
            self._scanned = tuple(package.__path__)
        position = {name: i for i, name in enumerate(self.found)}
        return dict(sorted(self.found.items(),
                           key=lambda kv: (getattr(kv[1], "order", 0), position[kv[0]])))  # fmt: skip


def _origin(thing: Any) -> str:
    """A class by where it is defined (the same class imported twice is one thing); any other
    thing by its identity."""
    if isinstance(thing, type):
        return f"{thing.__module__}.{thing.__qualname__}"
    return f"{type(thing).__name__} at {id(thing):#x}"
