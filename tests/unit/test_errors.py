"""Every user error attnlab defines sits under one root, AttnlabError (a ValueError), so the
CLI catches one class and exits 2 with one line."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import attnlab
from attnlab.cli import user_errors
from attnlab.errors import AttnlabError

# Exceptions attnlab defines that are not bad input: each says why.
NOT_USER_ERRORS = {
    "attnlab.training.loop.TrainingError",  # training had to stop (NaN loss): exit 1, not 2
}


def _defined_exceptions():
    for info in pkgutil.walk_packages(attnlab.__path__, "attnlab."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                yield f"{obj.__module__}.{obj.__qualname__}", obj


def test_attnlab_error_is_a_value_error():
    assert issubclass(AttnlabError, ValueError)


def test_every_user_error_attnlab_defines_is_an_attnlab_error():
    found = dict(_defined_exceptions())
    assert "attnlab.config.ConfigError" in found  # the walk sees the package
    strays = sorted(n for n, cls in found.items()
                    if not issubclass(cls, AttnlabError) and n not in NOT_USER_ERRORS)  # fmt: skip
    assert not strays, f"exceptions outside AttnlabError: {strays}"
    assert set(found) >= NOT_USER_ERRORS, "a NOT_USER_ERRORS entry no longer exists"


def test_the_cli_catches_the_one_root_and_no_bare_value_error():
    caught = user_errors()
    assert AttnlabError in caught
    assert ValueError not in caught  # a plain ValueError is a bug: exit 1 with its type named
