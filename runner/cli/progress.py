"""Progress on stderr for `judge run`: a live tqdm bar on a terminal, plain lines otherwise.

Used only by `cli`, which hands in the stream. Updates are throttled: the pool calls `update`
after every task, the display changes at most a few times a second.
"""

from __future__ import annotations

import time
from typing import TextIO

from tqdm import tqdm

from runner.execute.stats import RunStats

__all__ = ["Progress"]

# No tqdm monitor thread: a process with a thread may not fork, and a large run forks its
# cache reader and a report (runner.children.forkable). The monitor only adjusts the
# refresh interval of a bar that has stalled.
tqdm.monitor_interval = 0

LINE_EVERY_S = 10.0  # plain-line interval when stderr is not a terminal
BAR_EVERY_S = 0.2


class Progress:
    """done/total, cache hits, calls/s, tokens/min, retries, failures and ETA."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream, self.total = stream, total
        self.started = time.monotonic()
        self.last = 0.0
        self.live = stream.isatty()
        self.told = 0
        """How many of the run's notes (RunStats.notes) are printed."""
        self.bar = tqdm(total=total, file=stream, unit="task", dynamic_ncols=True,
                        mininterval=BAR_EVERY_S) if self.live else None

    def update(self, stats: RunStats) -> None:
        """Show the run's counters (the pool's on_progress): at most every BAR_EVERY_S on a
        terminal, LINE_EVERY_S as a line elsewhere, and once at the end; a new note
        (RunStats.notes) is printed at once.

        Args:
            stats: the run's counters so far.
        """
        while self.told < len(stats.notes):
            self.say(stats.notes[self.told])
            self.told += 1
        if stats.total > self.total:  # a generation stage adds the judge tasks later
            self.total = stats.total
            if self.bar is not None:
                self.bar.total = stats.total
        now = time.monotonic()
        every = BAR_EVERY_S if self.live else LINE_EVERY_S
        if now - self.last < every and stats.done + len(stats.failures) < self.total:
            return
        self.last = now
        elapsed = max(now - self.started, 1e-9)
        tokens = stats.prompt_tokens + stats.completion_tokens
        fields = {"cached": stats.cache_hits, "calls/s": f"{stats.api_calls / elapsed:.1f}",
                  "tok/min": f"{tokens * 60 / elapsed:.0f}", "retries": stats.retries,
                  "failed": len(stats.failures)}
        if stats.waiting:  # another run buys these: this one waits for its answers
            fields["waiting"] = stats.waiting
        if endpoints := _fleet_summary(stats):
            fields["endpoints"] = endpoints
        finished = stats.done + len(stats.failures)
        if self.bar is not None:
            self.bar.n = finished
            self.bar.set_postfix(fields, refresh=True)
            return
        rate = (finished - stats.cache_hits) / elapsed
        left = self.total - finished
        eta = f"{left / rate:.0f}s" if rate > 0 else "?"
        parts = " ".join(f"{k}={v}" for k, v in fields.items())
        self.stream.write(f"[{finished}/{self.total}] {parts} eta={eta}\n")
        self.stream.flush()

    def say(self, message: str) -> None:
        """Print `message` on its own line, above the bar at a terminal.

        Args:
            message: one line, without its newline.
        """
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            self.stream.write(message + "\n")
            self.stream.flush()

    def close(self) -> None:
        """End the bar (a terminal's); the lines elsewhere need nothing."""
        if self.bar is not None:
            self.bar.close()


def _fleet_summary(stats: RunStats) -> str:
    """Per model, each replica's calls (and "out" while cooling down) and its effective limits,
    e.g. `judge[127.0.0.1:8001 120 rpm=600 (learned), 127.0.0.1:8002 31 out]`; "" without
    replicas."""
    models = []
    for model, replicas in stats.endpoints.items():
        parts = []
        for label, c in replicas.items():
            text = f"{label.split('://')[-1].split('/')[0]} {c['calls']}"
            text += " out" if c["state"] == "out" else ""
            text += "".join(f" {k}={c[k]}" for k in ("rpm", "tpm") if c[k] != "none")
            parts.append(text)
        models.append(f"{model}[{', '.join(parts)}]")
    return " ".join(models)
