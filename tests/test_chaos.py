"""A standing fault campaign (tests/chaos.py): a 1,000-task `judge run` against the fake
server, killed, terminated and interrupted at random points, resumed until complete, and
compared with an uninterrupted run: nothing lost, nothing different, nothing asked again but
what was in flight at a kill.

`make test` runs a short form (2 trials); `make chaos` the campaign (CHAOS_TRIALS, default
20), then the storage trials (CHAOS_DISK_TRIALS, default 10: a cache disk that fills and is
freed, or stopped while full; root only, for the tmpfs), then the PostgreSQL trials
(CHAOS_PG_TRIALS, default 6: the server stopped and started again, stopped past the run's
wait, or frozen; tests/chaos_pg.py). Each trial prints its seed;
`CHAOS_SEED=N CHAOS_TRIALS=1 make chaos` replays trial N.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos import Campaign, Trial, fault_mix
from tests.chaos_pg import pg_trial
from tests.pgserver import PgCluster, find_bindir
from tests.processes import Processes, processes_fixture  # noqa: F401  (fixture)

SHORT_TRIALS = 2  # ~45 s each on 2 cores: the short form is the largest test of make test
TRIALS = int(os.environ.get("CHAOS_TRIALS", "20"))
DISK_TRIALS = int(os.environ.get("CHAOS_DISK_TRIALS", "10"))
PG_TRIALS = int(os.environ.get("CHAOS_PG_TRIALS", "6"))
MINUTES = float(os.environ.get("CHAOS_MINUTES", "60"))
"""The campaign starts no trial past this many minutes (each trial is bounded on its own)."""


def _seeds(trials: int) -> list[int]:
    first = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    return [first + i for i in range(trials)]


def _campaign(tmp_path: Path, data_dir: Path, processes: Processes, trials: int,
              trial: Callable[[Campaign, int], Trial] = Campaign.run) -> None:
    campaign = Campaign(tmp_path, data_dir, processes)
    done: list[Trial] = []
    stop_at = time.monotonic() + MINUTES * 60
    for seed in _seeds(trials):
        if time.monotonic() > stop_at:
            print(f"chaos: stopped after {MINUTES:g} minutes", flush=True)
            break
        print(f"chaos: trial seed {seed} (CHAOS_SEED={seed} CHAOS_TRIALS=1 make chaos)",
              flush=True)
        done.append(trial(campaign, seed))
        print(done[-1].line(), flush=True)
    failed = [trial for trial in done if not trial.ok]
    print(f"chaos: {len(done)} trials, {sum(len(t.stopped) for t in done)} runs stopped by a "
          f"signal, lost "
          f"{sum(t.lost for t in done)}, repeats {sum(t.repeats for t in done)}, mismatches "
          f"{sum(len(t.mismatches) for t in done)}, failed trials {len(failed)}", flush=True)
    assert not failed, "\n".join(trial.line() for trial in failed)


def test_a_fault_depends_on_the_body_and_its_attempt_not_on_the_order() -> None:
    mix = fault_mix(7)
    calls = [(f"{key:064x}", attempt) for key in range(2000) for attempt in (1, 2, 3)]
    forward = [mix(*call) for call in calls]
    assert [mix(*call) for call in reversed(calls)] == forward[::-1]
    assert {"429", "500", "503", "drop", "malformed", "slow", "empty", "ok"} <= set(forward)
    # an empty body is empty every time; other faults stop after the first attempts
    by_key = [forward[i:i + 3] for i in range(0, len(forward), 3)]
    assert all(set(f) == {"empty"} or f[2] == "ok" for f in by_key)
    assert [fault_mix(8)(*call) for call in calls] != forward  # the seed draws the mix


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_fault_campaign(tmp_path: Path, data_dir: Path, processes: Processes) -> None:
    _campaign(tmp_path, data_dir, processes, SHORT_TRIALS)


@pytest.mark.chaos
@pytest.mark.timeout(int(MINUTES * 60 + 600))
def test_fault_campaign(tmp_path: Path, data_dir: Path, processes: Processes) -> None:
    _campaign(tmp_path, data_dir, processes, TRIALS)


@pytest.mark.chaos
@pytest.mark.timeout(int(MINUTES * 60 + 600))
def test_storage_fault_campaign(tmp_path: Path, data_dir: Path, processes: Processes,
                                small_disk: Path) -> None:
    _campaign(tmp_path, data_dir, processes, DISK_TRIALS,
              lambda campaign, seed: campaign.disk(seed, small_disk))


@pytest.mark.chaos
@pytest.mark.timeout(int(MINUTES * 60 + 600))
def test_postgresql_fault_campaign(tmp_path: Path, data_dir: Path, processes: Processes) -> None:
    if find_bindir() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with PgCluster() as cluster:  # the campaign's own: its trials stop and freeze it
        _campaign(tmp_path, data_dir, processes, PG_TRIALS,
                  lambda campaign, seed: pg_trial(campaign, seed, cluster))
