"""The request and output lines of a provider batch, and the request files they are split into:
a batch request's body is byte for byte the body the online pool would send, under the task's
cache key as its custom_id, so a batch answer is stored exactly as an online one.

One request line: `{"custom_id": <cache key>, "method": "POST", "url": "/v1/chat/completions",
"body": <the exact body the online pool would send>}`. A model's requests are split into files
of at most `max_requests` lines and `max_bytes` bytes (OpenAI: 50,000 and 200 MB).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from runner.children import alive
from runner.execute.batch_api import CHAT_URL
from runner.tasks import Task

__all__ = ["MAX_BYTES", "MAX_REQUESTS", "body_of", "output_line", "remove_stale", "request_bodies",
           "request_line", "write_files"]

MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
_LINE_HEAD = b'{"custom_id":"'
_LINE_MIDDLE = b'","method":"POST","url":"' + CHAT_URL.encode() + b'","body":'


def request_line(task: Task) -> bytes:
    """One request line of a batch file.

    Args:
        task: the task.

    Returns:
        The JSONL line, newline included; the body is written byte for byte as the online
        pool sends it and the custom_id is the task's cache key.
    """
    return _LINE_HEAD + task.key.encode() + _LINE_MIDDLE + task.body + b"}\n"


def body_of(line: bytes) -> tuple[str, bytes]:
    """The custom_id and body of a request line.

    Args:
        line: a line `request_line` wrote (sliced, not parsed) or any other request line.

    Returns:
        (custom_id, the body's bytes).
    """
    end = line.find(b'"', len(_LINE_HEAD))
    if line.startswith(_LINE_HEAD) and line[end:end + len(_LINE_MIDDLE)] == _LINE_MIDDLE:
        return line[len(_LINE_HEAD):end].decode(), line[end + len(_LINE_MIDDLE):].rstrip()[:-1]
    obj = orjson.loads(line)
    return str(obj["custom_id"]), orjson.dumps(obj["body"])


async def request_bodies(copy: Path, lines: Callable[[], AsyncIterator[bytes]]
                         ) -> dict[str, bytes]:
    """The request bodies of a batch's request file: from our copy, else the provider's.

    Args:
        copy: our copy of the request file (it may be gone).
        lines: the provider's copy, line by line; called only when ours is gone.

    Returns:
        custom_id -> the request body.
    """
    if copy.exists():
        with copy.open("rb") as f:
            return dict(map(body_of, f))
    return dict([body_of(line) async for line in lines()])


def write_files(folder: Path, name: str, tasks: list[Task], max_requests: int = MAX_REQUESTS,
                max_bytes: int = MAX_BYTES) -> Iterator[tuple[Path, list[str]]]:
    """Write a model's request files, one at a time as the iterator is advanced.

    Args:
        folder: where the files go, named `upload-<pid>-<model>-<ns>-<part>.jsonl`.
        name: the model's name in the job.
        tasks: its tasks, in order.
        max_requests: at most this many lines a file.
        max_bytes: at most this many bytes a file (a single larger line gets a file alone).

    Returns:
        An iterator of (path, the keys the file holds, in order).
    """
    part = 0
    start = 0
    while start < len(tasks):
        path = folder / f"upload-{os.getpid()}-{name.replace('/', '_').replace(':', '_')}-" \
                        f"{time.time_ns()}-{part}.jsonl"
        keys: list[str] = []
        size = 0
        with path.open("wb") as out:
            while start < len(tasks) and len(keys) < max_requests:
                line = request_line(tasks[start])
                if keys and size + len(line) > max_bytes:
                    break
                out.write(line)
                size += len(line)
                keys.append(tasks[start].key)
                start += 1
        part += 1
        yield path, keys


def remove_stale(folder: Path) -> None:
    """Remove the request files of runs killed before their upload finished: those whose
    process is gone. The folder is one machine's, and may be shared by several runs at once
    (shards of a job): a live run's file is left alone.

    Args:
        folder: one machine's request-file folder (the ledger's `files`).
    """
    for path in folder.glob("upload-*.jsonl"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and alive(int(pid)):
            continue
        path.unlink(missing_ok=True)


def _is_answer(data: Any) -> bool:
    """Whether an output line's body is a chat completion with choices, each with a message."""
    return isinstance(data, dict) and isinstance(data.get("choices"), list) \
        and bool(data["choices"]) and all(isinstance(c, dict) and isinstance(
            c.get("message"), dict) for c in data["choices"])


def output_line(line: bytes) -> tuple[str, dict[str, Any] | None, str]:
    """One line of a batch's output or error file.

    Args:
        line: the line as the provider wrote it.

    Returns:
        The request's custom_id, its answer's body (None when the line holds no answer),
        and why it would hold none (the line's error, else its HTTP status).
    """
    obj = orjson.loads(line)
    key = str(obj.get("custom_id"))
    response = obj.get("response") or {}
    data = response.get("body") if isinstance(response, dict) else None
    error = obj.get("error")
    if error:
        reason = f"{error.get('code')}: {error.get('message')}"
    elif isinstance(data, dict) and isinstance(data.get("error"), dict):
        reason = f"HTTP {response.get('status_code')}: {data['error'].get('message')}"
    else:
        reason = f"HTTP {response.get('status_code')}: no answer in the response"
    ok = not error and response.get("status_code") == 200 and _is_answer(data)
    return key, data if ok else None, reason
