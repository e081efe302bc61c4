"""Tests for runner.expand: task order and count, streaming, rendering once, cache keys."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import types
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from runner.data.datasets import Item
from runner.errors import ConfigError
from runner.expand import Expansion
from runner.job.load import load_job
from runner.job.spec import placeholders
from runner.prepare import prepare
from runner.tasks import Frames, Task, _key, cache_key, new_task, request_body, unit_tasks
from tests.conftest import ROOT, JobWriter

# Data fields full of braces, and even placeholders, that must reach the judge as written.
ROWS: list[dict[str, Any]] = [
    {"id": "a", "source": "if (x) { y(); }", "output": "The {{source}} and {{ aspect }} stay.",
     "score": 1},
    {"id": "b", "source": "}{ {{{", "output": "{\"json\": [1, {\"k\": \"}}\"}]}", "score": 2},
    {"id": "c", "source": "plain é ✓ \\1 $1", "output": "{{beginning}}", "score": 3},
]
TEMPLATE = ("Rate the {{aspect}}.\nSource: {{source}}\nStory: {{ output }}\n"
            "Reply as {\"stars\": N}\n")
SYSTEM = "You judge {{aspect}}."

JOB = """
[[datasets]]
name = "mine"
path = "data.jsonl"
fields = { id = "id", text = { source = "source", output = "output" }, \
           human = { overall = "score" } }

[[prompts]]
name = "first"
template = "prompt.txt"
system = "You judge {{aspect}}."
parser = "stars"
aspects = ["overall", "fluency"]
params = { temperature = 0, max_tokens = 8, top_p = 0.5 }
samples = 2

[[prompts]]
name = "second"
template = "prompt.txt"
parser = "number"
aspects = ["overall"]

[limits]
concurrency = 3

[models.m1]
spec = "judge-a"
base_url = "http://127.0.0.1:9001/v1"
params = { temperature = 1, seed = 5 }
api_key_env = "KEY_A"

