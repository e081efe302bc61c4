"""`judge run --until-ci W`: whole groups in random order, each judge stopped once its 95% CIs
are narrower than W; the end-of-run table says which judge stopped why, with n."""

from __future__ import annotations

import collections
import csv
import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

import runner
from runner.job.load import load_job
from runner.prepare import drawn_groups, prepare
from runner.reduce.correlate import Row, correlate
from runner.reduce.stopping import FIRST_CHECK, precision_of
from tests.fakeserver import ThreadedServer
from tests.test_cli import clean_env, error_line, run_judge
from tools import untilci_coverage

GROUPS, SIZE = 80, 3
ITEMS = GROUPS * SIZE
_JOB = """
levels = ["sample", "dataset"]
methods = ["spearman", "pearson"]
bootstrap = 200

[[datasets]]
name = "mine"
path = "data.jsonl"
fields = { id = "id", group = "doc", text = { output = "output" }, human = { overall = "score" } }

[[prompts]]
name = "stars"
template = "prompt.txt"
parser = "stars"
aspects = ["overall"]
"""
_JUDGE = '[models.judge]\nspec = "openai:gpt-4o-mini"\n'
_STARS = re.compile(r"\[\[(\d)\]\]")


def _study(folder: Path, extra: str = "", models: str = _JUDGE) -> Path:
    """A data set of GROUPS documents x SIZE outputs with human scores, each output carrying
    the stars a good judge would give it (the human score plus noise): the fake judge answers
    them, so its correlation with the humans is high and its CIs narrow as groups come in."""
    rng = random.Random(5)
    rows = []
    for g in range(GROUPS):
        for i in range(SIZE):
            human = rng.uniform(1, 5)
            stars = min(5, max(1, round(human + rng.gauss(0, 0.6))))
            rows.append({"id": f"{g}-{i}", "doc": f"d{g}", "score": human,
                         "output": f"output {g}-{i} [[{stars}]]"})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (folder / "prompt.txt").write_text("Rate this output in stars: {{output}}")
    job = folder / "job.toml"
    job.write_text(_JOB + models + extra)
    return job


def _reply(body: dict[str, Any]) -> str:
    found = _STARS.search(body["messages"][-1]["content"])
    return f"{found.group(1) if found else 3} stars"


@pytest.fixture
def judge_server() -> Any:
    with ThreadedServer() as s:
        s.state.script.reply = _reply
        yield s


def _run(job: Path, server: ThreadedServer, *options: Any) -> Any:
    folder = job.parent
    return run_judge("run", job, "--model", "fake", "--base-url", server.url, "--yes",
                     "--cache-dir", folder / "cache", "--out", folder / "out", *options,
                     env=clean_env(folder), cwd=folder)


def _verdict(stderr: str, judge: str = "fake/stars") -> re.Match[str]:
    found = re.search(rf"  mine / {judge}: (ci reached|data exhausted|budget|stopped), "
                      r"n = (\d+) items in (\d+) groups, widest CI ([0-9.]+) \(overall (\w+) "
                      r"(\w+)\)", stderr)
    assert found, stderr
    return found


def _ci_width(out: Path, level: str, method: str, judge: str = "fake/stars") -> float:
    with (out / "correlations.csv").open(newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["judge"] == judge
                   and r["level"] == level and r["method"] == method and r["subset"] == "all")
    return float(row["ci_high"]) - float(row["ci_low"])


@pytest.mark.slow
def test_a_wide_width_stops_before_the_data_runs_out(judge_server: ThreadedServer,
                                                     tmp_path: Path) -> None:
    """W = 0.45: the judge is stopped after some groups, with fewer calls than tasks; the
    table says `ci reached` with the n and widest CI the report has; the same command again
    calls nothing, and a run without --until-ci completes the rest, buying nothing twice."""
    job = _study(tmp_path)
    first = _run(job, judge_server, "--until-ci", 0.45)
    assert first.returncode == 0, first.stderr
    verdict = _verdict(first.stderr)
    assert verdict.group(1) == "ci reached"
    calls = judge_server.state.requests
    assert 0 < calls < ITEMS
    assert int(verdict.group(2)) == calls  # every answer bought is in the report
    assert f"--until-ci: {ITEMS - calls} tasks not run" in first.stderr
    level, method = verdict.group(5), verdict.group(6)
    assert float(verdict.group(4)) == pytest.approx(_ci_width(tmp_path / "out", level, method),
                                                    abs=1e-3)
    assert float(verdict.group(4)) < 0.45

    again = _run(job, judge_server, "--until-ci", 0.45)
    assert again.returncode == 0, again.stderr
    assert judge_server.state.requests == calls  # resumed: the rule is met from the cache
    assert _verdict(again.stderr).group(1) == "ci reached"

    rest = _run(job, judge_server)
    assert rest.returncode == 0, rest.stderr
    assert judge_server.state.requests == ITEMS
    assert max(judge_server.state.bodies.values()) == 1  # no answer bought twice


