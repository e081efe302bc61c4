"""One progress line for `make install-local`, read from pip's verbose log.

pip compiles llama.cpp in silence; the Makefile sends `pip install -v` to a log and calls this
every TICK seconds. While the compiler runs, the line is the build's own step count, read from
the last ninja `[n/N]` (or make `[ NN%]`) line of the log: `llama.cpp: 90/193 steps, 12 min`.
Before the compiler starts (downloading, CMake's configure), it is pip's last line. A step count
says how far the build is where `still running...` said only that it was.

    python tools/buildprogress.py LOG SECONDS
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# ninja: "[90/193] Building CXX object ..."; make: "[ 45%] Building CXX object ..."
_NINJA_STEP = re.compile(r"^\s*\[(\d+)/(\d+)\]", re.MULTILINE)
_MAKE_STEP = re.compile(r"^\s*\[\s*(\d+)%\]", re.MULTILINE)
_TAIL = 64 * 1024  # the last step line is near the end; a verbose log grows to megabytes


def progress_line(log: str, seconds: int) -> str:
    """The line to print for a build that has run `seconds` with this log so far.

    Args:
        log: the end of pip's verbose log (any length; an empty one before pip writes).
        seconds: the time since the install started.

    Returns:
        `llama.cpp: n/N steps, M min` (or `llama.cpp: P% built, M min`) once the compiler
        has started, else `M min: ` and pip's last non-empty line, cut to 100 characters.
    """
    minutes = f"{seconds // 60} min"
    tail = log[-_TAIL:]
    # the last step line, also after the build (pip then installs: "193/193 steps" stays true)
    ninja = list(_NINJA_STEP.finditer(tail))
    make = list(_MAKE_STEP.finditer(tail))
    step = max(ninja[-1:] + make[-1:], key=lambda m: m.start(), default=None)
    if step is not None and step.re is _NINJA_STEP:
        return f"llama.cpp: {step.group(1)}/{step.group(2)} steps, {minutes}"
    if step is not None:
        return f"llama.cpp: {step.group(1)}% built, {minutes}"
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return f"{minutes}: {lines[-1][:100] if lines else 'starting pip'}"


def main(argv: list[str]) -> int:
    """Print the progress line of the log `argv[0]` after `argv[1]` seconds."""
    log, seconds = Path(argv[0]), int(argv[1])
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - _TAIL))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    print(progress_line(text, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
