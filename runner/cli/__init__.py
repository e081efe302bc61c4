"""The `judge` command on top of the pipeline: click commands, the session, progress.

`judge` is the console entry point. It installs the SIGTERM handler before the commands load, so
a SIGTERM (docker stop, systemd, Slurm's time limit, `timeout`) or a Ctrl-C at any moment ends
with a resume line and exit 143 or 130, never a traceback.
"""

from __future__ import annotations

import sys
from types import FrameType

__all__ = ["TERM_EXIT", "Terminated", "judge"]

TERM_EXIT = 143
"""Exit status after SIGTERM (128 + 15, what a shell reports for a process it killed)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, outside the pool (which stops like the first Ctrl-C): unwinds like Ctrl-C."""


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def judge() -> None:
    """Console entry point: `judge ...`.

    The console script's own `from runner.cli import judge` loads almost nothing (runner and
    this module import only what Python has loaded already): a Ctrl-C is caught
    here from the first import on, and ends with exit 130 and no traceback."""
    try:
        import signal  # noqa: PLC0415 - inside the try: a Ctrl-C while it loads is caught

        signal.signal(signal.SIGTERM, _terminated)
        from runner.cli import main as commands  # noqa: PLC0415 - after the handlers are set
    except KeyboardInterrupt as exc:  # while the commands load: nothing started yet
        sys.exit(TERM_EXIT if isinstance(exc, Terminated) else 130)
    commands.main()