@pytest.mark.slow
@pytest.mark.parametrize("per", ["item", "group"])
def test_a_tiny_width_runs_to_the_end_and_says_so(per: str, judge_server: ThreadedServer,
                                                  tmp_path: Path) -> None:
    """limits.until_ci = 0.001 (the job key): never reached, every task is called (an item's,
    or with a group prompt a group's, once), and the table says `data exhausted` with n =
    every item."""
    limits = "[limits]\nuntil_ci = 0.001\n"
    job = _study(tmp_path, limits) if per == "item" else _group_study(tmp_path, extra=limits)
    if per == "group":
        judge_server.state.script.reply = _GroupJudge()
    done = _run(job, judge_server)
    assert done.returncode == 0, done.stderr
    assert judge_server.state.requests == (ITEMS if per == "item" else GROUPS)
    verdict = _verdict(done.stderr, "fake/stars" if per == "item" else "fake/all")
    assert verdict.group(1) == "data exhausted"
    assert (int(verdict.group(2)), int(verdict.group(3))) == (ITEMS, GROUPS)
    assert "tasks not run" not in done.stderr


@pytest.mark.slow
def test_each_judge_stops_on_its_own_ci(tmp_path: Path) -> None:
    """Two judges: a good one, whose CIs narrow fast, and one answering at random, whose CIs
    (around 0) stay wider for longer: the good one stops first, the other goes on, and each
    has its own line."""
    calls: collections.Counter[str] = collections.Counter()

    def reply(body: dict[str, Any]) -> str:
        calls[body["model"]] += 1
        if body["model"] == "good":
            return _reply(body)
        return f"{random.Random(body['messages'][-1]['content']).randint(1, 5)} stars"

    job = _study(tmp_path)
    with ThreadedServer() as server:
        server.state.script.reply = reply
        result = _run(job, server, "--model", "good", "--until-ci", 0.35)
    assert result.returncode == 0, result.stderr
    good = re.search(r"mine / good/stars: ci reached, n = (\d+) items", result.stderr)
    other = re.search(r"mine / fake/stars: (ci reached|data exhausted), n = (\d+) items",
                      result.stderr)
    assert good and other, result.stderr
    assert calls["good"] == int(good.group(1)) < calls["fake"] == int(other.group(2))


@pytest.mark.slow
def test_until_ci_with_a_shard_is_one_error_line(judge_server: ThreadedServer,
                                                 tmp_path: Path) -> None:
    job = _study(tmp_path)
    result = _run(job, judge_server, "--until-ci", 0.2, "--shard", "1/2")
    assert result.returncode == 2
    assert error_line(result.stderr) == (
        f"Error: {job}: --until-ci (limits.until_ci) judges the items of one run group by "
        "group and cannot run with --shard; drop one of them")
    assert judge_server.state.requests == 0


_GROUP = """
[[prompts]]
name = "all"
per = "group"
template = "group.txt"
parser = "outputs"
aspects = ["overall"]
"""
_OUTPUT = re.compile(r"^Output (\d+): output (\d+)-\d+ \[\[(\d)\]\]$", re.MULTILINE)


def _group_study(folder: Path, item_prompt: bool = False, extra: str = "") -> Path:
    """_study with the group prompt `all` (one call scores the group's SIZE outputs, as Lai et
    al.'s prompts do), without or with the item prompt `stars` beside it."""
    job = _study(folder, extra=extra)
    text = job.read_text()
    head, rest = text.split("[[prompts]]", 1)
    stars, models = rest.split("[models.", 1)
    job.write_text(head + ("[[prompts]]" + stars if item_prompt else "") + _GROUP + "\n[models."
                   + models)
    (folder / "group.txt").write_text("Score each output:\n{{outputs}}")
    return job


