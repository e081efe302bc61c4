"""Count the public functions of imported runner modules that have no Args/Returns section.

A module other code imports is one named in a `from runner.X import ...` somewhere in runner/.
Its public functions are the top-level ones not starting with `_`; each needs a Google-style
docstring with `Args:`, `Returns:` or `Yields:` (issue 37, section 4). Two kinds have nothing
such a section could say and are left out: a click command (its docstring is its --help text,
its parameters are the options the help lists) and a function with no parameters returning
None. Prints the count and the missing ones as `path:line name`; tests/test_docstrings.py
holds the same rule.

    python tools/docstrings.py [ROOT]
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

_IMPORT = re.compile(r"^\s*from (runner(?:\.\w+)+) import", re.MULTILINE)
_SECTIONS = ("Args:", "Returns:", "Yields:")
_CLICK = re.compile(r"\b(command|group)\b")


def imported_modules(root: Path) -> list[Path]:
    """The files of the runner modules that some module in runner/ imports by name.

    Args:
        root: the repository (the folder holding runner/).

    Returns:
        The module files, sorted; a package named in an import counts as its __init__.py.
    """
    names: set[str] = set()
    for path in (root / "runner").rglob("*.py"):
        names.update(_IMPORT.findall(path.read_text(encoding="utf-8")))
    files: set[Path] = set()
    for name in names:
        base = root.joinpath(*name.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                files.add(candidate)
    return sorted(files)


def exempt(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a function has no Args/Returns to write: a click command, or no parameters
    and no value.

    Args:
        node: the function's definition.

    Returns:
        True for a function decorated as a click command or group, or one without parameters
        whose return annotation is None.
    """
    if any(_CLICK.search(ast.unparse(d)) for d in node.decorator_list):
        return True
    a = node.args
    bare = not (a.posonlyargs or a.args or a.kwonlyargs or a.vararg or a.kwarg)
    return bare and isinstance(node.returns, ast.Constant) and node.returns.value is None


def missing(root: Path) -> tuple[int, list[str]]:
    """The public functions of the imported modules and those without a section.

    Args:
        root: the repository (the folder holding runner/).

    Returns:
        The number of public functions (click commands and bare procedures left out), and
        each one lacking Args/Returns/Yields as `runner/x.py:LINE name`.
    """
    total = 0
    found: list[str] = []
    for path in imported_modules(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_") or exempt(node):
                continue
            total += 1
            doc = ast.get_docstring(node) or ""
            if not any(section in doc for section in _SECTIONS):
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name}")
    return total, found


def main() -> None:
    """Print the count, then the functions that lack a section."""
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    total, found = missing(root)
    print(f"{len(found)} of {total} public functions of imported modules lack Args/Returns")
    for line in found:
        print(line)


if __name__ == "__main__":
    main()