[models.m2]
spec = "judge-b"
base_url = "http://127.0.0.1:9002/v1"
"""


def _expand(write_job: JobWriter, toml: str = JOB, template: str = TEMPLATE,
            data_dir: Path = ROOT, limit: int | None = None) -> Expansion:
    path = write_job(toml, rows=ROWS, files={"prompt.txt": template})
    return prepare(load_job(path), data_dir, limit=limit)


def _expected(aspect: str, row: dict[str, Any]) -> str:
    """TEMPLATE filled in by hand: concatenation, no template engine involved."""
    return ("Rate the " + aspect + ".\nSource: " + row["source"] + "\nStory: " + row["output"]
            + "\nReply as {\"stars\": N}\n")


def _canonical_key(endpoint: str, task: Task) -> str:
    """The documented key, computed independently of orjson: sorted keys, compact JSON."""
    canonical = json.dumps({"endpoint": endpoint, "request": json.loads(task.body),
                            "sample": task.sample}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_order_and_count(write_job: JobWriter) -> None:
    exp = _expand(write_job)
    tasks = list(exp.tasks())
    # item x prompt x aspect x model x sample
    expected = [(row["id"], prompt, aspect, model, sample)
                for row in ROWS
                for prompt, aspects, samples in (("first", ("overall", "fluency"), 2),
                                                 ("second", ("overall",), 1))
                for aspect, model, sample in itertools.product(aspects, ("m1", "m2"),
                                                               range(samples))]
    assert [(t.item_id, t.prompt, t.aspect, t.model, t.sample) for t in tasks] == expected
    assert exp.count() == len(tasks) == 3 * (2 * 2 * 2 + 1 * 2 * 1) == 30
    assert {t.dataset for t in tasks} == {"mine"}
    assert list(exp.tasks()) == tasks  # deterministic: same tasks, same order, same bytes


@pytest.mark.parametrize(("size", "parts"), [(1, 2), (3, 2), (5, 3), (7, 2), (30, 2), (100, 2)])
def test_parts_are_the_tasks_cut_in_runs(write_job: JobWriter, size: int, parts: int) -> None:
    """A forked Expander's children each expand a part (runs of `size` tasks, every `parts`-th
    one): runs cut inside a unit (2 models x 2 samples) as well as at its edges."""
    exp = _expand(write_job)
    tasks = list(exp.tasks())
    runs = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    for part in range(parts):
        assert list(exp.part(size, part, parts)) == [t for run in runs[part::parts] for t in run]
    assert [list(exp.tasks(start)) for start in range(32)] == [tasks[s:] for s in range(32)]


def test_tasks_stream(write_job: JobWriter) -> None:
    exp = _expand(write_job)
    stream = exp.tasks()
    assert isinstance(stream, types.GeneratorType)
    first = next(stream)
    assert (first.item_id, first.prompt, first.aspect, first.model, first.sample) == (
        "a", "first", "overall", "m1", 0)


def test_limit_takes_the_first_items(write_job: JobWriter) -> None:
    exp = _expand(write_job, limit=2)
    assert [it.item_id for it in exp.items["mine"]] == ["a", "b"]
    assert exp.count() == len(list(exp.tasks())) == 20


def test_request_body_rendered_once(write_job: JobWriter) -> None:
    exp = _expand(write_job)
    tasks = list(exp.tasks())
    by_id = {row["id"]: row for row in ROWS}
    for task in tasks:
        body = json.loads(task.body)
        row = by_id[task.item_id]
        user = body["messages"][-1]
        assert user == {"role": "user", "content": _expected(task.aspect, row)}
        if task.prompt == "first":
            assert body["messages"][0] == {"role": "system", "content": f"You judge {task.aspect}."}
        else:
            assert len(body["messages"]) == 1
        assert body["model"] == {"m1": "judge-a", "m2": "judge-b"}[task.model]
    # The literal placeholders inside the data are still there, unrendered.
    c_story = json.loads(next(t for t in tasks if t.item_id == "c").body)["messages"][-1]
    assert "Story: {{beginning}}\n" in c_story["content"]
    a_story = json.loads(tasks[0].body)["messages"][-1]["content"]
    assert "The {{source}} and {{ aspect }} stay." in a_story


def test_params_merge_prompt_over_model(write_job: JobWriter) -> None:
    tasks = list(_expand(write_job).tasks())
    body = json.loads(tasks[0].body)  # first prompt, model m1
    assert {k: v for k, v in body.items() if k not in ("model", "messages")} == {
        "temperature": 0, "seed": 5, "max_tokens": 8, "top_p": 0.5}
    second_m2 = next(t for t in tasks if t.prompt == "second" and t.model == "m2")
    assert set(json.loads(second_m2.body)) == {"model", "messages"}
    assert tasks[0].max_tokens == 8 and second_m2.max_tokens == 256  # reservation default


def test_unknown_placeholder(write_job: JobWriter) -> None:
    path = write_job(JOB, rows=ROWS, files={"prompt.txt": TEMPLATE + "{{missing}}\n"})
    with pytest.raises(ConfigError) as info:
        prepare(load_job(path), ROOT)
    message = str(info.value)
    assert message.startswith(f"{path}: prompts[0].template uses {{{{missing}}}}, ")
    assert "data set 'mine'" in message and "output" in message and "source" in message


def test_unknown_placeholder_in_system_prompt(write_job: JobWriter) -> None:
    toml = JOB.replace(SYSTEM, "You judge {{aspekt}}.")
    with pytest.raises(ConfigError, match=r"\{\{aspekt\}\}.*'mine'"):
        _expand(write_job, toml=toml)


def test_cache_key_is_sha256_of_canonical_json(write_job: JobWriter) -> None:
    exp = _expand(write_job)
    endpoints = {m.name: m.endpoint for m in exp.job.models}
    tasks = list(exp.tasks())
    for task in tasks:
        assert task.key == _canonical_key(endpoints[task.model], task)
    # 30 tasks, 30 distinct requests (sample index and model split them)
    assert len({t.key for t in tasks}) == 30


def test_cache_key_pinned() -> None:
    """Changing how keys are computed would orphan every user's cache: pin one."""
    body = {"model": "judge", "messages": [{"role": "user", "content": "Rate: {x} é"}],
            "temperature": 0, "max_tokens": 8}
    assert cache_key("http://127.0.0.1:8000/v1", body, 0) == (
        "97b562f351ce06a398e5365ec761cd7d6f4466fc50d6e959219e2357b16a7e3f")


def _keys(write_job: JobWriter, toml: str) -> list[str]:
    return [t.key for t in _expand(write_job, toml=toml).tasks()]


