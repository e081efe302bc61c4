"""The fake server of tests/fakeserver.py in its own process, plus `GET /bench/stats`.

Run as `python bench/server.py --port P [--latency S] [--rpm R]`. With `--rpm`, the arrival time
(time.monotonic, the same clock as the client's on Linux) of every request the limit accepted or
rejected is kept, so the benchmark can count requests in any 60 s window from the server's side.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fakeserver import Script, State, make_app  # noqa: E402


class RecordingState(State):
    """A fake server state that also remembers when each rate-limited request was let in."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.accepted: list[float] = []
        self.rejected: list[float] = []

    def over_rpm(self) -> bool:
        over = super().over_rpm()
        if self.script.rpm is not None:
            (self.rejected if over else self.accepted).append(time.monotonic())
        return over


first_last: list[float | None] = [None, None]
"""time.time() of the first and the last chat request (bench/process.py splits a whole `judge run`
by them: start-up before the first, calls between, reports after the last)."""


@web.middleware
async def _stamped(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
    if request.method == "POST":
        now = time.time()
        if first_last[0] is None:
            first_last[0] = now
        first_last[1] = now
    return await handler(request)


def _stats_handler(state: RecordingState) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"requests": state.requests, "answered": state.answered,
                                  "first_request_at": first_last[0],
                                  "last_request_at": first_last[1],
                                  "status": dict(state.status), "accepted": state.accepted,
                                  "rejected": state.rejected,
                                  "max_in_flight": state.max_in_flight})

    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--rpm", type=float)
    args = parser.parse_args()
    state = RecordingState(Script(latency_s=args.latency, rpm=args.rpm))
    app = make_app(state)
    app.router.add_get("/bench/stats", _stats_handler(state))
    app.middlewares.append(_stamped)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=lambda *a: None,
                backlog=1024)


if __name__ == "__main__":
    main()
