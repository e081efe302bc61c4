"""Tests for runner.execute.limiter with the event loop's clock patched (aiolimiter's MockLoopTime).

Time only moves when a test moves it, so every wait is checked to the tick without sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any
from unittest import mock

import pytest

from runner.execute.limiter import MARGIN_S, Limiter


class MockLoopTime:
    """Replace the running loop's clock: timers fire only when `now` is moved past them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.patch = mock.patch.object(asyncio.get_running_loop(), "time", lambda: self.now)

    def __enter__(self) -> MockLoopTime:
        self.patch.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.patch.stop()

    async def advance(self, to: float, step: float = 0.01) -> None:
        """Move the clock to `to` in small steps, as a real clock would, settling at each."""
        while self.now < to:
            self.now = min(to, round(self.now + step, 9))
            await settle()


@pytest.fixture
async def clock() -> AsyncIterator[MockLoopTime]:
    with MockLoopTime() as c:
        yield c


async def settle() -> None:
    """Let every task that can run at the current (frozen) time run."""
    for _ in range(30):
        await asyncio.sleep(0)


class Recorder:
    """Starts acquisitions as tasks and records the order they complete in."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, acquisition: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            await acquisition
            self.done.append(name)
        self.tasks.append(asyncio.ensure_future(run()))

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    r = Recorder()
    yield r
    r.cancel()
    await asyncio.gather(*r.tasks, return_exceptions=True)


async def test_unlimited_never_waits(clock: MockLoopTime) -> None:
    limiter = Limiter(None, None)
    for _ in range(1000):
        await limiter.acquire(1_000_000)
    limiter.reconcile(10, 1_000)


async def test_rpm_bucket_is_per_second(clock: MockLoopTime, recorder: Recorder) -> None:
    """600 rpm = 10 per second: 10 go at once (not 600), then 10 more each second."""
    limiter = Limiter(600, None)
    for n in range(700):
        recorder.start(str(n), limiter.acquire(1))
    await settle()
    assert len(recorder.done) == 10
    for second in range(1, 60):
        await clock.advance(second, step=0.05)
        assert 10 * second + 9 <= len(recorder.done) <= 10 * second + 10
    await clock.advance(59.99, step=0.05)
    # the whole first minute: never more than rpm in any 60 s window (the bucket alone
    # would admit its one-second capacity on top: 610)
    assert len(recorder.done) == 600
    await clock.advance(60.0 + MARGIN_S + 0.01, step=0.01)  # the first ten leave the window
    assert len(recorder.done) == 610
    assert recorder.done == [str(n) for n in range(len(recorder.done))]  # in order


@pytest.mark.parametrize(("rpm", "gap"), [(30, 2.0), (45, 4 / 3), (0.5, 120.0),
                                         (1, 60.05)])  # at rpm 1 the window binds: 60 s + 50 ms
async def test_rpm_below_one_per_second(clock: MockLoopTime, recorder: Recorder,
                                        rpm: float, gap: float) -> None:
    """Under 60 rpm a per-second bucket would hold less than one request: one every gap s."""
    limiter = Limiter(rpm, None)
    for n in range(5):
        recorder.start(str(n), limiter.acquire(1))
    await settle()
    assert recorder.done == ["0"]
    for k in range(1, 4):
        await clock.advance(k * gap - 0.02, step=0.1)
        assert len(recorder.done) == k
        await clock.advance(k * gap + 0.02)
        assert len(recorder.done) == k + 1


def test_unlimited_only_without_both_limits() -> None:
    """The pool skips `acquire` for an unlimited model: either limit alone must count."""
    assert [Limiter(rpm, tpm).unlimited for rpm, tpm in
            [(None, None), (0, 0), (600, None), (None, 600), (600, 600)]] == [
        True, True, False, False, False]


async def test_tpm_bucket_is_per_second(clock: MockLoopTime, recorder: Recorder) -> None:
    limiter = Limiter(None, 600)  # 10 tokens per second
    for n in range(5):
        recorder.start(str(n), limiter.acquire(5))
    await settle()
    assert recorder.done == ["0", "1"]
    await clock.advance(0.48)
    assert recorder.done == ["0", "1"]
    await clock.advance(0.52)
    assert recorder.done == ["0", "1", "2"]


async def test_big_reservations_are_first_come_first_served(clock: MockLoopTime,
                                                            recorder: Recorder) -> None:
    """aiolimiter alone serves the smallest amount first; a big prompt would starve."""
    limiter = Limiter(None, 600)  # 10 tokens per second
    await limiter.acquire(10)  # the bucket is full
    recorder.start("big", limiter.acquire(45))  # more than a second's worth: taken in chunks
    await settle()
    for n in range(5):
        recorder.start(f"small{n}", limiter.acquire(1))
    await settle()
    await clock.advance(4.4)
    assert recorder.done == []  # 45 tokens at 10/s after a full bucket: due at 4.5 s
    await clock.advance(4.6)
    assert recorder.done == ["big"]
    await clock.advance(5.1)
    assert recorder.done == ["big"] + [f"small{n}" for n in range(5)]


async def test_requests_and_tokens_together(clock: MockLoopTime, recorder: Recorder) -> None:
    limiter = Limiter(120, 6000)  # 2 requests and 100 tokens per second
    for n in range(4):
        recorder.start(str(n), limiter.acquire(30))
    await settle()
    assert recorder.done == ["0", "1"]  # requests bind
    for now, done in ((0.48, 2), (0.52, 3), (0.98, 3), (1.02, 4)):
        await clock.advance(now)
        assert len(recorder.done) == done
    await clock.advance(3.0)  # both buckets empty again
    recorder.start("heavy1", limiter.acquire(100))
    recorder.start("heavy2", limiter.acquire(100))
    await settle()
    assert recorder.done[4:] == ["heavy1"]  # tokens bind: 100 more are due at 4 s
    await clock.advance(3.98)
    assert recorder.done[4:] == ["heavy1"]
    await clock.advance(4.02)
    assert recorder.done[4:] == ["heavy1", "heavy2"]


async def test_unused_tokens_are_credited(clock: MockLoopTime, recorder: Recorder) -> None:
    limiter = Limiter(None, 600)  # 10 tokens per second
    await limiter.acquire(10)
    limiter.reconcile(10, 4)  # 6 reserved tokens were not used
    recorder.start("next", limiter.acquire(8))  # needs only 2 more
    await settle()
    await clock.advance(0.18)
    assert recorder.done == []
    await clock.advance(0.22)  # without the credit this would take until 0.8 s
    assert recorder.done == ["next"]


async def test_credit_is_capped_at_one_second(clock: MockLoopTime, recorder: Recorder) -> None:
    limiter = Limiter(None, 600)  # 10 tokens per second
    await limiter.acquire(10)
    for _ in range(5):
        limiter.reconcile(10, 0)  # 50 unused tokens booked, but only 10 may carry over
    await clock.advance(1.0)  # the bucket has drained
    recorder.start("a", limiter.acquire(20))  # 10 from credit, 10 from the bucket
    await settle()
    assert recorder.done == ["a"]
    recorder.start("b", limiter.acquire(10))  # credit spent, bucket full: waits a second
    await settle()
    await clock.advance(1.98)
    assert recorder.done == ["a"]
    await clock.advance(2.02)
    assert recorder.done == ["a", "b"]


async def test_extra_tokens_are_a_debt(clock: MockLoopTime, recorder: Recorder) -> None:
    limiter = Limiter(None, 600)
    await limiter.acquire(10)
    limiter.reconcile(10, 25)  # the answer used 15 tokens more than reserved
    recorder.start("next", limiter.acquire(5))  # pays 15 + 5 = 20: due at 2 s, not 0.5 s
    await clock.advance(1.97)
    assert recorder.done == []
    await clock.advance(2.03)
    assert recorder.done == ["next"]
    recorder.start("after", limiter.acquire(5))  # the debt is paid once: due at 2.5 s
    await clock.advance(2.47)
    assert recorder.done == ["next"]
    await clock.advance(2.53)
    assert recorder.done == ["next", "after"]


async def test_reconcile_without_usage_changes_nothing(clock: MockLoopTime,
                                                       recorder: Recorder) -> None:
    limiter = Limiter(None, 600)
    await limiter.acquire(10)
    limiter.reconcile(10, None)
    recorder.start("next", limiter.acquire(10))
    await clock.advance(0.98)
    assert recorder.done == []
    await clock.advance(1.02)
    assert recorder.done == ["next"]