@pytest.mark.parametrize(("old", "new"), [
    ('parser = "stars"', 'parser = "number"'),                    # parser
    ('api_key_env = "KEY_A"', 'api_key_env = "OTHER"'),           # which key
    ("concurrency = 3", "concurrency = 9\nrpm = 60\ntpm = 1000\nmax_retries = 0\ntimeout_s = 1"),
    ("temperature = 0, max_tokens = 8, top_p = 0.5",
     "top_p = 0.5, max_tokens = 8, temperature = 0"),                # params order
    ('name = "first"', 'name = "renamed"'),                         # names are not requests
])
def test_cache_key_ignores(write_job: JobWriter, old: str, new: str) -> None:
    assert JOB.count(old) == 1
    assert _keys(write_job, JOB.replace(old, new)) == _keys(write_job, JOB)


@pytest.mark.parametrize(("old", "new", "scope"), [
    ("http://127.0.0.1:9001/v1", "http://127.0.0.1:9003/v1", "m1"),   # base_url
    ('spec = "judge-a"', 'spec = "judge-c"', "m1"),                     # model
    ("seed = 5", "seed = 6", "m1"),                                     # a model's params
    ("top_p = 0.5", "top_p = 0.6", "first"),                            # a prompt's params
    ("max_tokens = 8", "max_tokens = 8, logprobs = true", "first"),
    ("You judge {{aspect}}.", "You judge the {{aspect}}.", "first"),    # messages
])
def test_cache_key_changes(write_job: JobWriter, old: str, new: str, scope: str) -> None:
    assert JOB.count(old) == 1
    before = list(_expand(write_job).tasks())
    after = list(_expand(write_job, toml=JOB.replace(old, new)).tasks())
    for b, a in zip(before, after, strict=True):
        affected = scope in (b.model, b.prompt)
        assert (a.key != b.key) == affected, (old, b)


def test_cache_key_covers_the_endpoint_not_its_trailing_slash(write_job: JobWriter) -> None:
    slash = JOB.replace("http://127.0.0.1:9001/v1", "http://127.0.0.1:9001/v1/")
    assert _keys(write_job, slash) == _keys(write_job, JOB)


def test_openmeva_registered(data_dir: Path) -> None:
    job = load_job(ROOT / "jobs" / "openmeva.toml")
    exp = prepare(job, data_dir)
    assert exp.count() == 1000
    stream = exp.tasks()
    assert isinstance(stream, types.GeneratorType)
    tasks = list(stream)
    assert len(tasks) == 1000 and len({t.key for t in tasks}) == 1000
    items = exp.items["openmeva"]
    assert [t.item_id for t in tasks] == [it.item_id for it in items]
    template = job.prompts[0].template("overall")
    first = json.loads(tasks[0].body)
    fields = items[0].fields
    expected = template.replace("{{beginning}}", fields["beginning"]).replace(
        "{{storyline}}", fields["storyline"])
    assert first == {"model": "smollm2", "messages": [{"role": "user", "content": expected}],
                     "temperature": 0, "max_tokens": 32, "stop": ["\n"]}
    assert tasks[0].key == _canonical_key("local:smollm2", tasks[0])
    limited = prepare(job, data_dir, limit=10)
    assert [t.key for t in limited.tasks()] == [t.key for t in tasks[:10]]
    # the items are counted, not spelled out (asyncio formats a run's result on Python 3.11)
    assert repr(exp) == "Expansion(job='openmeva', items={'openmeva': 1000})"


# ---------------------------------------------------------------- hypothesis: cache_key

JSON_SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8) \
    | st.floats(allow_nan=False, allow_infinity=False)
PARAMS = st.dictionaries(st.text(min_size=1, max_size=6).filter(  # what the job loader accepts
    lambda k: k not in ("model", "messages", "n", "max_tokens", "max_completion_tokens")),
    JSON_SCALARS | st.lists(JSON_SCALARS, max_size=3), max_size=6)


def _body(params: dict[str, Any], model: str = "m") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi {x}"}], **params}


@given(PARAMS, st.randoms(use_true_random=False), st.integers(0, 5))
def test_key_ignores_insertion_order(params: dict[str, Any], rnd: Any, sample: int) -> None:
    items = list(params.items())
    rnd.shuffle(items)
    shuffled = dict(items)
    body = _body(params)
    reordered = {"messages": body["messages"], **shuffled, "model": "m"}
    assert cache_key("http://h/v1", body, sample) == cache_key("http://h/v1", reordered, sample)


