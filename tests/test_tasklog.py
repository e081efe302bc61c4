"""runner.session.pool.TaskLog: the run's compact log of its judge tasks gives them back, in
order, exactly as the reports read them."""

from __future__ import annotations

from pathlib import Path

from runner.job.load import load_job
from runner.prepare import prepare
from runner.session.pool import TaskLog
from runner.tasks import Task
from tests.conftest import ROOT, JobWriter
from tests.test_expand import JOB, ROWS, TEMPLATE


def _as_logged(task: Task) -> Task:
    return task._replace(body=b"", prompt_tokens=0, max_tokens=0)


def _round_trip(tasks: list[Task]) -> None:
    log = TaskLog()
    for task in tasks:
        log.append(task)
    assert len(log) == len(tasks)
    assert list(log) == [_as_logged(t) for t in tasks]
    assert list(log) == list(log)  # read twice: the log is not consumed
    drained = log.drain()
    assert next(drained) == _as_logged(tasks[0]) and len(log) == len(tasks)  # not yet
    assert [_as_logged(tasks[0]), *drained] == [_as_logged(t) for t in tasks]
    assert len(log) == 0 and list(log) == []  # emptied once read to the end


def test_item_tasks_with_samples_prompts_and_models(write_job: JobWriter) -> None:
    path = write_job(JOB, rows=ROWS, files={"prompt.txt": TEMPLATE})
    tasks = list(prepare(load_job(path), ROOT).tasks())
    assert {t.sample for t in tasks} == {0, 1} and len({t.model for t in tasks}) == 2
    _round_trip(tasks)
    _round_trip(tasks[::-1])  # items interleaved: a unit comes back after another one


def test_group_tasks_keep_their_members(data_dir: Path) -> None:
    job = load_job(ROOT / "jobs" / "tst-formality.toml")
    tasks = list(prepare(job, data_dir, limit=30).tasks())
    assert any(t.members for t in tasks)
    _round_trip(tasks)
