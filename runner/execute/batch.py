"""Provider Batch APIs: the tasks that miss the cache, as batch request files, submitted,
polled, and their answers stored in the cache under the same keys as online answers.

Request lines and files: runner.execute.batch_files; collecting an ended batch, its answers
ordinary cache entries: runner.execute.batch_collect. The provider's API is OpenAIBatches, or
for anthropic models runner.execute.anthropic_batch.AnthropicBatches (the same request files,
as Message Batches). The ledger is the cache's (runner.execute.ledger).

Crash safety (see runner.execute.ledger): upload -> `reserve` (durable) -> create ->
`attach` (durable). A later run first settles the ledger (attaches to a batch created just
before a kill, creates the batch of a file uploaded and reserved but never submitted, polls the
live ones, ingests the ended ones) and only then submits the keys that are neither cached nor
held by a batch not yet ingested. A per-request error is a failure with its reason, never an
answer; an expired or cancelled batch keeps its finished part.

Shards (`judge run --shard I/N --batch`): a run submits only its shard's keys (the split of
runner.execute.shard) and settles only the batches whose smallest key is one of its tasks', so
N shards settling at once never create, collect or count one batch twice, whatever ledger
they share; except that a cross-shard duplicate (runner.execute.shard) may be the smallest key
of a batch two shards settle: both wait for it and collect the same records. Batches whose
smallest key no task of the shard renders are left to a run without --shard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import aiohttp

from runner.errors import APIError, AuthError, ConfigError, RequestError, RetryableError
from runner.execute.anthropic_batch import AnthropicBatches
from runner.execute.batch_api import OpenAIBatches
from runner.execute.batch_collect import BatchStats, Collector
from runner.execute.batch_files import MAX_REQUESTS, remove_stale, write_files
from runner.execute.claims import Claims
from runner.execute.ledger import LIVE, BatchLedger, BatchRow
from runner.execute.shard import Shard
from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend, cached_flags
from runner.job.providers import row as provider_row
from runner.job.spec import ModelSpec
from runner.tasks import Task

__all__ = ["BatchOptions", "BatchRun", "Provider"]


@dataclass(frozen=True, slots=True)
class Provider:
    """Where one model's batches go."""

    model: ModelSpec
    base_url: str
    api_key: Callable[[], str | None] = lambda: None


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How the batch stage submits, waits and falls back."""

    wait: bool = True
    """Poll until every batch holding this run's keys has ended, then collect."""
    fallback: str = "batch"
    """Failed or expired requests: "batch" (one new batch per run) or "online" (left to the
    online pool, never resubmitted as a batch by this run)."""
    poll_s: float = 30.0
    max_requests: int = MAX_REQUESTS
    max_retries: int = 6


