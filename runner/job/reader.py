"""Walking a job file's TOML tables, with the key path kept for error messages."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.errors import ConfigError
from runner.job.spec import RESERVED_PARAMS

__all__ = ["Reader", "check_params"]


class Reader:
    """Walks a TOML table, remembering the key path for error messages."""

    def __init__(self, file: Path, table: Mapping[str, Any], path: str = "") -> None:
        self.file, self.table, self.path = file, table, path

    def error(self, key: str, message: str) -> ConfigError:
        where = f"{self.path}.{key}" if self.path else key
        return ConfigError(f"{self.file}: {where} {message}")

    def child(self, key: str, table: Mapping[str, Any]) -> Reader:
        return Reader(self.file, table, f"{self.path}.{key}" if self.path else key)

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.table:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.error(key, f"is not a known key; use one of: {known}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None,
            required: bool = False) -> Any:
        if key not in self.table:
            if required:
                raise self.error(key, "is missing")
            return default
        value = self.table[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
            names = " or ".join(k.__name__ for k in _kinds(kind))
            raise self.error(key, f"must be {names} (got {value!r})")
        return value

    def positive(self, key: str, default: Any, kind: type = int) -> Any:
        value = self.get(key, (int, float) if kind is float else int, default)
        if value is not None and value <= 0:
            noun = "integer" if kind is int else "number"
            raise self.error(key, f"must be a positive {noun} (got {value})")
        return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def check_params(r: Reader, params: Mapping[str, Any]) -> None:
    for key in params:
        if key in RESERVED_PARAMS:
            raise r.error(f"params.{key}", "is set by the runner; remove it")
    for key in ("n", "max_tokens", "max_completion_tokens"):
        value = params.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise r.error(f"params.{key}", f"must be a positive integer (got {value!r})")

