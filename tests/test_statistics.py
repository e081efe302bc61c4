"""The statistics written once (runner.reduce.statistics): Lin's concordance coefficient at every
level against its formula computed here with numpy, on SummEval's human scores; where Williams'
test applies; the job file's method names."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runner.data.datasets import load
from runner.job.spec import DEFAULT_METHODS, METHODS
from runner.reduce import levels
from runner.reduce.correlate import Row, correlate
from runner.reduce.resample import Resamples
from runner.reduce.series import Series
from runner.reduce.statistics import STATISTICS
from runner.report.significance import significance
from tests.conftest import DATA_DIR, JobWriter
from tests.fakeserver import Script, ThreadedServer
from tests.test_job import VALID, _error, _load
from tests.test_judges import ANSWER, JOB, _csv, _judge, reply, rows

FloatArray = np.ndarray[Any, np.dtype[np.float64]]


def lin(x: FloatArray, y: FloatArray) -> float:
    """Lin (1989): 2 s_xy / (s_x^2 + s_y^2 + (mean x - mean y)^2), 1/n moments (np.cov)."""
    s = np.cov(x, y, bias=True)
    return float(2 * s[0, 1] / (s[0, 0] + s[1, 1] + (x.mean() - y.mean()) ** 2))


def _constant(v: FloatArray) -> bool:
    return bool(np.all(v == v[0]))


def summeval_rows(documents: int = 30) -> list[Row]:
    """SummEval's first documents x 16 systems; human = coherence, judge = a judge on the
    wrong scale: twice the fluency score plus one, so rank correlations miss what CCC sees."""
    rows: list[Row] = []
    for item in load("summeval", DATA_DIR):
        if len({r.group for r in rows} | {item.group}) > documents:
            break
        rows.append(Row(item.group, item.system, "", 2 * item.human["fluency"] + 1,
                        item.human["coherence"]))
    return rows


def test_ccc_at_every_level_equals_its_formula_on_summeval() -> None:
    rows = summeval_rows()
    x = np.array([r.judge for r in rows], dtype=float)
    y = np.array([r.human for r in rows])
    got = {c.level: c for c in correlate(rows, methods=("ccc",), n_boot=0)
           if c.method == "ccc" and c.subset == "all"}
    groups: dict[str, list[int]] = defaultdict(list)
    systems: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[r.group].append(i)
        systems[r.system].append(i)
    per_group = [lin(x[i], y[i]) for i in groups.values()
                 if len(i) > 1 and not _constant(x[i]) and not _constant(y[i])]
    assert got["sample"].value == pytest.approx(float(np.mean(per_group)), abs=1e-12)
    assert got["sample"].n_groups == len(per_group) > 20
    assert got["dataset"].value == pytest.approx(lin(x, y), abs=1e-12)
    mx = np.array([x[i].mean() for i in systems.values()])
    my = np.array([y[i].mean() for i in systems.values()])
    assert got["system"].value == pytest.approx(lin(mx, my), abs=1e-12)
    assert got["system"].n_systems == 16 and got["system"].ci_low is None  # n_boot=0
    # the wrong scale: a good rank correlation, a poor concordance
    spearman = correlate(rows, levels=("dataset",), methods=("spearman",), n_boot=0)[0]
    assert spearman.value is not None and spearman.value > got["dataset"].value + 0.2


def test_ccc_resamples_equal_its_formula_on_the_resampled_rows() -> None:
    """The dataset level's resamples (weighted sums of group moments) and the system level's
    (system means of the drawn groups) against the formula on each resample's rows."""
    rows = summeval_rows(12)
    d = levels.prepare(Series.of_rows(rows))
    (sel,) = levels.selections(d)
    counts = Resamples().counts(sel.strata, 60, 4)
    boots = levels._boot_pooled(d, sel, ("ccc",), counts)["ccc"]
    system = np.array([r.system for r in rows])
    assert np.array_equal(d.x, [r.judge for r in rows])  # prepare kept the rows' order
    for b, row in enumerate(counts):
        idx = np.concatenate([np.arange(d.edges[g], d.edges[g + 1])
                              for g in range(sel.g0, sel.g1) for _ in range(int(row[g]))])
        assert boots[b] == pytest.approx(lin(d.x[idx], d.y[idx]), abs=1e-12)
        means = [(d.x[idx][system[idx] == s].mean(), d.y[idx][system[idx] == s].mean())
                 for s in dict.fromkeys(system[idx])]
        mx, my = (np.array(v) for v in zip(*means, strict=True))
        valid = np.ones((1, len(mx)), dtype=bool)
        got = STATISTICS["ccc"].systems(mx[None, :], my[None, :], valid)[0]
        assert got == pytest.approx(lin(mx, my), abs=1e-12)
    with_ci = correlate(rows, methods=("ccc",), n_boot=200)
    assert all(c.ci_low is not None and c.ci_low <= c.value <= c.ci_high  # type: ignore[operator]
               for c in with_ci if c.method == "ccc")


