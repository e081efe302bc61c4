"""One request: the Task value, and the tasks of one unit (item or group, prompt, aspect).

Each task carries the exact request body it sends and its cache key: the sha256 of the
canonical JSON (orjson, sorted keys) of the endpoint, the request body (model, messages and
every request parameter) and the sample index. The key never covers the API key, the parser,
timeouts, retries or concurrency: those do not change the answer. runner.expand streams the
units in order; this module renders them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from runner.data.datasets import Item
from runner.job.spec import PLACEHOLDER, Job, ModelSpec, PromptSpec

__all__ = ["CHARS_PER_TOKEN", "Frames", "Task", "cache_key", "new_task", "prefix_marked", "render",
           "request_body", "task_key", "unit_tasks"]

# Rough prompt-token estimate (no tokenizer download needed offline); the limiter reconciles
# every reservation with the response's `usage`, so an estimate only shifts timing a little.
CHARS_PER_TOKEN = 4
DEFAULT_MAX_TOKENS = 256  # reservation when a request sets no max_tokens


class Task(NamedTuple):
    """One request to send (or find in the cache).

    A NamedTuple, not a frozen dataclass: as immutable, but made in 0.35 us where a frozen
    dataclass's __init__ (an object.__setattr__ per field) took 3 us, and a cached 100k-task
    run makes a Task two or three times a task. Made by `new_task`, every field by name."""

    key: str
    dataset: str
    item_id: str
    prompt: str
    aspect: str
    model: str
    sample: int
    body: bytes
    """The JSON request body, exactly as sent."""
    prompt_tokens: int
    """Estimated prompt tokens."""
    max_tokens: int
    """Completion tokens reserved: max_tokens x n."""
    members: tuple[str, ...] = ()
    """Group mode: the item ids listed as Output 1..n (item_id is then the group)."""
    prefix: int = 0
    """Characters at the start of the request's text (its messages' contents in order) that
    the prompt's other requests share: what a provider can cache (`PromptSpec.prefix_until`);
    0 = none, prompt_cache off, or no anthropic model in the job (the one kind told; the
    others skip its ~11% of G-Eval's expansion time). Not in the key: it changes how a body is
    sent, not what."""

    def without_body(self) -> Task:
        """This task without its request body, to keep many in memory.

        Returns:
            A copy with body b"", every other field the same.
        """
        return new_task(key=self.key, dataset=self.dataset, item_id=self.item_id,
                        prompt=self.prompt, aspect=self.aspect, model=self.model,
                        sample=self.sample, body=b"", prompt_tokens=self.prompt_tokens,
                        max_tokens=self.max_tokens, members=self.members,
                        prefix=self.prefix)


_tuple_new = tuple.__new__


def new_task(*, key: str, dataset: str, item_id: str, prompt: str, aspect: str, model: str,
             sample: int, body: bytes, prompt_tokens: int, max_tokens: int,
             members: tuple[str, ...] = (), prefix: int = 0) -> Task:
    """The one way to make a Task: every field by name (Task's fields say what each holds).

    Args:
        key: the cache key (64 hex digits), or "" where the caller has none (skeleton).
        dataset, item_id, prompt, aspect, model, sample: which task it is.
        body: the JSON request body, exactly as sent (b"" where it is not kept).
        prompt_tokens: estimated prompt tokens; max_tokens: completion tokens reserved.
        members: group mode's item ids, listed as Output 1..n.
        prefix: the characters of the request's cacheable prefix (Task.prefix).

    Returns:
        The Task, as cheap as Task(...) with positional arguments (a NamedTuple's own __new__
        is this tuple.__new__; keywords to Task itself cost twice as much).
    """
    return _tuple_new(Task, (key, dataset, item_id, prompt, aspect, model, sample, body,
                             prompt_tokens, max_tokens, members, prefix))


def task_key(task: Task) -> str:
    """A task's cache key: the key function of the cache lookups and reads over tasks.

    Args:
        task: any task.

    Returns:
        task.key.
    """
    return task.key


def render(template: str, values: Mapping[str, str]) -> str:
    """Fill `{{name}}` placeholders in one pass: braces inside the values pass through as is.

    Args:
        template: the text with its `{{name}}` placeholders.
        values: placeholder name -> its text (every placeholder of the template).

    Returns:
        The rendered text.
    """
    return _compiled(template).format_map(values)


@functools.lru_cache(maxsize=1024)
def _compiled(template: str) -> str:
    """The template as a str.format string: `{{ name }}` -> `{name}`, every other brace
    doubled. format_map fills it in C and, like one re.sub pass, never reads a brace inside a
    value (4-6x faster than re.sub with a function, and the prompt is rendered per task)."""
    pieces = PLACEHOLDER.split(template)  # literal, name, literal, ..., literal
    return "".join(p.replace("{", "{{").replace("}", "}}") if i % 2 == 0 else f"{{{p}}}"
                   for i, p in enumerate(pieces))


def request_body(prompt: PromptSpec, model: ModelSpec, values: Mapping[str, str],
                 aspect: str, subset: str = "") -> dict[str, Any]:
    """The chat-completions request body for one (item or group, prompt, aspect, model).

    The reference of what unit_tasks builds faster (and falls back to).

    Args:
        prompt: the prompt; model: the model it is sent to.
        values: the template values (the item's fields, joined, with `aspect`).
        aspect: the aspect scored; subset: the item's subset (choosing the template).

    Returns:
        The body as a dict: model, messages (system, then user), the model's and the prompt's
        params (the prompt's win).
    """
    messages = []
    if prompt.system:
        messages.append({"role": "system", "content": render(prompt.system, values)})
    template = prompt.template(aspect, subset, values)
    assert template is not None, "tasks exist only where a template does"
    messages.append({"role": "user", "content": render(template, values)})
    return {"model": model.model, "messages": messages, **model.params, **prompt.params}


def cache_key(endpoint: str, body: Mapping[str, Any], sample: int) -> str:
    """sha256 of what determines the answer: endpoint, full request body, sample index.

    Args:
        endpoint: ModelSpec.endpoint; body: the request body; sample: the sample index.

    Returns:
        64 hex digits; the same for the same body with its keys in any order.
    """
    canonical = orjson.dumps({"endpoint": endpoint, "request": body, "sample": sample},
                             option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _key(endpoint: bytes, canonical_body: bytes, sample: int) -> str:
    """cache_key from the body's canonical bytes (sorted keys), without serialising it again:
    the same bytes orjson writes for {"endpoint", "request", "sample"} with sorted keys."""
    return hashlib.sha256(b'{"endpoint":%s,"request":%s,"sample":%d}'
                          % (endpoint, canonical_body, sample)).hexdigest()


@dataclass(frozen=True, slots=True)
class _Frame:
    """One (prompt, model)'s request body as bytes around its message contents: the body is
    parts[0] + content_1 + parts[1] (+ content_2 + parts[2]), each content serialised as orjson
    writes a string. Only the contents change from task to task, so the rest of the body
    (model, parameters, sorted keys) is serialised once, not per task."""

    parts: tuple[bytes, ...]
    endpoint: bytes
    """orjson of the model's endpoint, as the key has it."""
    reserve: int
    """Completion tokens reserved: max_tokens x n."""


# Stand-ins for the message contents while a frame is cut: they must not occur elsewhere in a
# body (checked: a frame whose body holds one twice is not used).
_MARKS = ("\x00judge-runner content 0\x00", "\x00judge-runner content 1\x00")


class Frames(dict[tuple[str, str], "_Frame | None"]):
    """(prompt name, model name) -> its frame, built on first use; None if it cannot be cut
    (then the body is built and serialised whole, as request_body does)."""

    def get_frame(self, prompt: PromptSpec, model: ModelSpec) -> _Frame | None:
        """The frame of `prompt` sent to `model` (built now if it is new), or None.

        Args:
            prompt: the prompt; model: the model it is sent to.

        Returns:
            The frame, or None where the body cannot be cut (it is then built whole).
        """
        key = (prompt.name, model.name)
        if key not in self:
            self[key] = _frame(prompt, model)
        return self[key]


def _frame(prompt: PromptSpec, model: ModelSpec) -> _Frame | None:
    marks = _MARKS if prompt.system else _MARKS[1:]
    messages = [{"role": "system", "content": marks[0]}] if prompt.system else []
    messages.append({"role": "user", "content": marks[-1]})
    body = {"model": model.model, "messages": messages, **model.params, **prompt.params}
    raw = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    parts: list[bytes] = []
    for mark in (orjson.dumps(m) for m in marks):
        if raw.count(mark) != 1:
            return None
        head, raw = raw.split(mark)
        parts.append(head)
    return _Frame(parts=(*parts, raw), endpoint=orjson.dumps(model.endpoint),
                  reserve=_reserve(body))


def _reserve(body: Mapping[str, Any]) -> int:
    return int(body.get("max_tokens") or body.get("max_completion_tokens")
               or DEFAULT_MAX_TOKENS) * int(body.get("n", 1))


def unit_tasks(item: Item, values: Mapping[str, str], members: tuple[str, ...],
               prompt: PromptSpec, aspect: str, template: str, models: Sequence[ModelSpec],
               frames: Frames, cache: bool) -> Iterator[Task]:
    """One unit's tasks, its text rendered once for every model (request_body's bodies, made
    from each model's frame).

    Args:
        item: the item (group mode: the group's first member); members: group mode's ids.
        values: the template values; prompt, aspect, template: what is asked.
        models: the judges, in order; frames: the frames built so far (added to).
        cache: whether the tasks get their Task.prefix (prefix_marked).

    Returns:
        The tasks, model by model, sample by sample.
    """
    item_id = item.group if members else item.item_id
    values = {**values, "aspect": aspect}
    prefix = _prefix(prompt, template, values) if cache else 0
    # Rendered and serialised once for every model: only the frame around them differs.
    texts = [render(prompt.system, values)] if prompt.system else []
    texts.append(render(template, values))
    contents = [orjson.dumps(t) for t in texts]
    tokens = sum(map(len, texts)) // CHARS_PER_TOKEN + 8
    for model in models:
        frame = frames.get_frame(prompt, model)
        if frame is None:  # sent with sorted keys too: one serialisation, request and key
            body = request_body(prompt, model, values, aspect, item.subset)
            raw, reserve = orjson.dumps(body, option=orjson.OPT_SORT_KEYS), _reserve(body)
            endpoint = orjson.dumps(model.endpoint)
        else:
            p = frame.parts
            raw = (p[0] + contents[0] + p[1] if len(p) == 2 else
                   b"".join((p[0], contents[0], p[1], contents[1], p[2])))
            reserve, endpoint = frame.reserve, frame.endpoint
        for sample in range(prompt.samples):
            yield new_task(key=_key(endpoint, raw, sample), dataset=item.dataset,
                           item_id=item_id, prompt=prompt.name, aspect=aspect, model=model.name,
                           sample=sample, body=raw, prompt_tokens=tokens, max_tokens=reserve,
                           members=members, prefix=prefix)


def prefix_marked(job: Job) -> bool:
    """Whether tasks get their Task.prefix: only anthropic requests mark it.

    Returns:
        True when the job's prompt_cache is on and one of its models is anthropic.
    """
    return job.prompt_cache and any(m.kind == "anthropic" for m in job.models)


def _prefix(prompt: PromptSpec, template: str, values: Mapping[str, str]) -> int:
    """Task.prefix: the length of the system text and the template, rendered, up to the
    placeholder that ends the shared part (`prompt.prefix_until`, else the first but
    {{aspect}}): the bytes every request of the prompt (or of one document) begins with.
    Counted from the lengths of the values, without rendering the text again."""
    size = 0
    for text in [prompt.system, template] if prompt.system else [template]:
        literal, names, whole = _head(text, prompt.prefix_until)
        size += literal + sum(len(values[name]) for name in names)
        if not whole:
            break
    return size


@functools.lru_cache(maxsize=256)
def _head(text: str, until: str | None) -> tuple[int, tuple[str, ...], bool]:
    """Of the text before the placeholder that ends a prefix: the length of its literal text,
    the placeholders in it, and whether no placeholder ends it (the whole text is shared)."""
    pieces = PLACEHOLDER.split(text)  # literal, name, literal, ..., literal
    for i in range(1, len(pieces), 2):
        if pieces[i] == until or (until is None and pieces[i] != "aspect"):
            return sum(map(len, pieces[:i:2])), tuple(pieces[1:i:2]), False
    return sum(map(len, pieces[::2])), tuple(pieces[1::2]), True