class BatchRun:
    """The batch stage of one run over one cache and ledger."""

    def __init__(self, *, cache: CacheBackend, ledger: BatchLedger,
                 providers: Mapping[str, Provider], job: str, options: BatchOptions,
                 say: Callable[[str], None], stats: BatchStats | None = None,
                 shard: Shard | None = None) -> None:
        self.cache, self.ledger, self.providers = cache, ledger, providers
        self.job, self.options, self.say, self.shard = job, options, say, shard
        self.stats = stats if stats is not None else BatchStats()
        self.files = ledger.files  # request files, on this machine
        self._collector = Collector(cache=cache, ledger=ledger, files=self.files, models={
            p.model.endpoint: p.model for p in providers.values()}, stats=self.stats, say=say)
        self._seen: set[str] = set()  # ledger rows met by this run (file ids)
        self._tried: set[str] = set()  # file ids this run asked the provider to create from
        self._first: dict[str, str] = {}  # file id -> its smallest key (shard ownership)
        self._keys: set[str] = set()  # with a shard: the keys of its tasks (shard ownership)

    async def run(self, tasks: Iterable[Task]) -> BatchStats:
        """Settle the ledger, submit every task of a batch-mode model that is neither cached
        nor held, and (when waiting) poll and collect; one fallback round for failures.

        Args:
            tasks: the run's tasks; those of models without a Provider are left alone.

        Returns:
            The stats, with `pending` the keys still held by a live batch.
        """
        mine: dict[str, Task] = {}
        for task in tasks:
            if task.model in self.providers:
                mine.setdefault(task.key, task)
        if self.shard is not None:
            self._keys.update(mine)
        claims = Claims(self.cache, asyncio.Event(), RunStats(), lambda stats: None)
        async with aiohttp.ClientSession() as session:
            apis = {name: self._api(session, p) for name, p in self.providers.items()}
            try:
                await self.settle(apis, wait=False)
                skip = set(self.stats.failures) if self.options.fallback == "online" else set()
                await self.submit(apis, self._missing(mine, skip, claims))
                if self.options.wait:
                    await self.settle(apis, wait=True)
                    retry = set(self.stats.failures) & set(mine) \
                        if self.options.fallback == "batch" else set()
                    if retry:
                        self.say(f"{len(retry)} requests failed or expired in a batch: "
                                 "submitting them once more in a new batch "
                                 "(--batch-fallback batch)")
                        for key in retry:
                            del self.stats.failures[key]
                        await self.submit(apis, self._missing(mine, set(), claims))
                        await self.settle(apis, wait=True)
            finally:
                claims.close()
        held = self.ledger.held()
        self.stats.pending |= {k for k in mine if k in held}
        return self.stats

    def _api(self, session: aiohttp.ClientSession, p: Provider) -> OpenAIBatches:
        """The Batch API client of a provider's wire format (messages: Message Batches)."""
        if provider_row(p.model.kind).wire == "messages":
            return AnthropicBatches(session, p.base_url, p.api_key, self.files,
                                    self.options.max_retries, known=lambda: {
                                        r.batch_id for r in self.ledger.rows() if r.batch_id})
        return OpenAIBatches(session, p.base_url, p.api_key, self.options.max_retries)

    async def status(self, *, cancel: bool = False) -> list[BatchRow]:
        """This job's batches, the live ones refreshed (and with `cancel`, cancelled first).

        Returns:
            The job's ledger rows.
        """
        async with aiohttp.ClientSession() as session:
            apis = {p.model.endpoint: self._api(session, p) for p in self.providers.values()}
            for row in self.ledger.rows(self.job):
                api = apis.get(row.endpoint)
                if not row.live or api is None:
                    continue
                if cancel and row.batch_id is not None:
                    await api.cancel(row.batch_id)
                await self._refresh(api, row, create=False)
        return self.ledger.rows(self.job)

    def _missing(self, mine: Mapping[str, Task], skip: set[str], claims: Claims
                 ) -> dict[str, list[Task]]:
        """The tasks to submit, by model: neither cached, nor skipped, nor held by a batch,
        nor claimed by another live run (runner.execute.claims: an online run buying them, or
        another job's batch run submitting them). This run's claims last until it ends, past
        the ledger's reservation, and the ledger is read after claiming: two batch runs of
        different jobs with the same requests on one cache never submit one twice."""
        todo = [task for task, cached
                in cached_flags(self.cache, list(mine.values()), attrgetter("key"))
                if not cached and task.key not in skip]
        todo = claims.take(todo)
        held = self.ledger.held()
        by_model: dict[str, list[Task]] = {}
        for task in todo:
            if task.key not in held:
                by_model.setdefault(task.model, []).append(task)
        return by_model

    # ------------------------------------------------------------------ submit

    async def submit(self, apis: Mapping[str, OpenAIBatches],
                     by_model: Mapping[str, list[Task]]) -> None:
        """Write, upload, reserve and create the batches of `by_model`.

        Args:
            apis, by_model: model name -> its batch API, and -> its tasks to submit.

        Raises:
            ConfigError: the server has no Files API.
        """
        self.files.mkdir(parents=True, exist_ok=True)
        remove_stale(self.files)
        for name, tasks in by_model.items():
            parts = list(write_files(self.files, name, tasks, self.options.max_requests))
            self.say(f"{name}: {len(tasks)} requests in {len(parts)} batch file(s)")
            for path, keys in parts:
                await self._submit_one(apis[name], self.providers[name], path, keys)

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
        await self._create(api, file_id, keys)

    async def _create(self, api: OpenAIBatches, file_id: str, keys: list[str]) -> str:
        """Create the batch over `file_id`, uploaded and reserved; returns the row's state.
        Tried once a run per file: a refusal (4xx) abandons the file, its keys failing in this
        run; a transient failure (429/5xx/connection, retries spent) keeps it `submitting`,
        its keys held, and the next run creates the batch over the same file."""
        self._tried.add(file_id)
        try:
            batch = await api.create(file_id)
        except AuthError:
            raise
        except RetryableError as exc:  # maybe created after all: the next settle asks `find`
            self.say(f"could not create the batch of {file_id} ({exc}); the file is kept: "
                     "rerun to create it")
            return "submitting"
        except APIError as exc:  # refused: the keys are free again, and fail in this run
            await self._abandon(api, file_id)
            for key in keys:
                self.stats.failures[key] = f"batch create refused: {exc}"
            return "abandoned"
        state = str(batch.get("status", "validating"))
        self.ledger.attach(file_id, str(batch["id"]), state)
        self.stats.created.append(str(batch["id"]))
        for key in keys:  # an earlier batch's failure, now retried: not a failure of this run
            self.stats.failures.pop(key, None)
        self.say(f"submitted batch {batch['id']} ({len(keys)} requests)")
        return state

    async def _abandon(self, api: OpenAIBatches, file_id: str) -> None:
        """No batch will be made over `file_id`: release its keys, delete its copies."""
        self.ledger.update(file_id, state="abandoned")
        self.ledger.mark_ingested(file_id)
        (self.files / f"{file_id}.jsonl").unlink(missing_ok=True)
        await api.delete_file(file_id)

    # ------------------------------------------------------------------ settle

    async def settle(self, apis: Mapping[str, OpenAIBatches], *, wait: bool) -> None:
        """Resolve, refresh and collect every batch of our endpoints not yet ingested.

        Args:
            apis: model name -> its batch API.
            wait: poll every poll_s until none of them is live.
        """
        by_endpoint = {p.model.endpoint: apis[name] for name, p in self.providers.items()}
        seen = self._seen
        while True:
            rows = [r for r in self.ledger.pending()
                    if r.endpoint in by_endpoint and self._owned(r)]
            live = 0
            for row in rows:
                if row.file_id not in seen and row.batch_id not in self.stats.created:
                    self.stats.attached += 1
                seen.add(row.file_id)
                state = await self._refresh(by_endpoint[row.endpoint], row, create=True)
                if state == "submitting":  # its create failed in this run: the next one tries
                    continue
                if state in LIVE:
                    live += 1
                else:
                    await self._collector.ingest(by_endpoint[row.endpoint], row)
            if not live or not wait:
                return
            self.say(f"{live} batch(es) still running; next poll in {self.options.poll_s:g} s "
                     "(Ctrl-C leaves them running: rerun to collect)")
            await asyncio.sleep(self.options.poll_s)

    def _owned(self, row: BatchRow) -> bool:
        """Whether this run settles `row`: every row without a shard, else those whose
        smallest key is one of the shard's tasks' (see the module)."""
        if self.shard is None:
            return True
        if row.file_id not in self._first:
            self._first[row.file_id] = min(self.ledger.keys(row.file_id), default="")
        return self._first[row.file_id] in self._keys

    async def _refresh(self, api: OpenAIBatches, row: BatchRow, *, create: bool) -> str:
        """The row's state, asked of the provider and recorded. A row reserved but with no
        batch (a kill, or a failed create, between upload and create): with `create`, its batch
        is created now over the file already uploaded; without (`judge batches`), it is left
        as it is."""
        if row.batch_id is None:  # killed between reserve and attach: did the create happen?
            found = await api.find(row.file_id)
            if found is None:
                return await self._resume(api, row) if create else row.state
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

    async def _resume(self, api: OpenAIBatches, row: BatchRow) -> str:
        """Create the batch of a file an earlier run uploaded and reserved but never submitted
        (or abandon it when every key it holds has an answer by now)."""
        if row.file_id in self._tried:
            return "submitting"
        keys = self.ledger.keys(row.file_id)
        if not set(keys) - self.cache.has_many(keys):
            await self._abandon(api, row.file_id)
            return "abandoned"
        self.say(f"{row.file_id}: uploaded by an earlier run that stopped before creating its "
                 f"batch; creating it now ({len(keys)} requests)")
        return await self._create(api, row.file_id, keys)