def test_williams_applies_to_the_correlations_not_to_ccc() -> None:
    rng = np.random.default_rng(3)
    human = rng.integers(1, 6, 60).astype(float)
    a = [Row(f"g{i // 3}", f"s{i % 3}", "", float(h + rng.normal()), float(h))
         for i, h in enumerate(human)]
    b = [r._replace(judge=3 * float(r.human) + rng.normal()) for r in a]
    data = {("d", "x"): {"A": Series.of_rows(a), "B": Series.of_rows(b)}}
    rows = [{"dataset": "d", "aspect": "x", "level": "dataset", "method": m, "subset": "all"}
            for m in ("pearson", "ccc")]
    tested = significance(rows, data, ("A", "B"), permutations=50)
    assert tested[0]["williams_p"] is not None and tested[0]["permutation_p"] is not None
    assert tested[1]["williams_p"] is None and tested[1]["permutation_p"] is None
    assert [s.name for s in STATISTICS.values() if s.williams] == ["pearson", "spearman",
                                                                   "kendall"]


def test_a_job_may_ask_for_ccc_and_gets_the_correlations_by_default(
        write_job: JobWriter) -> None:
    assert set(METHODS) == {m for m, s in STATISTICS.items() if s.rows is not None}
    assert _load(write_job, 'methods = ["pearson", "ccc"]\n' + VALID).methods == (
        "pearson", "ccc")
    assert _load(write_job, VALID).methods == DEFAULT_METHODS == ("pearson", "spearman",
                                                                   "kendall")
    assert "methods must be a non-empty list of pearson, spearman, kendall, ccc" in _error(
        write_job, 'methods = ["lin"]\n' + VALID)


@pytest.mark.slow
def test_ccc_reaches_every_table_of_a_run_and_of_compare(write_job: JobWriter,
                                                         tmp_path: Path) -> None:
    """The real CLI on the fake server: `methods = [..., "ccc"]` gives correlations.csv rows at
    every level (with CIs, the system level's from six systems), report.md columns, and
    compare.csv / the compare table's paired diff with a CI but no Williams' test."""
    job = 'levels = ["sample", "dataset", "system"]\nmethods = ["pearson", "ccc"]\n' + JOB
    with ThreadedServer(Script(reply=reply)) as server:
        path = write_job(job.format(js_options="", juries="", url=server.url, answer=ANSWER),
                         rows=rows(systems=6, docs=8))
        done = _judge("run", str(path), "--cache-dir", str(tmp_path / "cache"), "--out",
                      str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    ccc = {r["level"]: r for r in _csv(out / "correlations.csv")
           if r["judge"] == "a/js" and r["method"] == "ccc" and r["subset"] == "all"}
    assert set(ccc) == {"sample", "dataset", "system"}
    assert all(r["value"] and r["ci_low"] and r["ci_high"] for r in ccc.values())
    assert ccc["system"]["n_systems"] == "6"
    assert "dataset ccc" in (out / "report.md").read_text(encoding="utf-8")
    compared = _judge("compare", str(path), "--judges", "a/js", "b/js", "--cache-dir",
                      str(tmp_path / "cache"), "--out", str(out), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    table = {(r["level"], r["method"]): r for r in _csv(out / "compare.csv")
             if r["subset"] == "all"}
    assert table["dataset", "ccc"]["diff"] and table["dataset", "ccc"]["ci_low"]
    assert table["dataset", "ccc"]["williams_p"] == ""
    assert table["dataset", "pearson"]["williams_p"] != ""
    assert re.search(r"dataset +ccc +all", compared.stdout)
