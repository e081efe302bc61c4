"""Task selection is one value (runner/selection.py): every command that selects tasks takes
each of its options, hands them on as one TaskSelection, and the manifest records it.

Adding a field to TaskSelection without its option (runner/cli/options.py), or a command that
declares its selection options by hand, fails here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import orjson
import pytest
from click.testing import CliRunner, Result

import runner
from runner import api
from runner.cli.main import cli
from runner.errors import ConfigError
from runner.errors import redact_url as redact
from runner.execute.shard import Shard
from runner.selection import CacheLocation, TaskSelection
from tests.fakeserver import ThreadedServer
from tests.test_cli import ENV_KEYS, JOB, write_job

# TaskSelection's fields that are not a shared option: JOB is an argument, --shard `judge run`'s.
NOT_SHARED = {"job", "shard"}
SHARED = {f.name for f in dataclasses.fields(TaskSelection)} - NOT_SHARED
CACHE = {f.name for f in dataclasses.fields(CacheLocation)}
# Commands that select a job's tasks, and those that only take the cache's location.
SELECTING = {"run", "rescore", "report", "plan", "status", "compare", "import", "batches",
             "view", "runs", "diff", "cache check", "cache explain"}
CACHE_ONLY = {"cache stats", "cache export", "cache import"}
# A value for each shared option, distinct from every default.
GIVEN: dict[str, tuple[str, ...]] = {
    "models": ("--model", "m1", "--model", "m2"), "base_url": ("--base-url", "http://h:1/v1"),
    "sample": ("--sample", "3"), "seed": ("--seed", "7"), "cache_dir": ("--cache-dir", "c"),
    "cache_url": ("--cache", "postgresql://u:secret@h/db"), "out": ("--out", "o"),
}
EXPECTED = {"models": ("m1", "m2"), "base_url": "http://h:1/v1", "sample": 3, "seed": 7,
            "cache_dir": Path("c"), "cache_url": "postgresql://u:secret@h/db", "out": Path("o"),
            "limit": None}


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path) -> Any:
    """`judge ...` through CliRunner in tmp_path, without the shell's JUDGE_* and API keys."""
    monkeypatch.chdir(tmp_path)
    for key in (*ENV_KEYS, "JUDGE_CACHE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))

    def call(*args: Any) -> Result:
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return call


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found |= _commands(command, f"{prefix}{name} ")
        else:
            found[prefix + name] = command
    return found


def _params(command: click.Command) -> set[str]:
    return {p.name for p in command.params if p.name}


def test_every_command_that_selects_tasks_takes_every_shared_option() -> None:
    commands = _commands(cli)
    with_job = {name for name, c in commands.items() if "job" in _params(c)}
    assert with_job == SELECTING  # a new command with JOB is checked here too
    for name in SELECTING:
        missing = SHARED - _params(commands[name])
        assert not missing, f"judge {name} does not take {sorted(missing)}"
    for name in CACHE_ONLY:
        assert CACHE <= _params(commands[name]), name
    shard = {name for name, c in commands.items() if "shard" in _params(c)}
    assert shard == {"run"}


@pytest.mark.parametrize("command", sorted(SELECTING - {"view", "runs", "diff", "cache check"}))
def test_each_command_hands_its_options_on_as_one_task_selection(
        command: str, invoke: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[TaskSelection] = []

    def recorded(job: TaskSelection, **_: Any) -> None:
        chosen.append(job)
        raise ConfigError("recorded")

    monkeypatch.setattr(api, "selection", recorded)
    more = {"compare": ("--judges", "a", "b"), "cache explain": ("--item", "1")}
    given = [word for words in GIVEN.values() for word in words]
    done = invoke(*command.split(), "jobs/x.toml", *given, *more.get(command, ()))
    assert done.exit_code == 2 and "recorded" in done.output, done.output
    [value] = chosen
    assert isinstance(value, TaskSelection) and value.job == "jobs/x.toml"
    assert {name: getattr(value, name) for name in SHARED} == EXPECTED
    done = invoke(*command.split(), "jobs/x.toml", "--limit", "4", *more.get(command, ()))
    assert chosen[-1].limit == 4 and chosen[-1].sample is None


def test_cache_only_commands_hand_on_a_cache_location(invoke: Any, tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    done = invoke("cache", "stats", "--cache-dir", "c")
    assert done.exit_code == 0 and done.output.startswith("c: 0 entries"), done.output
    done = invoke("cache", "stats", "--cache", "c")
    assert done.exit_code == 2 and "expected a postgresql://" in done.output, done.output


def test_options_that_contradict_are_one_error_line(invoke: Any) -> None:
    done = invoke("status", "jobs/x.toml", "--seed", "3")
    assert done.exit_code == 2
    assert done.output.strip() == ("Error: --seed 3 is the seed of the --sample draw: give "
                                   "--sample N with it (the job's `seed` is the bootstrap's)")
    done = invoke("cache", "check", "--model", "m")
    assert done.output.strip() == "Error: --model chooses a job's tasks: give JOB with it"


def test_the_manifest_records_the_selection_without_secrets(
        server: ThreadedServer, tmp_path: Path, invoke: Any) -> None:
    job = write_job(tmp_path / "job", JOB)
    out = tmp_path / "out"
    common = ("--model", "fake", "--base-url", server.url, "--sample", "2", "--cache-dir",
              tmp_path / "cache", "--out", out)
    assert invoke("run", job, *common, "--yes").exit_code == 0
    made = orjson.loads((out / "manifest.json").read_bytes())
    assert made["selection"] == {
        "job": str(job), "models": ["fake"], "base_url": server.url, "limit": None,
        "sample": 2, "seed": 0, "cache_dir": str(tmp_path / "cache"), "cache_url": None,
        "out": str(out), "shard": None}
    assert set(made["selection"]) == {f.name for f in dataclasses.fields(TaskSelection)}
    secret = TaskSelection(job="j", cache_url="postgresql://u:secret@h/db",
                           base_url="http://u:key@h/v1")
    recorded = orjson.dumps(secret.recorded()).decode()
    assert "secret" not in recorded and "key@" not in recorded and "***" in recorded
    assert "secret" not in " ".join(secret.arguments())


def test_a_selection_takes_loose_values_and_gives_them_back_as_options() -> None:
    """Strings and lists become the fields' types; `arguments` is the command line that
    selects the same tasks (URLs redacted), `recorded` the manifest's record of it."""
    db, base = "postgresql://u:pw@h:5432/db", "http://u:pw@h/v1"
    chosen = TaskSelection(job="jobs/x.toml", models="m1", out="o", shard="1/2", cache_dir="c",
                           base_url=base, sample=3, seed=5, cache_url=db)
    assert (chosen.models, chosen.out, chosen.cache_dir, chosen.shard) == (
        ("m1",), Path("o"), Path("c"), Shard(1, 2))
    assert TaskSelection(job="j", models=["a", "b"]).models == ("a", "b")
    words = ["jobs/x.toml", "--model", "m1", "--base-url", redact(base), "--sample", "3",
             "--seed", "5", "--cache-dir", "c", "--cache", redact(db), "--out", "o"]
    assert chosen.arguments() == [*words, "--shard", "1/2"]
    assert chosen.arguments(shard=False) == words
    assert chosen.recorded() == {
        "job": "jobs/x.toml", "models": ["m1"], "base_url": redact(base), "limit": None,
        "sample": 3, "seed": 5, "cache_dir": "c", "cache_url": redact(db), "out": "o",
        "shard": "1/2"}
    bare = TaskSelection(job="j")
    assert bare.arguments() == ["j"] and bare.drawn() is None
    assert bare.recorded() == {**dict.fromkeys(chosen.recorded()), "job": "j", "models": []}
    assert (chosen.drawn(), TaskSelection(job="j", sample=2).drawn()) == ((3, 5), (2, 0))
    assert TaskSelection(job=runner.load_job("jobs/summeval.toml")).job_name().endswith(
        "jobs/summeval.toml")


def test_selections_are_frozen_keyword_only_value_objects() -> None:
    for value in (CacheLocation(cache_dir="c"), TaskSelection(job="j")):
        assert not hasattr(value, "__dict__")  # slots
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.cache_dir = Path("d")  # type: ignore[misc]
    with pytest.raises(TypeError):
        CacheLocation("c")  # type: ignore[misc]
    with pytest.raises(TypeError):
        TaskSelection("j")  # type: ignore[misc]


def test_a_cache_location_is_the_url_else_the_folder_else_the_default() -> None:
    db = "postgresql://u:pw@h:5432/db"
    env = {"JUDGE_CACHE_DIR": "e", "JUDGE_CACHE_URL": db}
    assert CacheLocation().location() == Path("cache") and CacheLocation().shown() == "cache"
    folder = CacheLocation(cache_dir="c")
    assert (folder.location(), folder.shown(), folder.arguments()) == (
        Path("c"), "c", ["--cache-dir", "c"])
    both = CacheLocation(cache_dir="c", cache_url=db)
    assert (both.location(), both.shown()) == (db, redact(db))
    assert CacheLocation().with_environment(env) == CacheLocation(cache_dir="e", cache_url=db)
    assert both.with_environment({"JUDGE_CACHE_DIR": "e", "JUDGE_CACHE_URL": "postgresql://x/"}
                                 ) == both  # given beats the environment
    assert CacheLocation().with_environment({}) == CacheLocation(cache_dir="cache")
    assert CacheLocation().recorded() == {"cache_dir": None, "cache_url": None}
    with pytest.raises(ConfigError, match="expected a postgresql://"):
        CacheLocation(cache_url="mysql://h/db").with_environment({})


def test_the_api_takes_the_same_value(server: ThreadedServer, tmp_path: Path,
                                      data_dir: Path) -> None:
    job = write_job(tmp_path / "job", JOB)
    chosen = runner.TaskSelection(job=job, models=("fake",), base_url=server.url, limit=3,
                                  cache_dir=tmp_path / "cache", out=tmp_path / "out")
    done = runner.run(chosen, environ={}, data_dir=data_dir)
    assert done.ok and done.stats.api_calls == 3
    made = orjson.loads((done.run_dir / "manifest.json").read_bytes())
    assert made["selection"]["limit"] == 3 and made["selection"]["models"] == ["fake"]
    assert runner.plan(job, models=["fake"], base_url=server.url, limit=3, environ={},
                       data_dir=data_dir, cache_dir=tmp_path / "cache")[0].calls == 0
    with pytest.raises(TypeError, match="limit"):
        runner.plan(chosen, limit=2)
    with pytest.raises(ConfigError, match=r"runner.rescore\(shard='0/2'\)"):
        runner.rescore(dataclasses.replace(chosen, shard="0/2"), environ={}, data_dir=data_dir)
