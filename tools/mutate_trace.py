"""pytest plugin for tools/mutate.py: which lines of the mutated modules each test runs.

Loaded with `-p mutate_trace` in the baseline run of a target. It records, per test function
(parametrized cases merged), the lines of the files named in MUTATE_TRACE_FILES that ran during
its setup, call and teardown, and under "<import>" the lines run before the first test
(module-level code); it also records each test function's duration. The JSON goes to
MUTATE_TRACE_OUT. tools/mutate.py then runs a mutant only against the tests that execute the
mutated line, fastest first: the same verdict as running the whole file with -x, at a fraction
of the cost.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

IMPORT = "<import>"
_FILES = frozenset(os.path.realpath(f)
                   for f in os.environ.get("MUTATE_TRACE_FILES", "").split(os.pathsep) if f)
_lines: dict[str, set[tuple[str, int]]] = {}
_durations: dict[str, float] = {}

Tracer = Callable[[FrameType, str, Any], Any]


def _tracer(hits: set[tuple[str, int]]) -> Tracer:
    """A sys.settrace function that records (file, line) only inside the traced files."""

    def local(frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line":
            hits.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        filename = frame.f_code.co_filename
        if filename not in _FILES:
            return None
        hits.add((filename, frame.f_lineno))
        return local

    return global_


def _start(key: str) -> None:
    tracer = _tracer(_lines.setdefault(key, set()))
    sys.settrace(tracer)
    threading.settrace(tracer)


def _stop() -> None:
    sys.settrace(None)
    threading.settrace(None)  # type: ignore[arg-type]


def pytest_configure(config: pytest.Config) -> None:
    _start(IMPORT)  # collection imports the modules under test


def pytest_collection_finish(session: pytest.Session) -> None:
    _stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    key = item.nodeid.split("[", 1)[0]
    started = time.perf_counter()
    _start(key)
    try:
        yield
    finally:
        _stop()
        _durations[key] = _durations.get(key, 0.0) + time.perf_counter() - started


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _stop()
    out = os.environ.get("MUTATE_TRACE_OUT")
    if not out:
        return
    lines = {key: sorted([os.path.realpath(f), n] for f, n in hits)
             for key, hits in _lines.items()}
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"lines": lines, "durations": _durations, "modules": _third_party()}, f)


def _third_party() -> list[str]:
    """The modules loaded now that are not the project's (nothing under the current directory,
    which is the scratch copy): tools/mutate.py imports them once before forking."""
    here = os.path.realpath(os.getcwd())
    return [name for name, module in list(sys.modules.items())
            if name != "__main__" and not name.startswith("mutate_trace")
            and not os.path.realpath(getattr(module, "__file__", None) or here).startswith(here)]