class _GroupJudge:
    """The fake judge of both prompts: the stars an output carries, as `N stars` (an item) or
    an "Output N / Score: S" block per output (a group); it notes each call's prompt and group
    (`calls`, in the order they came)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, body: dict[str, Any]) -> str:
        text = body["messages"][-1]["content"]
        outputs = _OUTPUT.findall(text)
        if not outputs:
            doc = _STARS_DOC.search(text)
            assert doc, text
            self.calls.append(("stars", f"d{doc.group(1)}"))
            return _reply(body)
        self.calls.append(("all", f"d{outputs[0][1]}"))
        return "\n".join(f"Output {n}\nScore: {stars}" for n, _, stars in outputs)


_STARS_DOC = re.compile(r"output (\d+)-\d+ \[\[")


def _drawn(job: Path) -> list[str]:
    """The study's groups in the order --until-ci judges them (the --sample draw, seed 0)."""
    items = prepare(load_job(job), job.parent).items["mine"]
    return [group[0].group for group in drawn_groups(items, 0)]


@pytest.mark.slow
def test_a_group_prompt_stops_before_the_data_runs_out(tmp_path: Path) -> None:
    """A group prompt (one call scores every output of a group) under --until-ci 0.45: its
    groups are called in the drawn order, the judge is stopped after some of them, and the
    table says `ci reached` with every output of the answered groups counted (SIZE items a
    call) and the report's own widest CI; the same command again calls nothing. (Refused
    before: `cannot run with group prompts`.)"""
    job, fake = _group_study(tmp_path), _GroupJudge()
    with ThreadedServer() as server:
        server.state.script.reply = fake
        first = _run(job, server, "--until-ci", 0.45)
        assert first.returncode == 0, first.stderr
        calls = server.state.requests
        again = _run(job, server, "--until-ci", 0.45)
        assert again.returncode == 0, again.stderr
        assert server.state.requests == calls  # resumed: the rule is met from the cache
    verdict = _verdict(first.stderr, "fake/all")
    assert verdict.group(1) == "ci reached"
    assert FIRST_CHECK <= calls < GROUPS
    assert (int(verdict.group(2)), int(verdict.group(3))) == (SIZE * calls, calls)
    assert f"--until-ci: {GROUPS - calls} tasks not run" in first.stderr
    assert {doc for _, doc in fake.calls} == set(_drawn(job)[:calls])  # a prefix of the draw
    assert float(verdict.group(4)) == pytest.approx(
        _ci_width(tmp_path / "out", verdict.group(5), verdict.group(6), "fake/all"), abs=1e-3)
    assert _verdict(again.stderr, "fake/all").group(1) == "ci reached"


@pytest.mark.slow
def test_item_and_group_prompts_go_group_by_group_together(tmp_path: Path) -> None:
    """An item prompt and a group prompt on one data set: the group prompt's calls come with
    its group's item calls, not after every item's (a job lists them after), so both judges
    are checked from the first groups on; each stops on its own CI and has its own line. (One
    call at a time: the calls come in the order they are handed out.)"""
    job = _group_study(tmp_path, item_prompt=True, extra="[limits]\nconcurrency = 1\n")
    fake, drawn = _GroupJudge(), _drawn(job)
    with ThreadedServer() as server:
        server.state.script.reply = fake
        result = _run(job, server, "--until-ci", 0.45)
    assert result.returncode == 0, result.stderr
    assert fake.calls[:2 * (SIZE + 1)] == [
        *[("stars", drawn[0])] * SIZE, ("all", drawn[0]), *[("stars", drawn[1])] * SIZE,
        ("all", drawn[1])]
    for prompt, verdict in (("stars", _verdict(result.stderr)), ("all", _verdict(
            result.stderr, "fake/all"))):
        called = [doc for p, doc in fake.calls if p == prompt]
        assert verdict.group(1) == "ci reached"
        assert int(verdict.group(2)) == len(called) * (1 if prompt == "stars" else SIZE)
        assert set(called) == set(drawn[:int(verdict.group(3))])


