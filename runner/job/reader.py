"""Walking a job file's TOML tables, with the key path kept for error messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
        """The error to raise about `key` of this table.

        Args:
            key: the key (or `key[i]`, `key.sub`); message: what is wrong and the fix.

        Returns:
            A ConfigError naming the file and the key path.
        """
        where = f"{self.path}.{key}" if self.path else key
        return ConfigError(f"{self.file}: {where} {message}")

    def child(self, key: str, table: Mapping[str, Any]) -> Reader:
        """A reader of the table under `key`.

        Args:
            key: the key's name in this table (path part); table: the table under it.

        Returns:
            The reader, its path this one's plus `key`.
        """
        return Reader(self.file, table, f"{self.path}.{key}" if self.path else key)

    def check_keys(self, allowed: set[str]) -> None:
        """Refuse a key of the table that is not allowed (tools/jobref.py reads these sets).

        Args:
            allowed: the table's keys.

        Raises:
            ConfigError: naming the first other key and the allowed ones.
        """
        for key in self.table:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.error(key, f"is not a known key; use one of: {known}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None,
            required: bool = False) -> Any:
        """A key's value, checked for its type (a bool is never an int).

        Args:
            key: the key; kind: its type(s); default: the value when it is absent;
            required: whether it must be present.

        Raises:
            ConfigError: the value has another type, or a required key is missing.
        """
        if key not in self.table:
            if required:
                raise self.error(key, "is missing")
            return default
        value = self.table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.error(key, f"must be {names} (got {value!r})")
        return value

    def among(self, key: str, values: Iterable[Any], known: Sequence[str], which: str) -> None:
        """Refuse a name under `key` that is not one of `known`.

        Args:
            key: the key listing the names; values: its names; known: the names allowed, in
                the order the message lists them; which: what the message says of a stranger.

        Raises:
            ConfigError: "KEY names 'x', which WHICH (a, b)".
        """
        for value in values:
            if value not in known:
                raise self.error(key, f"names {value!r}, which {which} ({', '.join(known)})")

    def positive(self, key: str, default: Any, kind: type = int) -> Any:
        """A positive number (`kind` int, or float: an int or a float).

        Args:
            key: the key; default: the value when it is absent; kind: int or float.

        Raises:
            ConfigError: not a number of that kind, or not above 0.
        """
        value = self.get(key, (int, float) if kind is float else int, default)
        if value is not None and value <= 0:
            noun = "integer" if kind is int else "number"
            raise self.error(key, f"must be a positive {noun} (got {value})")
        return value


def check_params(r: Reader, params: Mapping[str, Any]) -> None:
    """Refuse request params the runner sets itself, and an `n` or max tokens below 1.

    Args:
        r: the reader of the table holding `params`; params: its `params`.

    Raises:
        ConfigError: naming `params.KEY`.
    """
    for key in params:
        if key in RESERVED_PARAMS:
            raise r.error(f"params.{key}", "is set by the runner; remove it")
    for key in ("n", "max_tokens", "max_completion_tokens"):
        value = params.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise r.error(f"params.{key}", f"must be a positive integer (got {value!r})")