@given(PARAMS, st.data())
def test_key_changes_with_any_param(params: dict[str, Any], data: st.DataObject) -> None:
    base = cache_key("http://h/v1", _body(params), 0)
    if params:
        name = data.draw(st.sampled_from(sorted(params)))
        changed = {**params, name: [params[name], "changed"]}
        assert cache_key("http://h/v1", _body(changed), 0) != base
        dropped = {k: v for k, v in params.items() if k != name}
        assert cache_key("http://h/v1", _body(dropped), 0) != base
    extra = data.draw(st.text(min_size=1, max_size=6).filter(
        lambda k: k not in params and k not in ("model", "messages")))
    assert cache_key("http://h/v1", _body({**params, extra: 1}), 0) != base


@given(PARAMS, st.integers(0, 100), st.integers(0, 100))
def test_key_changes_with_sample(params: dict[str, Any], a: int, b: int) -> None:
    same = cache_key("http://h/v1", _body(params), a) == cache_key("http://h/v1", _body(params), b)
    assert same == (a == b)


@given(PARAMS, st.text(max_size=20), st.text(max_size=20))
def test_key_changes_with_endpoint_and_model(params: dict[str, Any], x: str, y: str) -> None:
    body = _body(params)
    assert (cache_key(x, body, 0) == cache_key(y, body, 0)) == (x == y)
    assert (cache_key("e", _body(params, x), 0) == cache_key("e", _body(params, y), 0)) == (x == y)


@given(PARAMS, st.text(max_size=20), st.integers(0, 100))
def test_task_keys_equal_cache_key(params: dict[str, Any], endpoint: str, sample: int) -> None:
    """Tasks build their key from the body's canonical bytes without a second serialisation;
    it must be the very same sha256 as cache_key's."""
    body = _body(params)
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    assert _key(orjson.dumps(endpoint), canonical, sample) == cache_key(endpoint, body, sample)


# ------------------------------------------------- hypothesis: bodies cut from a frame

TEXT = st.text(alphabet=st.sampled_from(list("ab {}\"\\\n\x00é✓")), max_size=30)


@given(PARAMS, TEXT, TEXT, st.booleans())
def test_task_body_is_the_serialised_request(params: dict[str, Any], before: str, after: str,
                                             system: bool) -> None:
    """Tasks splice the rendered contents into bytes serialised once per (prompt, model); the
    result must be the very bytes of serialising the whole request body with sorted keys."""
    job = load_job(ROOT / "jobs" / "openmeva.toml")
    template = before + "{{ output }}" + after + "{{aspect}}"
    assume(placeholders(template) <= {"output", "aspect"})  # "{{a}}" in `after` is one too
    prompt = dataclasses.replace(job.prompts[0], params=params, templates={"*": template},
                                 system=before + "{{aspect}}" if system else None)
    model = job.models[0]
    values = {"output": after + "{{output}}", "aspect": "overall"}
    item = Item(dataset="d", item_id="i", group="g", system="s", subset="", fields=values,
                human={}, annotators={}, metrics={}, extra={})
    tasks = list(unit_tasks(item, values, (), prompt, "overall", template, [model], Frames(),
                        True))
    body = request_body(prompt, model, values, "overall")
    assert [t.body for t in tasks] == [orjson.dumps(body, option=orjson.OPT_SORT_KEYS)]
    assert body["messages"][-1]["content"] == (before + after + "{{output}}" + after
                                               + "overall")
    assert tasks[0].key == cache_key(model.endpoint, body, 0)


def test_without_body_keeps_every_other_field(write_job: JobWriter) -> None:
    for task in _expand(write_job).tasks():
        kept = task.without_body()
        assert kept.body == b"" and task.body
        assert task._replace(body=b"") == kept


def test_new_task_takes_every_field_by_name_and_makes_a_task() -> None:
    fields = {"key": "k", "dataset": "d", "item_id": "i", "prompt": "p", "aspect": "a",
              "model": "m", "sample": 2, "body": b"{}", "prompt_tokens": 3, "max_tokens": 4,
              "members": ("x", "y"), "prefix": 5}
    made = new_task(**fields)
    assert type(made) is Task and made._asdict() == fields
    assert new_task(**{**fields, "members": (), "prefix": 0}) == Task(*[*fields.values()][:-2])
    with pytest.raises(TypeError):
        new_task(*fields.values())  # type: ignore[misc]  # keywords only
    with pytest.raises(TypeError):
        new_task(**{k: v for k, v in fields.items() if k != "sample"})  # type: ignore[arg-type]