def test_the_coverage_script_runs_the_rule_on_real_data(data_dir: Path) -> None:
    """tools/untilci_coverage.py, which statistics.md cites, on two replications: it stops
    where the rule says and reports a coverage and a bias per level and rule."""
    lines = untilci_coverage.study("tst_formality", "content", 0.25, True, 2, data_dir)
    assert len(lines) == 4
    assert all(re.search(r"coverage \d+\.\d% of 2, mean bias [+-]\d\.\d{4}, groups median",
                         line) for line in lines)
    assert "--until-ci 0.25" in lines[0] and "fixed" in lines[2]


def test_runner_run_takes_until_ci_and_the_manifest_keeps_why(judge_server: ThreadedServer,
                                                              tmp_path: Path) -> None:
    """runner.run(until_ci=W) as `judge run --until-ci W`: fewer calls than tasks, and the
    verdicts in stats and in manifest.json (what the run printed last, kept with the run)."""
    job = _study(tmp_path)
    result = runner.run(job, models="fake", base_url=judge_server.url, until_ci=0.45,
                        cache_dir=tmp_path / "cache", out=tmp_path / "out",
                        environ=clean_env(tmp_path))
    assert 0 < judge_server.state.requests < ITEMS
    assert _verdict("\n".join(result.stats.until_ci)).group(1) == "ci reached"
    manifest = orjson.loads((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest["until_ci"] == result.stats.until_ci


def test_a_budget_that_runs_out_first_is_the_reason_given(judge_server: ThreadedServer,
                                                          tmp_path: Path) -> None:
    """--budget and --until-ci together, the budget spent before the CIs narrow: the judge's
    line says `budget`, with the n it stopped at."""
    job = _study(tmp_path, models='[models.fake]\nspec = "fake"\nprice = { input = 1000, '
                                  'output = 1000 }\n')
    result = runner.run(job, base_url=judge_server.url, until_ci=0.001, budget=2.0,
                        cache_dir=tmp_path / "cache", out=tmp_path / "out",
                        environ=clean_env(tmp_path))
    assert result.stats.budget_stopped
    calls = judge_server.state.requests
    assert 0 < calls < ITEMS
    verdict = re.search(r"  mine / fake/stars: budget, n = (\d+) items",
                        "\n".join(result.stats.until_ci))
    assert verdict and int(verdict.group(1)) <= calls


def test_a_ci_over_too_few_groups_is_no_width() -> None:
    """One group answered (the others in flight): its bootstrap is that group every time, a
    CI of width 0, which must not stop a judge; from FIRST_CHECK groups the width counts."""
    rng = random.Random(1)

    def rows(groups: int) -> list[Row]:
        return [Row(f"g{g}", "s", "", h + rng.gauss(0, 1), h)
                for g in range(groups) for h in (rng.uniform(1, 5) for _ in range(3))]

    one = correlate(rows(1), levels=("sample", "dataset"), methods=("spearman",), n_boot=100)
    assert {c.ci_high - c.ci_low for c in one if c.ci_low is not None} == {0.0}
    assert precision_of(one, "overall").width is None
    enough = correlate(rows(FIRST_CHECK), levels=("sample", "dataset"), methods=("spearman",),
                       n_boot=100)
    assert (precision_of(enough, "overall").width or 0) > 0


def test_a_system_level_over_subsets_does_not_hold_a_judge_forever() -> None:
    """Data with subsets (Lai et al.'s two transfer directions): the report's system level over
    all items is the mean of the subsets' values, with no CI however many groups are judged.
    It does not count (as a system level over too few systems), else no judge of such a study
    could ever stop: the widest of the other CIs decides."""
    rng = random.Random(3)
    rows = [Row(f"g{g}", f"s{i}", "ab"[g % 2], h + rng.gauss(0, 0.5), h)
            for g in range(40) for i in range(6) for h in (rng.uniform(1, 5),)]
    found = correlate(rows, levels=("sample", "dataset", "system"), methods=("kendall",),
                      n_boot=100)
    assert [c.ci_low for c in found if c.level == "system" and c.subset == "all"] == [None] * 2
    precision = precision_of(found, "overall")
    assert precision.width is not None and precision.widest.split()[1] != "system"
