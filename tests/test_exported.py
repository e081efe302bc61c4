"""The public API is runner.__all__: every name exists, and nothing public is left out of it."""

from __future__ import annotations

import types

import runner
from runner import errors

INCLUDED_PRIVATE = {"__version__"}


def test_all_names_exist() -> None:
    for name in runner.__all__:
        assert hasattr(runner, name), name


def test_all_imports_are_exported() -> None:
    members = {name: getattr(runner, name) for name in dir(runner)}  # the API's: on first use
    public = [name for name, value in members.items()
              if (not name.startswith("_") or name in INCLUDED_PRIVATE)
              and not isinstance(value, types.ModuleType)]  # submodules imported by others
    assert sorted(runner.__all__) == sorted(public)
    assert len(set(runner.__all__)) == len(runner.__all__)
    names = [n for n in runner.__all__ if n not in INCLUDED_PRIVATE]
    assert names == sorted(names, key=str.casefold)


def test_exported_errors_are_the_error_tree() -> None:
    exported = {name for name in runner.__all__ if name.endswith("Error")}
    assert exported == {n for n in errors.__all__ if n.endswith("Error")}
    for name in exported:
        value = getattr(runner, name)
        assert value is getattr(errors, name) and issubclass(value, errors.RunnerError)
        assert value.__module__ == "runner.errors"


def test_version() -> None:
    assert isinstance(runner.__version__, str) and runner.__version__.count(".") == 2
