"""The OpenAI cookbook's "API request parallel processor" pattern, re-implemented for the peers
benchmark (bench/peers.py). Runs in the peers venv (aiohttp + tiktoken), not the project's.

This is not the cookbook's script (examples/api_request_parallel_processor.py in the
openai-cookbook repository): it is an independent implementation of the same design, written
for this benchmark, so that the figures measure the pattern users copy:

- requests are read lazily, one JSON object a line, from a JSONL file;
- one main loop takes the next request (the retry queue first, then the file), refills a
  request budget and a token budget in proportion to the time since the last pass (capped at
  one minute's worth), and, when both budgets cover the request, starts one asyncio task for
  it; the loop then sleeps 1 ms, so it starts at most one request per pass (the cookbook notes
  this caps it near 1,000 requests/s) and, after a rate-limit error, pauses 15 s;
- a request's token cost is estimated with tiktoken (cl100k_base) the cookbook's way: 4 per
  message plus the tokens of each message field, 2 for the reply's priming, plus n x max_tokens;
- each task POSTs the request with one shared aiohttp session and appends
  `[request, response]` as one JSON line to the output file (opened and closed per line); a
  failure goes back on the retry queue until its attempts run out, then is saved as an error.

`--loop-sleep-s 0` (the main loop only yields) is a variant of ours, not the cookbook's: the
benchmark runs it as a diagnostic of what the 1 ms pause costs. For the benchmark the connector
allows `--concurrency` connections (the cookbook keeps
aiohttp's default of 100) and the logging level is WARNING (the cookbook's INFO writes a line
per request). Prints one JSON object of counters and the seconds from reading the first
request to the last line written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import tiktoken

LOOP_SLEEP_S = 0.001
RATE_LIMIT_PAUSE_S = 15.0
log = logging.getLogger("cookbook_pattern")


@dataclass
class Progress:
    """Counters over the whole run; the main loop ends when `in_progress` is back to 0."""

    started: int = 0
    in_progress: int = 0
    succeeded: int = 0
    failed: int = 0
    rate_limited: int = 0
    api_errors: int = 0
    other_errors: int = 0
    last_rate_limit: float = 0.0


@dataclass
class Request:
    """One request with what is needed to send, retry and save it."""

    number: int
    body: dict[str, Any]
    tokens: int
    attempts_left: int
    errors: list[str] = field(default_factory=list)


def estimate_tokens(body: dict[str, Any], encoding: Any) -> int:
    """Prompt tokens counted with tiktoken plus the completion tokens the request may use."""
    completion = int(body.get("n", 1)) * int(body.get("max_tokens", 15))
    prompt = 2  # the reply's priming
    for message in body["messages"]:
        prompt += 4  # the per-message framing
        for key, value in message.items():
            prompt += len(encoding.encode(value))
            if key == "name":
                prompt -= 1
    return prompt + completion


def save(row: list[Any], path: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


async def send(request: Request, session: aiohttp.ClientSession, url: str,
               headers: dict[str, str], retries: asyncio.Queue[Request], out: str,
               progress: Progress) -> None:
    """POST one request; save the answer, or queue a retry, or save the error."""
    error: str | None = None
    try:
        async with session.post(url, headers=headers, json=request.body) as response:
            answer = await response.json()
        if "error" in answer:
            error = json.dumps(answer)
            if response.status == 429:
                progress.rate_limited += 1
                progress.last_rate_limit = time.time()
            else:
                progress.api_errors += 1
    except Exception as exc:  # noqa: BLE001 - the pattern saves any failure and retries it
        error = repr(exc)
        progress.other_errors += 1
    if error is None:
        save([request.body, answer], out)
        progress.succeeded += 1
        progress.in_progress -= 1
        return
    request.errors.append(error)
    if request.attempts_left > 0:
        retries.put_nowait(request)
        return
    log.error("request %d failed after all attempts", request.number)
    save([request.body, request.errors], out)
    progress.failed += 1
    progress.in_progress -= 1


def _requests(path: str) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


async def process(args: argparse.Namespace) -> Progress:
    """The main loop: throttle by capacity, start one task per request, wait for all."""
    encoding = tiktoken.get_encoding(args.token_encoding)
    headers = {"Authorization": f"Bearer {args.api_key}"}
    retries: asyncio.Queue[Request] = asyncio.Queue()
    progress = Progress()
    requests_left, tokens_left = args.max_requests_per_minute, args.max_tokens_per_minute
    last = time.time()
    pending: Request | None = None
    source: Iterator[dict[str, Any]] | None = _requests(args.requests)
    tasks: set[asyncio.Task[None]] = set()
    deadline = time.monotonic() + args.deadline_s
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        while time.monotonic() < deadline:
            if pending is None:
                if not retries.empty():
                    pending = retries.get_nowait()
                elif source is not None:
                    body = next(source, None)
                    if body is None:
                        source = None
                    else:
                        body.pop("metadata", None)
                        pending = Request(progress.started, body,
                                          estimate_tokens(body, encoding), args.max_attempts)
                        progress.started += 1
                        progress.in_progress += 1
            now = time.time()
            elapsed, last = now - last, now
            requests_left = min(requests_left + args.max_requests_per_minute * elapsed / 60,
                                args.max_requests_per_minute)
            tokens_left = min(tokens_left + args.max_tokens_per_minute * elapsed / 60,
                              args.max_tokens_per_minute)
            if pending is not None and requests_left >= 1 and tokens_left >= pending.tokens:
                requests_left -= 1
                tokens_left -= pending.tokens
                pending.attempts_left -= 1
                task = asyncio.create_task(send(pending, session, args.request_url, headers,
                                                retries, args.save, progress))
                tasks.add(task)  # a strong reference until it is done
                task.add_done_callback(tasks.discard)
                pending = None
            if progress.in_progress == 0 and source is None:
                break
            await asyncio.sleep(args.loop_sleep_s)
            cooling = RATE_LIMIT_PAUSE_S - (time.time() - progress.last_rate_limit)
            if cooling > 0:
                log.warning("rate limited: pausing %.1f s", cooling)
                await asyncio.sleep(cooling)
        for task in list(tasks):  # past the deadline: abandon what is still in flight
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", required=True, help="JSONL of request bodies")
    parser.add_argument("--save", required=True, help="JSONL to append results to")
    parser.add_argument("--request-url", required=True)
    parser.add_argument("--api-key", default="bench")
    parser.add_argument("--max-requests-per-minute", type=float, default=1500.0)
    parser.add_argument("--max-tokens-per-minute", type=float, default=125_000.0)
    parser.add_argument("--token-encoding", default="cl100k_base")
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=100,
                        help="aiohttp connector limit (aiohttp's default is 100)")
    parser.add_argument("--logging-level", type=int, default=logging.WARNING)
    parser.add_argument("--loop-sleep-s", type=float, default=LOOP_SLEEP_S,
                        help="the main loop's pause per pass (the cookbook's 1 ms; 0 for the "
                             "benchmark's diagnostic variant)")
    parser.add_argument("--deadline-s", type=float, default=120.0,
                        help="stop starting requests after this many seconds")
    args = parser.parse_args()
    logging.basicConfig(level=args.logging_level)
    started = time.perf_counter()
    progress = asyncio.run(process(args))
    seconds = time.perf_counter() - started
    json.dump({"seconds": seconds, "started": progress.started,
               "succeeded": progress.succeeded, "failed": progress.failed,
               "rate_limited": progress.rate_limited, "api_errors": progress.api_errors,
               "other_errors": progress.other_errors}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
