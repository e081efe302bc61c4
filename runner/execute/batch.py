"""Provider Batch APIs: the tasks that miss the cache, as batch request files, submitted,
polled, and their answers stored in the cache under the same keys as online answers.

One request line: `{"custom_id": <cache key>, "method": "POST", "url": "/v1/chat/completions",
"body": <the exact body the online pool would send>}`. An answer is stored with
`answer_record(source="batch:<batch id>")`, so parsers, rescore and online reruns see an
ordinary cache entry. Each model's requests are split into files of at most
`max_requests` lines and MAX_BYTES bytes (OpenAI: 50,000 and 200 MB). The provider's API is
OpenAIBatches, or for anthropic models runner.execute.anthropic_batch.AnthropicBatches, which
sends the same request files as Message Batches behind the same interface.

Crash safety (see runner.execute.ledger): upload -> `reserve` (durable) -> create ->
`attach` (durable). A later run first settles the ledger (attaches to a batch created just
before a kill, polls the live ones, ingests the ended ones) and only then submits the keys
that are neither cached nor held by a batch not yet ingested. A per-request error is a failure
with its reason, never an answer; an expired or cancelled batch keeps its finished part.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from runner.errors import APIError, AuthError, ConfigError, RequestError
from runner.execute.anthropic_batch import AnthropicBatches
from runner.execute.batch_api import CHAT_URL, OpenAIBatches
from runner.execute.ledger import LIVE, BatchRow, Ledger
from runner.execute.store.backend import CacheBackend, marked
from runner.execute.store.cache import answer_record
from runner.expand import Task, estimate_cost
from runner.job.spec import ModelSpec

__all__ = ["MAX_BYTES", "MAX_REQUESTS", "BatchOptions", "BatchRun", "BatchStats",
           "Provider", "batch_cost", "request_line"]

MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
STORE_CHUNK = 2000  # answers handed to put_many at once (a kill -9 loses no more: the batch
# is marked collected only after all are stored, so the next run ingests it again)
FILES = "batch-files"  # request files kept in the cache dir until their batch is ingested
_PREFIX = b'{"custom_id":"'
_MIDDLE = b'","method":"POST","url":"' + CHAT_URL.encode() + b'","body":'


def request_line(task: Task) -> bytes:
    """One JSONL line; the body is written byte for byte as the online pool sends it."""
    return _PREFIX + task.key.encode() + _MIDDLE + task.body + b"}\n"


def _body_of(line: bytes) -> tuple[str, bytes]:
    """(custom_id, body) of a request line, by slicing our own format (or parsing another)."""
    end = line.find(b'"', len(_PREFIX))
    if line.startswith(_PREFIX) and line[end:end + len(_MIDDLE)] == _MIDDLE:
        return line[len(_PREFIX):end].decode(), line[end + len(_MIDDLE):].rstrip()[:-1]
    obj = orjson.loads(line)
    return str(obj["custom_id"]), orjson.dumps(obj["body"])


def batch_cost(model: ModelSpec, online: float | None) -> float | None:
    """The batch price of an online estimate."""
    return None if online is None else online * (1 - model.batch_discount)


@dataclass(frozen=True, slots=True)
class Provider:
    """Where one model's batches go."""

    model: ModelSpec
    base_url: str
    api_key: Callable[[], str | None] = lambda: None


@dataclass(frozen=True, slots=True)
class BatchOptions:
    wait: bool = True
    """Poll until every batch holding this run's keys has ended, then collect."""
    fallback: str = "batch"
    """Failed or expired requests: "batch" (one new batch per run) or "online" (left to the
    online pool, never resubmitted as a batch by this run)."""
    poll_s: float = 30.0
    max_requests: int = MAX_REQUESTS
    max_bytes: int = MAX_BYTES
    max_retries: int = 6


