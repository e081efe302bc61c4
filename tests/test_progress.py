"""The progress bar at a terminal starts no thread: a run that forks (its cache reader, the
reliability rows) could not while one runs."""

from __future__ import annotations

import io
import threading

from runner.cli.progress import Progress
from runner.execute.stats import RunStats


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_at_a_terminal_starts_no_thread() -> None:
    before = threading.active_count()
    stream = _Terminal()
    progress = Progress(stream, total=10)
    stats = RunStats(total=10, cache_hits=4)
    progress.update(stats)
    assert progress.bar is not None  # a live bar, drawn
    assert "4/10" in stream.getvalue()
    assert threading.active_count() == before
    progress.close()


def test_the_line_says_how_many_answers_another_run_is_buying() -> None:
    stream = io.StringIO()
    Progress(stream, total=10).update(RunStats(total=10, cache_hits=4, waiting=6))
    assert "[4/10] cached=4 " in stream.getvalue()
    assert " waiting=6 " in stream.getvalue()
    stream = io.StringIO()
    Progress(stream, total=10).update(RunStats(total=10, cache_hits=10))
    assert "waiting" not in stream.getvalue()
