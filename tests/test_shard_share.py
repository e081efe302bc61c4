"""A shard's share of a job (runner/execute/shard.py): split by (data set, group) before any
request is rendered, the same in every process, disjoint, together the whole job; a request
that two shards' groups both render; a generation stage judged by the shard that generated."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runner.expand
from runner.errors import DataError
from runner.execute.shard import Shard
from runner.selection import TaskSelection
from runner.session.select import WorkingSet, select
from runner.tasks import Task
from tests.conftest import JobWriter
from tests.fakeserver import ThreadedServer
from tests.test_batch import GENERATE_JOB
from tests.test_cli import clean_env, judgments, run_judge

SHARDS = 3

# Two prompts: one per item, one per group over both orders (the members' outputs side by side).
_JOB = """
name = "groups"

[[datasets]]
name = "answers"
path = "data.jsonl"
[datasets.fields]
id = "id"
group = "question_id"
system = "model"
text = {{ question = "question", answer = "answer" }}
human = {{}}

[[prompts]]
name = "rate"
template = "rate.txt"
parser = "stars"
aspects = ["helpful", "correct"]

[[prompts]]
name = "battle"
per = "group"
order = "both"
output_field = "answer"
template = "battle.txt"
parser = "pair"
aspects = ["battle"]

[models.judge]
spec = "judge"
base_url = "{url}"
"""
_FILES = {"rate.txt": "Rate for {{aspect}} in stars.\n{{question}}\n{{answer}}",
          "battle.txt": "{{question}}\n1: {{output_1}}\n2: {{output_2}}\nTwo scores."}


def _rows(questions: int) -> list[dict[str, Any]]:
    """Three answers to each question, the question's answers interleaved with the next's
    (a group's items are not always consecutive)."""
    rows = []
    for q in range(questions):
        for m in range(3):
            rows.append({"id": f"q{q}-m{m}", "question_id": f"q{q}", "model": f"m{m}",
                         "question": f"What is {q} + {q}?", "answer": f"{2 * q + m} ({m})"})
    return rows[::2] + rows[1::2]


def _select(job: Path, tmp_path: Path, shard: Shard | None = None) -> WorkingSet:
    return select(TaskSelection(job=job, cache_dir=tmp_path / "cache", shard=shard),
                  data_dir=tmp_path)


def _units(tasks: Iterator[Task]) -> set[tuple[str, str]]:
    return {(t.dataset, t.item_id) for t in tasks}


def test_groups_fall_in_exactly_one_shard_and_shards_are_even() -> None:
    groups = [f"doc-{i}" for i in range(20_000)]
    shards = [Shard(i, 4) for i in range(4)]
    owners = [[s.index for s in shards if s.owns("summeval", g)] for g in groups]
    assert all(len(o) == 1 for o in owners)
    sizes = Counter(o[0] for o in owners)
    assert all(4_700 < sizes[i] < 5_300 for i in range(4)), sizes  # 5,000 each +- 6%
    # the data set's name is part of the hash: one group id in two data sets may split
    assert any(Shard(0, 4).owns("a", g) != Shard(0, 4).owns("b", g) for g in groups[:50])


@pytest.mark.slow
def test_the_split_is_the_same_in_another_process_with_another_hash_seed() -> None:
    groups = [f"story {i}" for i in range(300)]
    here = "".join(str(next(i for i in range(8) if Shard(i, 8).owns("openmeva", g)))
                   for g in groups)
    code = ("import sys; from runner.execute.shard import Shard\n"
            "groups = [f'story {i}' for i in range(300)]\n"
            "print(''.join(str(next(i for i in range(8) if Shard(i, 8).owns('openmeva', g)))"
            " for g in groups))")
    for seed in ("1", "2"):
        there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True, timeout=60, cwd=Path(__file__).parents[1],
                               env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"})
        assert there.stdout.strip() == here


def test_the_shards_are_disjoint_whole_groups_and_together_the_job(
        write_job: JobWriter, tmp_path: Path) -> None:
    job = write_job(_JOB.format(url="http://127.0.0.1:9/v1"), rows=_rows(30), files=_FILES)
    whole = _select(job, tmp_path)
    every = list(whole.expansion.tasks())
    parts = [list(_select(job, tmp_path, Shard(i, SHARDS)).expansion.tasks())
             for i in range(SHARDS)]

    assert sorted(t for part in parts for t in part) == sorted(every)  # each task once
    assert all(part for part in parts)
    for part in parts:  # in the job's order
        members = set(part)
        assert part == [t for t in every if t in members]
    group_of = {(it.dataset, it.item_id): it.group for it in whole.expansion.items["answers"]}
    group_of.update({(t.dataset, t.item_id): t.item_id for t in every if t.members})
    owner: dict[str, int] = {}
    for i, part in enumerate(parts):
        for t in part:
            assert owner.setdefault(group_of[t.dataset, t.item_id], i) == i  # a group whole
    # the group prompt's requests show every member: 3 answers, in both orders -> 2 per group
    battles = [t for part in parts for t in part if t.prompt == "battle"]
    assert len(battles) == 2 * 30 and all(len(t.members) == 3 for t in battles)
    counts = [_select(job, tmp_path, Shard(i, SHARDS)).expansion.count() for i in range(SHARDS)]
    assert counts == [len(part) for part in parts]


def test_a_shard_holds_and_renders_only_its_own_items(
        write_job: JobWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = write_job(_JOB.format(url="http://127.0.0.1:9/v1"), rows=_rows(30), files=_FILES)
    rendered: list[str] = []
    real = runner.expand.unit_tasks

    def counting(item: Any, *args: Any) -> Iterator[Task]:
        rendered.append(item.group)
        return real(item, *args)

    monkeypatch.setattr(runner.expand, "unit_tasks", counting)
    shard = _select(job, tmp_path, Shard(1, SHARDS))
    tasks = list(shard.expansion.tasks())

    owned = {f"q{q}" for q in range(30) if Shard(1, SHARDS).owns("answers", f"q{q}")}
    assert 0 < len(owned) < 30
    held = shard.expansion.items["answers"]
    assert len(held) == 3 * len(owned) and {it.group for it in held} == owned
    assert {key[1].split("-")[0] for key in shard.expansion.index} == owned
    # 8 units a group (3 answers x 2 aspects, the battle in 2 orders), the other groups' none
    assert len(rendered) == 8 * len(owned) and set(rendered) == owned
    assert {t.item_id.split("-")[0] for t in tasks} == owned


def test_a_shard_with_none_of_a_data_sets_items_is_no_error_but_an_empty_file_is(
        write_job: JobWriter, tmp_path: Path) -> None:
    job = write_job(_JOB.format(url="http://127.0.0.1:9/v1"), rows=_rows(2), files=_FILES)
    owners = {i for q in range(2) for i in range(100) if Shard(i, 100).owns("answers", f"q{q}")}
    idle = next(i for i in range(100) if i not in owners)

    assert _select(job, tmp_path, Shard(idle, 100)).expansion.count() == 0
    (job.parent / "data.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="no items"):
        _select(job, tmp_path, Shard(idle, 100))


_DUPLICATE_JOB = """
name = "dup"

[[datasets]]
name = "texts"
path = "data.jsonl"
[datasets.fields]
id = "id"
group = "doc"
system = "system"
text = {{ output = "output" }}
human = {{ quality = "quality" }}

[[prompts]]
name = "stars"
template = "p.txt"
parser = "stars"
aspects = ["quality"]

[models.judge]
spec = "fake"
base_url = "{url}"
"""


def _groups_of_two_shards() -> tuple[str, str]:
    """A group id of shard 0/2 and one of shard 1/2, data set "texts"."""
    names = [f"doc{i}" for i in range(100)]
    first = next(g for g in names if Shard(0, 2).owns("texts", g))
    second = next(g for g in names if Shard(1, 2).owns("texts", g))
    return first, second


@pytest.mark.slow
def test_a_request_two_shards_render_is_paid_once_when_they_run_one_after_another(
        server: ThreadedServer, write_job: JobWriter, tmp_path: Path, data_dir: Path) -> None:
    # The template reads only the output, and one output is in both groups: one request.
    first, second = _groups_of_two_shards()
    rows = [{"id": "a1", "doc": first, "system": "s1", "output": "the same text", "quality": 3},
            {"id": "a2", "doc": first, "system": "s2", "output": "only in A", "quality": 2},
            {"id": "b1", "doc": second, "system": "s1", "output": "the same text", "quality": 4},
            {"id": "b2", "doc": second, "system": "s2", "output": "only in B", "quality": 1}]
    job = write_job(_DUPLICATE_JOB.format(url=server.url), rows=rows,
                    files={"p.txt": "Rate this text in stars: {{output}}"})
    env = clean_env(data_dir)
    cache = ("--cache-dir", tmp_path / "cache")
    texts = []
    for i in range(2):
        done = run_judge("run", job, *cache, "--yes", "--out", tmp_path / f"out{i}",
                         "--shard", f"{i}/2", env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        texts.append(done.stderr)
        # only the shard's own group was sent: its own text, and the shared one once
        assert len(server.state.bodies) == 2 + i

    assert "shard 0/2: 2 tasks: 0 cached, 2 called" in texts[0]
    assert "shard 1/2: 2 tasks: 1 cached, 1 called" in texts[1]  # shard 0's answer, read
    assert set(server.state.bodies.values()) == {1} and len(server.state.bodies) == 3
    merged = run_judge("rescore", job, *cache, "--out", tmp_path / "merged", env=env,
                       cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    lines = judgments(tmp_path / "merged")
    assert len(lines) == 4 and all(j["score"] is not None for j in lines)
    assert len({j["key"] for j in lines}) == 3




@pytest.mark.slow
def test_each_shard_judges_the_answers_it_generated_so_one_pass_of_each_is_the_job(
        server: ThreadedServer, write_job: JobWriter, tmp_path: Path, data_dir: Path) -> None:
    server.state.script.reply = lambda body: (  # every answer its own: no repeated request
        f"answer to {body['messages'][-1]['content']}" if body["model"] == "cand" else
        f"{2 + len(body['messages'][-1]['content']) % 3} stars")  # a spread: not a no-spread judge
    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(12)]
    job = write_job(GENERATE_JOB.format(url=server.url), rows=rows,
                    files={"q.txt": "{{question}}", "rate.txt": "Rate in stars: {{output}}"})
    env, cache = clean_env(data_dir), ("--cache-dir", tmp_path / "cache")
    for i in range(2):  # one after the other: shard 0 never sees shard 1's answers
        done = run_judge("run", job, *cache, "--yes", "--out", tmp_path / f"out{i}",
                         "--shard", f"{i}/2", env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        # its answers, then its judges over all of them: none left for a second pass
        assert re.search(rf"shard {i}/2: (\d+) tasks: 0 cached, \1 called, 0 repeat an "
                         r"earlier task, 0 failed, 0 not run", done.stderr), done.stderr

    merged = run_judge("rescore", job, *cache, "--out", tmp_path / "merged", env=env,
                       cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    lines = judgments(tmp_path / "merged")
    assert len(lines) == 12 and all(j["score"] is not None for j in lines)
    assert set(server.state.bodies.values()) == {1} and len(server.state.bodies) == 24