@dataclass(slots=True)
class BatchStats:
    """What the batch stage did in one run."""

    created: list[str] = field(default_factory=list)
    """Batch ids submitted by this run."""
    attached: int = 0
    """Batches from earlier runs found open or ended and not yet collected."""
    collected: set[str] = field(default_factory=set)
    """Keys whose batch answer this run stored in the cache."""
    failures: dict[str, str] = field(default_factory=dict)
    """key -> reason, for requests a batch answered with an error or left unanswered."""
    pending: set[str] = field(default_factory=set)
    """This run's keys still held by a live batch when the run ended."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"batches_created": len(self.created), "batch_ids": self.created,
                "batches_attached": self.attached, "collected": len(self.collected),
                "failed": len(self.failures), "pending": len(self.pending),
                "cost_usd": round(self.cost, 6)}


class BatchRun:
    """The batch stage of one run over one cache and ledger."""

    def __init__(self, *, cache: CacheBackend, ledger: Ledger, providers: Mapping[str, Provider],
                 job: str, options: BatchOptions, say: Callable[[str], None],
                 stats: BatchStats | None = None) -> None:
        self.cache, self.ledger, self.providers = cache, ledger, providers
        self.job, self.options, self.say = job, options, say
        self.stats = stats if stats is not None else BatchStats()
        self.files = ledger.path.parent / FILES  # beside the ledger, in the cache folder
        self._by_endpoint = {p.model.endpoint: p for p in providers.values()}
        self._seen: set[str] = set()  # ledger rows met by this run (file ids)

    async def run(self, tasks: Iterable[Task]) -> BatchStats:
        """Settle the ledger, submit every task of a batch-mode model that is neither cached
        nor held, and (when waiting) poll and collect; one fallback round for failures."""
        mine: dict[str, Task] = {}
        for task in tasks:
            if task.model in self.providers:
                mine.setdefault(task.key, task)
        async with aiohttp.ClientSession() as session:
            apis = {name: self._api(session, p) for name, p in self.providers.items()}
            await self.settle(apis, wait=False)
            skip = set(self.stats.failures) if self.options.fallback == "online" else set()
            await self.submit(apis, self._missing(mine, skip))
            if self.options.wait:
                await self.settle(apis, wait=True)
                retry = set(self.stats.failures) & set(mine) if self.options.fallback == "batch" \
                    else set()
                if retry:
                    self.say(f"{len(retry)} requests failed or expired in a batch: submitting "
                             "them once more in a new batch (--batch-fallback batch)")
                    for key in retry:
                        del self.stats.failures[key]
                    await self.submit(apis, self._missing(mine, set()))
                    await self.settle(apis, wait=True)
        held = self.ledger.held()
        self.stats.pending |= {k for k in mine if k in held}
        return self.stats

    def _api(self, session: aiohttp.ClientSession, p: Provider) -> OpenAIBatches:
        """The Batch API client for a provider's kind (anthropic: Message Batches)."""
        if p.model.kind == "anthropic":
            return AnthropicBatches(session, p.base_url, p.api_key, self.files,
                                    self.options.max_retries, known=lambda: {
                                        r.batch_id for r in self.ledger.rows() if r.batch_id})
        return OpenAIBatches(session, p.base_url, p.api_key, self.options.max_retries)

    async def status(self, *, cancel: bool = False) -> list[BatchRow]:
        """This job's batches, the live ones refreshed from the provider (cancelled first when
        `cancel`)."""
        async with aiohttp.ClientSession() as session:
            apis = {p.model.endpoint: self._api(session, p) for p in self.providers.values()}
            for row in self.ledger.rows(self.job):
                api = apis.get(row.endpoint)
                if not row.live or api is None:
                    continue
                if cancel and row.batch_id is not None:
                    await api.cancel(row.batch_id)
                await self._refresh(api, row)
        return self.ledger.rows(self.job)

    def _missing(self, mine: Mapping[str, Task], skip: set[str]) -> dict[str, list[Task]]:
        held = self.ledger.held()
        by_model: dict[str, list[Task]] = {}
        for task, cached in marked(self.cache, list(mine.values()), _key):
            if not cached and task.key not in held and task.key not in skip:
                by_model.setdefault(task.model, []).append(task)
        return by_model

    # ------------------------------------------------------------------ submit

    async def submit(self, apis: Mapping[str, OpenAIBatches],
                     by_model: Mapping[str, list[Task]]) -> None:
        self.files.mkdir(parents=True, exist_ok=True)
        for stale in self.files.glob("upload-*.jsonl"):  # a run killed while uploading
            stale.unlink(missing_ok=True)
        for name, tasks in by_model.items():
            parts = list(self._write(name, tasks))
            self.say(f"{name}: {len(tasks)} requests in {len(parts)} batch file(s)")
            for path, keys in parts:
                await self._submit_one(apis[name], self.providers[name], path, keys)

    def _write(self, name: str, tasks: list[Task]) -> Iterable[tuple[Path, list[str]]]:
        """Request files of at most max_requests lines and max_bytes bytes each."""
        opts, part = self.options, 0
        start = 0
        while start < len(tasks):
            path = self.files / f"upload-{name.replace('/', '_').replace(':', '_')}-" \
                                f"{time.time_ns()}-{part}.jsonl"
            keys: list[str] = []
            size = 0
            with path.open("wb") as out:
                while start < len(tasks) and len(keys) < opts.max_requests:
                    line = request_line(tasks[start])
                    if keys and size + len(line) > opts.max_bytes:
                        break
                    out.write(line)
                    size += len(line)
                    keys.append(tasks[start].key)
                    start += 1
            part += 1
            yield path, keys

    async def _submit_one(self, api: OpenAIBatches, provider: Provider, path: Path,
                          keys: list[str]) -> None:
        try:
            file_id = await api.upload(path)
        except RequestError as exc:  # 404/405: the server has no Files API
            path.unlink(missing_ok=True)
            raise ConfigError(f"{provider.base_url}: model {provider.model.name!r} cannot run in "
                              f"batch mode, the server refused the batch file upload ({exc}); "
                              "run it online (drop --batch / mode = \"batch\")") from None
        path.rename(self.files / f"{file_id}.jsonl")
        self.ledger.reserve(file_id=file_id, job=self.job, model=provider.model.name,
                            endpoint=provider.model.endpoint, keys=keys)
        try:
            batch = await api.create(file_id)
        except AuthError:
            raise
        except APIError as exc:  # refused: the keys are free again, and fail in this run
            self.ledger.update(file_id, state="abandoned")
            self.ledger.mark_ingested(file_id)
            for key in keys:
                self.stats.failures[key] = f"batch create refused: {exc}"
            return
        self.ledger.attach(file_id, str(batch["id"]), str(batch.get("status", "validating")))
        self.stats.created.append(str(batch["id"]))
        for key in keys:  # an earlier batch's failure, now retried: not a failure of this run
            self.stats.failures.pop(key, None)
        self.say(f"submitted batch {batch['id']} ({len(keys)} requests)")

    # ------------------------------------------------------------------ settle

    async def settle(self, apis: Mapping[str, OpenAIBatches], *, wait: bool) -> None:
        """Resolve, refresh and collect every batch of our endpoints not yet ingested; with
        `wait`, poll every poll_s until none of them is live."""
        by_endpoint = {p.model.endpoint: apis[name] for name, p in self.providers.items()}
        seen = self._seen
        while True:
            rows = [r for r in self.ledger.pending() if r.endpoint in by_endpoint]
            live = 0
            for row in rows:
                if row.file_id not in seen and row.batch_id not in self.stats.created:
                    self.stats.attached += 1
                seen.add(row.file_id)
                state = await self._refresh(by_endpoint[row.endpoint], row)
                if state in LIVE:
                    live += 1
                else:
                    await self._ingest(by_endpoint[row.endpoint], row)
            if not live or not wait:
                return
            self.say(f"{live} batch(es) still running; next poll in {self.options.poll_s:g} s "
                     "(Ctrl-C leaves them running: rerun to collect)")
            await asyncio.sleep(self.options.poll_s)

    async def _refresh(self, api: OpenAIBatches, row: BatchRow) -> str:
        if row.batch_id is None:  # killed between reserve and attach: did the create happen?
            found = await api.find(row.file_id)
            if found is None:
                self.ledger.update(row.file_id, state="abandoned")
                return "abandoned"
            self.ledger.attach(row.file_id, str(found["id"]), str(found.get("status")))
            batch = found
        else:
            batch = await api.get(row.batch_id)
        counts = batch.get("request_counts") or {}
        state = str(batch.get("status"))
        self.ledger.update(row.file_id, state=state, completed=int(counts.get("completed") or 0),
                           failed=int(counts.get("failed") or 0),
                           output_file=batch.get("output_file_id"),
                           error_file=batch.get("error_file_id"))
        return state

    async def _ingest(self, api: OpenAIBatches, row: BatchRow) -> None:
        """Store every answered request; record every other one as a failure with its reason."""
        fresh = next(r for r in self.ledger.rows() if r.file_id == row.file_id)
        keys = set(self.ledger.keys(row.file_id))
        if fresh.state == "abandoned":
            self.ledger.mark_ingested(row.file_id)
            return
        bodies = await self._bodies(api, fresh)
        provider = self._by_endpoint[fresh.endpoint]
        answered = await self._store_outputs(api, fresh, provider, bodies)
        for key in keys - answered:
            if key not in self.cache:
                self.stats.failures[key] = f"batch {fresh.batch_id} {fresh.state}: no result " \
                                           "for this request"
        self.ledger.mark_ingested(row.file_id)
        (self.files / f"{row.file_id}.jsonl").unlink(missing_ok=True)
        self.say(f"collected batch {fresh.batch_id} ({fresh.state}): {fresh.completed} "
                 f"answered, {len(keys) - fresh.completed} failed or not run")

    async def _store_outputs(self, api: OpenAIBatches, row: BatchRow, provider: Provider,
                             bodies: Mapping[str, bytes]) -> set[str]:
        """Store the answers of the batch's output and error files, STORE_CHUNK per
        put_many (one transaction: a put each made 100k answers take ~60 s); returns the keys
        that had a line. Every answer is stored before this returns, so before the ledger
        marks the batch collected."""
        answered: set[str] = set()
        pending: list[tuple[str, dict[str, Any]]] = []
        for file_id in (row.output_file, row.error_file):
            if file_id:
                async for line in api.lines(file_id):
                    key, record = self._line(line, row, provider, bodies)
                    answered.add(key)
                    if record is not None:
                        pending.append((key, record))
                    if len(pending) >= STORE_CHUNK:
                        self.cache.put_many(pending)
                        pending = []
        self.cache.put_many(pending)
        return answered

    async def _bodies(self, api: OpenAIBatches, row: BatchRow) -> dict[str, bytes]:
        """custom_id -> request body: from our copy of the request file, else the provider's."""
        local = self.files / f"{row.file_id}.jsonl"
        bodies: dict[str, bytes] = {}
        if local.exists():
            with local.open("rb") as f:
                for line in f:
                    key, body = _body_of(line)
                    bodies[key] = body
            return bodies
        async for line in api.lines(row.file_id):
            key, body = _body_of(line)
            bodies[key] = body
        return bodies

    def _line(self, line: bytes, row: BatchRow, provider: Provider,
              bodies: Mapping[str, bytes]) -> tuple[str, dict[str, Any] | None]:
        """One output line's key and the record to store for it, or None after recording its
        error."""
        obj = orjson.loads(line)
        key = str(obj.get("custom_id"))
        response = obj.get("response") or {}
        data = response.get("body") if isinstance(response, dict) else None
        error = obj.get("error")
        if error or response.get("status_code") != 200 or not _answer(data) or key not in bodies:
            if error:
                reason = f"{error.get('code')}: {error.get('message')}"
            elif isinstance(data, dict) and isinstance(data.get("error"), dict):
                reason = f"HTTP {response.get('status_code')}: {data['error'].get('message')}"
            else:
                reason = f"HTTP {response.get('status_code')}: no answer in the response"
            self.stats.failures[key] = f"batch {row.batch_id}: {reason}"
            return key, None
        assert isinstance(data, dict)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        assert isinstance(usage, dict)
        record = answer_record(body=bodies[key], endpoint=row.endpoint, response=data,
                               usage=usage, latency_s=0.0, source=f"batch:{row.batch_id}")
        self.stats.failures.pop(key, None)
        self.stats.collected.add(key)
        prompt, completion = int(usage.get("prompt_tokens") or 0), \
            int(usage.get("completion_tokens") or 0)
        self.stats.prompt_tokens += prompt
        self.stats.completion_tokens += completion
        self.stats.cost += batch_cost(provider.model,
                                      estimate_cost(provider.model, prompt, completion)) or 0.0
        return key, record


def _answer(data: Any) -> bool:
    """A chat completion with at least one choice that has a message."""
    return isinstance(data, dict) and isinstance(data.get("choices"), list) \
        and bool(data["choices"]) and all(isinstance(c, dict) and isinstance(
            c.get("message"), dict) for c in data["choices"])


def _key(task: Task) -> str:
    return task.key
