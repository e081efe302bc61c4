"""Benchmark: a 100,000-request batch job against the fake Files + Batches server.

The fake (tests/fakebatch.py) runs in its own process. A child process (this file with
`--child`, reaped with wait4 for its own peak RSS) expands a synthetic job (common.write_job:
~1 KB request bodies), then times, with runner.execute.batch.BatchRun:

- `submit_s`: write the request files (50,000 requests a file) and upload and submit them;
- `ingest_s`: once the fake has answered, one settle pass: read the output files, match each
  answer to its request and store it in a fresh on-disk cache (Cache.put_many: 500 answers
  a SQLite transaction).

Target: each under 10 s. `--quick` (bench/run.py --quick) uses 10,000 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench import common  # noqa: E402
from runner.execute.batch import BatchOptions, BatchRun, Provider  # noqa: E402
from runner.execute.batch_api import OpenAIBatches  # noqa: E402
from runner.execute.ledger import Ledger  # noqa: E402
from runner.execute.store.cache import Cache  # noqa: E402
from runner.selection import TaskSelection  # noqa: E402
from runner.session.select import select

TARGET_S = 10.0
REQUESTS = 100_000


@contextlib.contextmanager
def _fake() -> Iterator[common.Server]:
    port = common.free_port()
    with common.serving([common.PYTHON, "-m", "tests.fakebatch", "--port", str(port)],
                        [port]) as process:
        yield common.Server(port, process)


def batch_job(work: Path, quick: bool) -> dict[str, Any]:
    """bench/run.py's entry point."""
    requests = REQUESTS // 10 if quick else REQUESTS
    with _fake() as server:
        child = common.run_child([common.PYTHON, str(Path(__file__).resolve()), "--child",
                                  "--requests", str(requests), "--work", str(work),
                                  "--url", server.url], cwd=work, timeout_s=600)
        stats = server.stats()
    if child.exit_code != 0:
        return {"error": child.stderr[-2000:], "pass": False}
    figures = orjson.loads(child.stdout.strip().splitlines()[-1])
    ok = figures["submit_s"] < TARGET_S and figures["ingest_s"] < TARGET_S \
        and figures["collected"] == requests and stats["keys_created_twice"] == 0
    return {"requests": requests, **figures, "fake": stats, "child": child.figures(),
            "max_rss_mb": round(child.max_rss_mib * 2**20 / 1e6, 1),
            "target": f"submit and ingest < {TARGET_S:g} s each",
            "pass": ok if not quick else None}


async def _measure(work: Path, requests: int, url: str) -> dict[str, Any]:
    job = common.write_job(work / "job", requests, aspects=("overall",), base_url=url)
    sel = select(TaskSelection(job=job, cache_dir=work / "cache"), data_dir=work)
    tasks = list(sel.expansion.tasks())
    model = sel.job.models[0]
    rss = {"after_expand": _rss_mb()}
    with Cache(work / "cache") as cache, Ledger(work / "cache") as ledger:
        run = BatchRun(cache=cache, ledger=ledger, job="bench", options=BatchOptions(poll_s=0.2),
                       providers={model.name: Provider(model=model, base_url=url)},
                       say=lambda s: None)
        async with aiohttp.ClientSession() as session:
            apis = {model.name: OpenAIBatches(session, url, lambda: None)}
            started = time.perf_counter()
            await run.submit(apis, {model.name: tasks})
            submit_s = time.perf_counter() - started
            rss["after_submit"] = _rss_mb()
            bytes_sent = sum(len(t.body) for t in tasks)
            del tasks
            for row in ledger.pending():  # let the fake finish each batch (server time)
                assert row.batch_id is not None
                while (await apis[model.name].get(row.batch_id))["status"] != "completed":
                    await asyncio.sleep(0.2)
            started = time.perf_counter()
            await run.settle(apis, wait=False)
            ingest_s = time.perf_counter() - started
            rss["after_ingest"] = _rss_mb()
    return {"submit_s": round(submit_s, 2), "ingest_s": round(ingest_s, 2),
            "batches": len(run.stats.created), "collected": len(run.stats.collected),
            "request_body_mb": round(bytes_sent / 1e6, 1), "peak_rss_mb_by_phase": rss}


def _rss_mb() -> float:
    """Peak RSS of this process so far (Linux: ru_maxrss in KiB), MB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 requests")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.child:
        print(orjson.dumps(asyncio.run(_measure(args.work, args.requests, args.url))).decode())
        return
    with tempfile.TemporaryDirectory(prefix="judge-bench-batch-") as work:
        print(orjson.dumps(batch_job(Path(work), args.quick),
                           option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
