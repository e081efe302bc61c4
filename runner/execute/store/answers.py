"""What judging reads of a stored answer (`Answer`), and how a record becomes one: read in
this process (`of_record`, `of_raw`), or sent by a reader child through a pipe (`sent`, what
the child writes; `received`, what this process makes of it).

Judging (runner.reduce.judgments) reads an Answer by its field names and never sees a record
or the pipe's format. On the pipe a usual answer, one choice without logprobs whose message
content is text, goes as a short list [text, finish_reason, usage as JSON text or None, source,
time, and the four token counts of Tokens]: ~4 objects to decode where the record's part is ~14
(nested dicts), and its usage as JSON text that the judgment line embeds as it is
(orjson.Fragment). Any other answer goes as a dict of the record's response choices, usage,
source and time; a damaged record as {DAMAGED: why}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from runner.execute.store.faults import damage
from runner.job.bill import Tokens

__all__ = ["Answer", "Sent", "of_raw", "of_record", "received", "sent", "sent_of_raw"]


class Answer(NamedTuple):
    """What judging reads of one stored answer (a NamedTuple: made once a task)."""

    text: str
    """The text of its one choice (its message content; "" if none). With `choices`: ""."""
    finish_reason: str | None
    """Its one choice's finish_reason; None with `choices`."""
    usage: Mapping[str, Any] | orjson.Fragment | None
    """The response's usage: as its JSON text (an orjson.Fragment) when a reader child sent
    it, which a judgment line embeds as it is; None without one."""
    source: str | None
    """Where it came from: "api", "batch:<id>", "import:<file>"."""
    time: float | None
    """When it was stored (unix seconds)."""
    tokens: Tokens
    """Its tokens by kind, from its usage; zeros without one."""
    choices: list[dict[str, Any]] | None = None
    """The response's choices when it is not one plain choice (several, logprobs): judging
    parses each; None for a plain answer (`text`)."""
    damaged: str | None = None
    """Why the stored record is unreadable (faults.damage), else None: judging makes it its
    task's failure, and the other tasks go on."""


DAMAGED = "damaged"
"""The one key of what the pipe carries for a damaged record: {"damaged": why}."""
Sent = list[Any] | dict[str, Any]
"""An answer as the pipe carries it (see the module docstring)."""


def _plain(choices: Any) -> tuple[str, str | None] | None:
    """(text, finish_reason) of a response's choices that are one plain choice, else None."""
    if isinstance(choices, list) and len(choices) == 1 and isinstance(c := choices[0], dict) \
            and not c.get("logprobs") and isinstance(m := c.get("message") or {}, dict) \
            and isinstance(text := m.get("content") or "", str):
        return text, c.get("finish_reason")
    return None


def of_record(record: Mapping[str, Any]) -> Answer:
    """The Answer of a stored record (cache.py's shape; {DAMAGED: why} for a damaged one).

    Returns:
        What judging reads of it.
    """
    if DAMAGED in record:
        return Answer("", None, None, None, None, Tokens(), damaged=record[DAMAGED])
    response, usage = record["response"], record.get("usage")
    choices = response.get("choices") if isinstance(response, dict) else None
    source, when = record.get("source"), record.get("time")
    if (plain := _plain(choices)) is not None:
        return Answer(plain[0], plain[1], usage, source, when, Tokens.of(usage))
    return Answer("", None, usage, source, when, Tokens.of(usage),
                  choices=choices if isinstance(choices, list) else [])


def of_raw(raw: bytes) -> Answer:
    """The Answer of a record's stored bytes (a damaged one's too).

    Returns:
        What judging reads of it.
    """
    return of_record(_record(raw))


def sent(record: Mapping[str, Any]) -> Sent:
    """What a reader child sends of a record (see the module docstring).

    Returns:
        A list for a plain answer (text, finish reason, usage, source, time, tokens), else the
        record's response, usage, source and time.
    """
    response, usage, source = record["response"], record.get("usage"), record.get("source")
    choices = response.get("choices")
    if (plain := _plain(choices)) is not None:
        return [plain[0], plain[1], None if usage is None else orjson.dumps(usage).decode(),
                source, record.get("time"), *Tokens.of(usage)]
    return {"response": {"choices": choices}, "usage": usage, "source": source,
            "time": record.get("time")}


def received(item: Sent) -> Answer:
    """The Answer of what a reader child sent (`sent`).

    Returns:
        Its Answer.
    """
    if type(item) is list:
        text, finish, usage, source, when, *tokens = item
        return Answer(text, finish, None if usage is None else orjson.Fragment(usage), source,
                      when, Tokens(*tokens))
    assert isinstance(item, dict)
    return of_record(item)


_RESPONSE = b',"response":'


def sent_of_raw(raw: bytes) -> Sent:
    """`sent` of a stored record, decoding only its end where that is safe: a record as
    answer_record writes it ends with "response", "usage", ..., "time", "source", after the
    request (~60% of its bytes), which judging never reads.

    `,"response":` cannot occur inside a JSON string (its quotes would be escaped), so its last
    occurrence is a key: the record's own, or one nested in a value after it. Nested, the text
    from there leaves a bracket unclosed before the record's end, and does not decode. So if
    `{` + the text from there decodes with "response", "usage", "time" and "source" in it, those
    are the record's last values for them (orjson, like json, keeps the last of a repeated key).
    Any other record is decoded whole.

    Returns:
        What a reader child sends of it.
    """
    at = raw.rfind(_RESPONSE)
    if at > 0:
        try:
            tail = orjson.loads(b"{" + raw[at + 1:])
        except orjson.JSONDecodeError:
            tail = None
        if tail and "usage" in tail and "source" in tail and "time" in tail and \
                isinstance(tail.get("response"), dict):
            return sent(tail)
    record = _record(raw)
    return record if DAMAGED in record else sent(record)


def _record(raw: bytes) -> dict[str, Any]:
    """The record `raw`, decoded whole, or {DAMAGED: why} if it is damaged."""
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        record = None
    if isinstance(record, dict) and isinstance(record.get("response"), dict):
        return record
    return {DAMAGED: damage(raw) or "not a cache record"}
