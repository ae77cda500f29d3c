"""Self-validating dataclass configs that round-trip through JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from attnlab.errors import AttnlabError


class ConfigError(AttnlabError):
    """A configuration value is out of range or inconsistent."""


@dataclasses.dataclass
class BaseConfig:
    """Validate on construction; ``to_dict``/``from_dict`` and ``to_json``/``from_json``."""

    def __post_init__(self):
        for f in dataclasses.fields(self):  # nan passes every comparison a bound makes: first
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
        self.validate()

    def validate(self) -> None:  # overridden by each config
        pass

    def _positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if value is None or value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")

    def _positive_or_none(self, *names: str) -> None:
        """Like ``_positive``, but None (= a default chosen elsewhere) is allowed."""
        self._positive(*(n for n in names if getattr(self, n) is not None))

    def _divisible(self, a: str, b: str) -> None:
        """``a`` must be a multiple of ``b`` (both already checked positive)."""
        va, vb = getattr(self, a), getattr(self, b)
        if va % vb:
            raise ConfigError(f"{a} ({va}) must be divisible by {b} ({vb})")

    def _one_of(self, name: str, choices) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")

    def _fraction(self, *names: str) -> None:
        """Each value must be in [0, 1) (dropout, label smoothing, Adam betas)."""
        for name in names:
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(json.loads(text))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)
