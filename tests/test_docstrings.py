"""Every public function of a runner module that other runner modules import says what its
arguments are for and what it returns (a Google-style Args:, Returns: or Yields: section), and
so does every public method of theirs that takes arguments (tools/docstrings.py says which)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tools import docstrings


@pytest.mark.parametrize("of_methods", [False, True], ids=["functions", "methods"])
def test_public_functions_of_imported_modules_have_args_or_returns(of_methods: bool) -> None:
    _, found = docstrings.missing(ROOT, of_methods=of_methods)
    assert found == [], "without Args/Returns/Yields:\n" + "\n".join(found)


def test_the_checker_sees_the_modules_runner_imports() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in docstrings.imported_modules(ROOT)}
    assert "runner/errors.py" in files
    assert "runner/report/kept.py" in files
