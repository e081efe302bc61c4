"""Store a study's recorded judge answers in the cache under the exact requests the job sends.

A job's `[[imports]]` names a data set, a prompt, a model and the item field (in `Item.extra`)
that holds the recorded answer text. Each answer is stored under the cache key of the request
the job would send for it, marked `"source": "import:<dataset>/<field>"`, so `judge rescore`
runs the real parsers and reducer over it, and a later `judge run` never pays for it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runner.errors import ConfigError
from runner.execute.store.backend import CacheBackend
from runner.execute.store.cache import answer_record
from runner.expand import Expansion

__all__ = ["ImportStats", "import_answers"]

STORE_CHUNK = 2000  # answers handed to put_many at once: a transaction per chunk, not per answer


@dataclass(slots=True)
class ImportStats:
    stored: int = 0
    already_cached: int = 0
    without_answer: int = 0
    """Tasks whose item has no recorded answer (e.g. a model the study did not judge)."""


def _record(body: bytes, endpoint: str, text: str, source: str) -> dict[str, object]:
    """A recorded answer as the chat completion it would have been."""
    response = {"object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}
    return answer_record(body=body, endpoint=endpoint, response=response, usage={},
                         latency_s=0.0, source=source)


def import_answers(expansion: Expansion, cache: CacheBackend, *,
                   force: bool = False) -> ImportStats:
    """Store every recorded answer the job's imports declare; returns the counts.

    Args:
        expansion: the job's tasks.
        cache: where the answers are stored.
        force: overwrite answers the cache holds already.

    Returns:
        The counts: stored, already cached, and without a recorded answer.

    Raises:
        ConfigError: The job declares no [[imports]].
    """
    job, stats = expansion.job, ImportStats()
    if not job.imports:
        raise ConfigError(f"{job.path}: the job declares no [[imports]]; add one with dataset, "
                          "prompt, model and field (the item field holding the answer)")
    endpoints = {m.name: m.endpoint for m in job.models}
    wanted = {(i.dataset, i.prompt, i.model): i.field for i in job.imports}
    seen: set[str] = set()
    pending: list[tuple[str, Mapping[str, object]]] = []  # stored STORE_CHUNK at a time
    for task in expansion.tasks():
        field = wanted.get((task.dataset, task.prompt, task.model))
        if field is None or task.key in seen:  # aspects of one form share one request
            continue
        seen.add(task.key)
        if task.members:
            raise ConfigError(f"{job.path}: imports for group prompt {task.prompt!r} are not "
                              "supported; import per-item answers")
        text = expansion.item(task.dataset, task.item_id).extra.get(field)
        if not isinstance(text, str):
            stats.without_answer += 1
            continue
        if task.key in cache and not force:
            stats.already_cached += 1
            continue
        pending.append((task.key, _record(task.body, endpoints[task.model], text,
                                          f"import:{task.dataset}/{field}")))
        if len(pending) >= STORE_CHUNK:
            stats.stored += cache.put_many(pending)
            pending = []
    stats.stored += cache.put_many(pending)
    return stats
