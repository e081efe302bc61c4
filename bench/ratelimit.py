"""Benchmark 4: configured 600 rpm against a server that allows 600 in any 60 s window.

The runner (`execute`, 16 in flight, rpm = 600 in the job) drains more tasks than a minute
allows; the stop event is set at 65 s. The server (bench/server.py --rpm 600) records when it
accepted or rejected (429) each request, so the figures are the server's view: 429s received,
requests accepted in the first 60 s window (from the first request), the most accepted in any
60 s window, and the steady rate after the first second.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from bench import clients, common
from runner.job.load import load_job
from runner.prepare import prepare

RPM = 600
TOLERANCE = 0.03


def _max_window(times: list[float], width: float = 60.0) -> int:
    return max((bisect.bisect_left(times, t + width) - i for i, t in enumerate(times)), default=0)


def _window_figures(accepted: list[float], rejected: list[float]) -> dict[str, Any]:
    if not accepted:
        return {}
    t0 = min(accepted[0], rejected[0]) if rejected else accepted[0]
    first = [t for t in accepted if t < t0 + 60]
    late = [t for t in accepted if t >= t0 + 1]
    steady = (len(late) - 1) / (late[-1] - late[0]) * 60 if len(late) > 1 else None
    return {"accepted_first_60s": len(first),
            "sent_first_60s": len(first) + sum(1 for t in rejected if t < t0 + 60),
            "max_accepted_any_60s": _max_window(accepted),
            "burst_first_100ms": sum(1 for t in accepted if t < t0 + 0.1),
            "steady_rate_per_min": None if steady is None else round(steady, 1),
            "first_429_at_s": round(rejected[0] - t0, 2) if rejected else None,
            "span_s": round(accepted[-1] - t0, 1)}


def rate_limit(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 4 (about 65-70 s)."""
    run_s = 65.0
    with common.server(rpm=RPM) as server:
        path = common.write_job(work / "job", 250, aspects=("a", "b", "c", "d"),
                                base_url=server.url, concurrency=16, rpm=RPM)
        job = load_job(path)
        timing = clients.run(clients.runner_loop(prepare(job, path.parent).tasks(), job,
                                                 work / "cache", deadline_s=run_s))
        stats = server.stats()
    figures = _window_figures(stats["accepted"], stats["rejected"])
    received_429 = int(stats["status"].get("429", 0))
    achieved = figures.get("accepted_first_60s", 0)
    within = abs(achieved - RPM) <= TOLERANCE * RPM
    return {
        "setup": {"rpm_configured": RPM, "server_rpm": RPM, "concurrency": 16,
                  "stop_after_s": run_s},
        "target": f"no 429; requests in a 60 s window within {TOLERANCE:.0%} of {RPM}",
        "received_429": received_429,
        "achieved_per_min": achieved,
        "pass": received_429 == 0 and within,
        **figures,
        "runner": {"answers": timing.answers, "seconds": round(timing.seconds, 1),
                   "retries_and_failures": timing.errors},
    }
