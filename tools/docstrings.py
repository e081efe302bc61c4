"""Count the public functions of imported runner modules that have no Args/Returns section.

A module other code imports is one named in a `from runner.X import ...` somewhere in runner/.
Its public functions are the top-level ones not starting with `_`; each needs a Google-style
docstring with `Args:`, `Returns:` or `Yields:` (issue 37, section 4). Two kinds have nothing
such a section could say and are left out: a click command (its docstring is its --help text,
its parameters are the options the help lists) and a function with no parameters returning
None. The public methods of their public classes that take arguments are held to the same
rule, unless they defer to the protocol they implement. Prints the counts and the missing ones
as `path:line name`; tests/test_docstrings.py holds the same rule.

    python tools/docstrings.py [ROOT]
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
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


def methods(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The public methods of a module's public classes that take arguments and do not defer
    to the protocol they implement (a docstring opening with `` `Protocol.method` `` or
    ``As `Other.method` ``: the arguments are documented there).

    Args:
        tree: the parsed module.

    Yields:
        Each method as `Class.method`, and its definition.
    """
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or cls.name.startswith("_"):
            continue
        for node in cls.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            doc = ast.get_docstring(node) or ""
            if (node.name.startswith("_") or exempt(node) or len(a.args) + len(a.kwonlyargs) < 2
                    or doc.startswith(("`", "As `"))):
                continue
            yield f"{cls.name}.{node.name}", node


def missing(root: Path, *, of_methods: bool = False) -> tuple[int, list[str]]:
    """The public functions (or methods) of the imported modules and those without a section.

    Args:
        root: the repository (the folder holding runner/).
        of_methods: count the methods `methods` yields instead of the functions.

    Returns:
        The number of public functions (click commands and bare procedures left out), and
        each one lacking Args/Returns/Yields as `runner/x.py:LINE name`.
    """
    total = 0
    found: list[str] = []
    for path in imported_modules(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = methods(tree) if of_methods else (
            (node.name, node) for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and not node.name.startswith("_") and not exempt(node))
        for name, node in nodes:
            total += 1
            doc = ast.get_docstring(node) or ""
            if not any(section in doc for section in _SECTIONS):
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {name}")
    return total, found


def main() -> None:
    """Print the counts, then the functions and methods that lack a section."""
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    for kind, of_methods in (("functions", False), ("methods taking arguments", True)):
        total, found = missing(root, of_methods=of_methods)
        print(f"{len(found)} of {total} public {kind} of imported modules lack Args/Returns")
        for line in found:
            print(line)


if __name__ == "__main__":
    main()
