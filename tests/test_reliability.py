"""Judge reliability: agreement, position and length bias, Williams test, power planning.

Values are checked against published worked examples (Krippendorff 2011; Steiger 1980 as
computed by psych::r.test), hand computations written out below, and the real data sets run
through the real CLI against the fake server.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import krippendorff
import numpy as np
import pytest
from scipy import stats

from runner.reduce.power import plan_power
from runner.reduce.reliability import (
    agreement,
    alpha,
    correlation,
    partial,
    permutation_p,
    weighted_kappa,
    williams,
)
from tests.conftest import DATA_DIR
from tests.fakeserver import CHOICE_SEP, Script, ThreadedServer
from tests.test_cli import clean_env, run_judge
from tests.test_colossalai import BATTLE_MARK, answers_in, fake_reply

ROOT = Path(__file__).resolve().parents[1]

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers x
# 12 units with missing values. Published: nominal 0.743, ordinal 0.815, interval 0.849.
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]


@pytest.mark.parametrize(("level", "published"), [
    ("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)])
def test_alpha_matches_krippendorffs_worked_example(level: Any, published: float) -> None:
    value = alpha(KRIPPENDORFF_2011, level)
    assert value is not None and round(value, 3) == published


def test_alpha_undefined_and_unpairable_units() -> None:
    assert alpha([[3, 3, 3], [3, 3, 3]]) is None  # no variation: alpha is 0/0
    assert alpha([[1, 2, 3]]) is None  # one coder
    # a unit coded once is not pairable and changes nothing
    with_single = [row + [v] for row, v in zip(KRIPPENDORFF_2011, (5, None, None, None),
                                                   strict=True)]
    assert alpha(with_single, "interval") == alpha(KRIPPENDORFF_2011, "interval")
    with pytest.raises(ValueError, match="level must be one of"):
        alpha(KRIPPENDORFF_2011, "cardinal")  # type: ignore[arg-type]


def test_weighted_kappa_by_hand() -> None:
    # a = 1 1 2 2 3 3, b = 1 2 2 3 3 3 (n = 6). Observed disagreements: (1,2) and (2,3), each
    # 1/6 with weight 1 (linear and quadratic): D_o = 1/3. Margins: a = (1/3, 1/3, 1/3),
    # b = (1/6, 2/6, 3/6). Expected, quadratic: 1/3 x [(2/6 + 12/6) + (1/6 + 3/6) + (4/6 +
    # 2/6)] = 1/3 x 4 = 4/3, kappa = 1 - (1/3)/(4/3) = 0.75. Linear: 1/3 x [(2/6 + 6/6) +
    # (1/6 + 3/6) + (2/6 + 2/6)] = 8/9, kappa = 1 - (1/3)/(8/9) = 0.625.
    a, b = [1, 1, 2, 2, 3, 3], [1, 2, 2, 3, 3, 3]
    assert weighted_kappa(a, b, "quadratic") == pytest.approx(0.75)
    assert weighted_kappa(a, b, "linear") == pytest.approx(0.625)
    assert weighted_kappa(a, a) == pytest.approx(1.0)
    assert weighted_kappa([1.5, 2], [1, 2]) is None  # not an integer scale
    assert weighted_kappa([2, 2], [2, 2]) is None  # no expected disagreement


def test_quadratic_kappa_is_close_to_interval_alpha_on_many_items() -> None:
    # Both are 1 - observed/expected squared differences; they differ only in how the
    # expected part pools the two raters' margins, which vanishes for similar margins.
    rng = np.random.default_rng(1)
    truth = rng.integers(1, 6, 2000)
    a = np.clip(truth + rng.integers(-1, 2, 2000), 1, 5).tolist()
    b = np.clip(truth + rng.integers(-1, 2, 2000), 1, 5).tolist()
    kappa, alpha_interval = weighted_kappa(a, b), alpha([a, b], "interval")
    assert kappa is not None and alpha_interval is not None
    assert kappa == pytest.approx(alpha_interval, abs=0.01)


def _pairs() -> list[tuple[str, list[float], list[float]]]:
    rng = np.random.default_rng(7)
    truth = rng.integers(1, 6, 3000)
    noisy = np.clip(truth + rng.integers(-2, 3, 3000), 1, 5)
    return [
        ("1-5 scale", truth.tolist(), noisy.tolist()),
        ("0-100 with gaps", (truth * 20).tolist(), (noisy * 20 - 3).tolist()),
        ("negative integers", (truth - 9).tolist(), (noisy - 9).tolist()),
        ("halves", (truth / 2).tolist(), (noisy / 2).tolist()),
        ("continuous", rng.normal(size=1500).tolist(), rng.normal(size=1500).tolist()),
        ("constant", [3.0] * 50, [3.0] * 50),
        ("one unit", [1.0], [2.0]),
        ("none", [], []),
        ("with a missing score", [1.0, 2.0, math.nan, 4.0, 5.0], [1.0, 3.0, 2.0, 4.0, 4.0]),
        ("wide integer range", rng.integers(0, 5000, 800).astype(float).tolist(),
         rng.integers(0, 5000, 800).astype(float).tolist()),
    ]


@pytest.mark.parametrize(("name", "x", "y"), _pairs(), ids=[p[0] for p in _pairs()])
def test_agreement_equals_alpha_and_kappa_bit_for_bit(name: str, x: list[float],
                                                      y: list[float]) -> None:
    # reliability.csv's figures from the one-pass contingency table must be the general
    # path's to the last bit (the reports of a study stay byte-identical).
    rows = [[None if math.isnan(v) else v for v in x], y]
    expected = (alpha(rows, "ordinal"), alpha(rows, "interval"), weighted_kappa(x, y))
    got = agreement(np.array(x, dtype=float), np.array(y, dtype=float))
    assert got == expected
    assert [v is None for v in got] == [v is None for v in expected]


def test_williams_matches_steiger_example() -> None:
    # Steiger (1980) case A as in psych::r.test(n = 103, r12 = .4, r13 = .5, r23 = .1):
    # "t value -0.89 with probability < 0.37".
    result = williams(0.4, 0.5, 0.1, 103)
    assert result is not None
    t, p = result
    assert round(t, 2) == -0.89 and round(p, 2) == 0.37
    t_swapped, p_swapped = williams(0.5, 0.4, 0.1, 103) or (0.0, 0.0)
    assert t_swapped == pytest.approx(-t) and p_swapped == pytest.approx(p)
    # The more the two judges agree with each other, the stronger the same difference.
    assert (williams(0.4, 0.5, 0.8, 103) or (0, 1))[1] < p
    assert williams(0.4, 0.5, 0.1, 3) is None


def test_partial_correlation_equals_correlation_of_residuals() -> None:
    rng = np.random.default_rng(2)
    z = rng.normal(size=300)
    x, y = z + rng.normal(size=300), 0.5 * z + rng.normal(size=300)
    rx = x - np.polyval(np.polyfit(z, x, 1), z)
    ry = y - np.polyval(np.polyfit(z, y, 1), z)
    assert partial("pearson", x.tolist(), y.tolist(), z.tolist()) == pytest.approx(
        float(stats.pearsonr(rx, ry)[0]))
    raw = correlation("pearson", x, y)
    assert raw is not None and raw > 0.2  # shared z makes x and y correlate...
    assert abs(partial("pearson", x.tolist(), y.tolist(), z.tolist()) or 1) < 0.15  # ...not more


def test_permutation_test_separates_only_different_judges() -> None:
    rng = np.random.default_rng(3)
    human = rng.normal(size=200)
    good, noisy = human + 0.3 * rng.normal(size=200), human + 3 * rng.normal(size=200)
    p_diff = permutation_p("pearson", good, noisy, human, 999, seed=1)
    p_same = permutation_p("spearman", good, 2 * good + 1, human, 999, seed=1)
    assert p_diff is not None and p_diff <= 0.002
    assert p_same == 1.0  # the same judge on another scale: every permutation ties
    assert permutation_p("kendall", good[:30], noisy[:30], human[:30], 99) is not None


def test_power_plan_scales_and_checks_the_ci_width() -> None:
    rng = np.random.default_rng(4)
    human = rng.normal(size=400)
    a, b = human + rng.normal(size=400), human + 1.5 * rng.normal(size=400)
    pilot = plan_power(a, b, human, method="pearson", width=0.1, seed=0)
    assert pilot is not None and pilot.n_pilot == 400
    assert pilot.n_for_width == math.ceil(400 * (pilot.width_pilot / 0.1) ** 2)
    assert pilot.width_check is not None and pilot.width_check == pytest.approx(0.1, rel=0.15)
    same = plan_power(a, b, human, method="pearson", width=pilot.width_pilot, seed=0)
    assert same is not None and abs(same.n_for_width - 400) <= 1
    assert pilot.n_for_power is not None and pilot.n_for_power < pilot.n_for_width
    assert plan_power(a[:5], b[:5], human[:5], method="pearson", width=0.1) is None


def test_width_plan_resamples_whole_groups() -> None:
    """A judge whose error is shared by the items of a group (one story, one source) gains
    less from each item than item-wise resampling says: the items for a CI of width W are
    counted in whole groups, as the report's CIs resample them, and their bootstrap check
    lands on W. Item-wise, the same pilot asked for far fewer items (issue 35: 1,115 where
    groups need about 1,670)."""
    rng = np.random.default_rng(7)
    groups = [f"g{i // 10}" for i in range(400)]
    shared = np.repeat(rng.normal(size=40), 10)  # one error per group of 10
    human = rng.normal(size=400)
    a = human + 0.5 * rng.normal(size=400) + 1.2 * shared
    b = human + 1.5 * rng.normal(size=400)
    item_wise = plan_power(a, b, human, method="pearson", width=0.1, seed=0)
    grouped = plan_power(a, b, human, method="pearson", width=0.1, groups=groups, seed=0)
    assert item_wise is not None and grouped is not None
    assert item_wise.groups_for_width == item_wise.n_for_width  # each item its own group
    assert grouped.n_for_width == grouped.groups_for_width * 10
    assert grouped.n_for_width > 1.3 * item_wise.n_for_width
    assert grouped.width_check == pytest.approx(0.1, rel=0.2)


def test_power_is_simulated_for_80_percent_at_alpha_005() -> None:
    """The items for 80% power agree with the normal approximation (d / SE = 1.96 + 0.84,
    SE ~ 1/sqrt(n) from the pilot's bootstrap) within the simulation's noise; no difference
    needs no study; whole groups are drawn, so the items are the groups' items."""
    rng = np.random.default_rng(4)
    human = rng.normal(size=400)
    a, b = human + rng.normal(size=400), human + 1.5 * rng.normal(size=400)
    plan = plan_power(a, b, human, method="pearson", width=0.1, seed=0)
    assert plan is not None and plan.groups_pilot == 400 and plan.power_pilot > 0.95
    se = plan.width_pilot / (2 * 1.96)
    approx = 400 * (se * (1.96 + 0.8416) / plan.diff) ** 2
    assert plan.n_for_power is not None and 0.75 * approx <= plan.n_for_power <= 1.4 * approx
    assert plan_power(a, a, human, method="pearson", width=0.1).groups_for_power is None  # type: ignore[union-attr]

    groups = [f"g{i // 16}" for i in range(400)]
    grouped = plan_power(a, b, human, method="spearman", width=0.1, groups=groups, seed=0)
    assert grouped is not None and grouped.groups_pilot == 25
    assert grouped.groups_for_power is not None
    assert grouped.n_for_power == grouped.groups_for_power * 16  # whole groups of 16

    # a pilot too small to tell them apart has low power, and asks for more than it has
    small = plan_power(a[:40], b[:40], human[:40], method="pearson", width=0.1, seed=0)
    assert small is not None and small.power_pilot < 0.8
    assert small.n_for_power is not None and small.n_for_power > 40


# ---------------------------------------------------------------- real data, real CLI

def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tst_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tst-formality's first 10 source sentences (90 outputs), both judges, fake server."""
    tmp = tmp_path_factory.mktemp("tst")
    with ThreadedServer(Script()) as server:
        where = ["--model", "fake", "--base-url", server.url, "--limit", 90, "--cache-dir",
                 tmp / "cache", "--out", tmp / "out"]
        env = clean_env(DATA_DIR)
        ran = run_judge("run", "tst-formality", *where, "--yes", env=env, cwd=ROOT)
        assert ran.returncode == 0, ran.stderr
        rescored = run_judge("rescore", "tst-formality", *where[:-2], "--out", tmp / "rescored",
                             env=env, cwd=ROOT)
        assert rescored.returncode == 0, rescored.stderr
        compared = run_judge("compare", "tst-formality", *where[:-2], "--out", tmp / "cmp",
                             "--judges", "fake/single", "fake/multi", "--permutations", 200,
                             env=env, cwd=ROOT)
        assert compared.returncode == 0, compared.stderr
        assert "williams_p" in compared.stdout and "permutation_p" in compared.stdout
        planned = run_judge("plan", "tst-formality", *where, "--power", "fake/single",
                            "fake/multi", "--width", 0.2, env=env, cwd=ROOT)
        assert planned.returncode == 0, planned.stderr
        (tmp / "plan.txt").write_text(planned.stdout)
        assert server.state.requests == 40  # compare and plan made no call
    return tmp


def annotator_votes(aspect: str, lines: int) -> list[tuple[float, float]]:
    """Both annotators' scores, read straight from the released file (lines in file order,
    systems in file order, as the loader's items)."""
    name = {"content": "content.src"}.get(aspect, aspect)
    path = DATA_DIR / "tst_formality" / "chatgpt" / f"{name}.json"
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    return [(s["human_1"], s["human_2"]) for row in rows[:lines] for s in row["sys"].values()]


@pytest.mark.slow
def test_tst_annotators_agreement_from_the_released_file(tst_run: Path) -> None:
    rows = read_csv(tst_run / "out" / "reliability.csv")
    got = {(r["aspect"], r["statistic"]): r for r in rows if r["a"] == "annotators"}
    for aspect in ("content", "style", "fluency"):
        votes = np.array(annotator_votes(aspect, 10)).T
        for level in ("ordinal", "interval"):
            row = got[aspect, f"alpha_{level}"]
            expected = krippendorff.alpha(reliability_data=votes, level_of_measurement=level)
            assert float(row["value"]) == pytest.approx(expected)
            assert row["n"] == "90" and row["b"] == "2 annotators"
    # The two annotators agree far better than the fake judge agrees with either of them.
    judge_rows = [r for r in rows if r["figure"] == "agreement" and r["a"] == "fake/single"
                  and r["statistic"] == "alpha_interval"]
    assert {r["b"] for r in judge_rows} >= {"annotator 1", "annotator 2", "human"}
    assert max(float(r["value"]) for r in judge_rows) < float(
        got["content", "alpha_interval"]["value"])
    assert "## Reliability" in (tst_run / "out" / "report.md").read_text("utf-8")
    # rescore writes the same figures from the cache
    assert (tst_run / "rescored" / "reliability.csv").read_bytes() == (
        tst_run / "out" / "reliability.csv").read_bytes()


@pytest.mark.slow
def test_tst_length_and_position_rows(tst_run: Path) -> None:
    rows = read_csv(tst_run / "out" / "reliability.csv")
    scores = [r for r in read_csv(tst_run / "out" / "scores.csv")
              if r["prompt"] == "single" and r["aspect"] == "style"]
    path = DATA_DIR / "tst_formality" / "chatgpt" / "style.json"
    lines = path.read_text("utf-8").splitlines()[:10]
    outputs = {f"{i}:{system}": s["out"] for i, line in enumerate(lines)
               for system, s in json.loads(line)["sys"].items()}
    judge = [float(r["judge_score"]) for r in scores]
    human = [float(r["human_score"]) for r in scores]
    chars = [float(len(outputs[r["item_id"]])) for r in scores]

    def value(a: str, b: str, statistic: str) -> float:
        [row] = [r for r in rows if (r["aspect"], r["figure"], r["a"], r["b"], r["statistic"])
                 == ("style", "length", a, b, statistic)]
        return float(row["value"])

    assert value("fake/single", "length (chars)", "spearman") == pytest.approx(
        float(stats.spearmanr(judge, chars)[0]))
    assert value("human", "length (chars)", "spearman") == pytest.approx(
        float(stats.spearmanr(human, chars)[0]))
    # partial Pearson by its definition, from three scipy Pearson coefficients
    rxy, rxz, ryz = (float(stats.pearsonr(x, y)[0]) for x, y in
                     ((judge, human), (judge, chars), (human, chars)))
    assert value("fake/single", "human | length (chars)", "partial_pearson") == pytest.approx(
        (rxy - rxz * ryz) / math.sqrt((1 - rxz ** 2) * (1 - ryz ** 2)))
    # group prompts: the mean score of each of the nine positions, over the 10 sentences
    by_position = [r for r in rows if r["figure"] == "position" and r["a"] == "fake/single"
                   and r["aspect"] == "style" and r["statistic"] == "mean_score"]
    assert [r["b"] for r in by_position] == [f"position {i}" for i in range(1, 10)]
    assert all(r["n"] == "10" for r in by_position)
    assert sum(float(r["value"]) for r in by_position) / 9 == pytest.approx(
        sum(judge) / len(judge))


@pytest.mark.slow
def test_compare_adds_williams_and_permutation(tst_run: Path) -> None:
    rows = read_csv(tst_run / "cmp" / "compare.csv")
    scores = read_csv(tst_run / "out" / "scores.csv")
    for r in rows:
        # the groups resampled: every group whose items both judges scored, at each level
        both = [{s["group"] for s in scores if s["aspect"] == r["aspect"] and s["prompt"] == p
                 and s["judge_score"] != ""} for p in ("single", "multi")]
        assert int(r["n_groups"]) == len(both[0] & both[1]) > 1, r
        if r["level"] != "dataset":
            assert r["williams_p"] == r["permutation_p"] == ""
            continue
        cells = {(s["item_id"], s["prompt"]): s for s in scores if s["aspect"] == r["aspect"]}
        ids = sorted({i for i, p in cells if p == "single"})
        a = [float(cells[i, "single"]["judge_score"]) for i in ids]
        b = [float(cells[i, "multi"]["judge_score"]) for i in ids]
        h = [float(cells[i, "single"]["human_score"]) for i in ids]
        tau = [float(stats.kendalltau(x, y)[0]) for x, y in ((a, h), (b, h), (a, b))]
        expected = williams(*tau, len(ids))
        assert expected is not None
        assert float(r["williams_t"]) == pytest.approx(expected[0])
        assert float(r["williams_p"]) == pytest.approx(expected[1])
        assert 1 / 201 <= float(r["permutation_p"]) <= 1


@pytest.mark.slow
def test_plan_power_on_the_pilot(tst_run: Path) -> None:
    rows = read_csv(tst_run / "out" / "power.csv")
    assert {r["aspect"] for r in rows} == {"content", "style", "fluency"}
    for r in rows:
        assert r["n_pilot"] == "90" and r["method"] == "pearson"
        g, n = int(r["groups_pilot"]), 90
        groups = math.ceil(g * (float(r["ci_width_pilot"]) / 0.2) ** 2)
        assert int(r["groups_for_width"]) == max(2, groups)
        assert int(r["n_for_width"]) == max(4, math.ceil(max(2, groups) * n / g))
    text = (tst_run / "plan.txt").read_text()
    assert "target 95% CI width of A - B: 0.2" in text and "for 80% power" in text
    for r in rows:
        assert int(r["groups_pilot"]) <= 90 and 0 <= float(r["power_pilot"]) <= 1


@pytest.mark.slow
def test_plan_power_unknown_judge_is_one_error_line(tst_run: Path) -> None:
    result = run_judge("plan", "tst-formality", "--model", "fake", "--base-url",
                       "http://127.0.0.1:9/v1", "--limit", 90, "--cache-dir", tst_run / "cache",
                       "--out", tst_run / "x", "--power", "fake/single", "nobody/none",
                       env=clean_env(DATA_DIR), cwd=ROOT)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: jobs/tst-formality.toml: --power names no "
                           "judge 'nobody/none'; judges in the cache: ")
    assert "fake/single" in line


@pytest.mark.slow
def test_colossalai_battles_in_both_orders(data_dir: Path, tmp_path: Path) -> None:
    """The ColossalAI battle prompt, both orders, fake judge: on the first question it always
    prefers position 1 (a flip); the figures are recomputed from the requests it answered."""
    bodies: list[dict[str, Any]] = []

    def reply(body: dict[str, Any]) -> str:
        bodies.append(body)
        return fake_reply(body)

    with ThreadedServer(Script(reply=reply)) as server:
        ran = run_judge("run", ROOT / "jobs" / "colossalai-en.toml", "--base-url", server.url,
                        "--limit", 8, "--cache-dir", tmp_path / "cache", "--model", "fake",
                        "--out", tmp_path / "out", "--yes", "--rpm", 60000,
                        env=clean_env(data_dir), cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    first = second = 0
    position_scores: dict[int, list[float]] = defaultdict(list)
    verdicts: dict[str, list[str]] = defaultdict(list)
    for body in bodies:
        text = body["messages"][-1]["content"]
        if not BATTLE_MARK.search(text):
            continue
        s1, s2 = map(float, fake_reply(body).split("\n")[0].split())
        a1, a2 = answers_in(text)
        first, second = first + (s1 > s2), second + (s1 < s2)
        position_scores[1].append(s1)
        position_scores[2].append(s2)
        verdicts[text.split("\n")[1]].append("tie" if s1 == s2 else a1 if s1 > s2 else a2)
    assert len(verdicts) == 8 and all(len(v) == 2 for v in verdicts.values())
    flips = sum(len(set(v)) > 1 for v in verdicts.values())
    assert flips >= 1  # the biased question

    rows = {(r["statistic"], r["b"]): r for r in read_csv(tmp_path / "out" / "reliability.csv")
            if r["figure"] == "position" and r["a"] == "fake/battle"}
    assert float(rows["flip_rate", ""]["value"]) == pytest.approx(flips / 8)
    assert rows["flip_rate", ""]["n"] == "8"
    win = rows["first_position_win_rate", ""]
    assert int(win["n"]) == first + second
    assert float(win["value"]) == pytest.approx(first / (first + second))
    assert float(win["p_value"]) == pytest.approx(
        stats.binomtest(first, first + second, 0.5).pvalue)
    for position in (1, 2):
        row = rows["mean_score", f"position {position}"]
        assert float(row["value"]) == pytest.approx(np.mean(position_scores[position]))
    # battle.csv's inconsistent verdicts are the same flips
    [battle] = read_csv(tmp_path / "out" / "battle.csv")
    assert int(battle["inconsistent"]) == flips


@pytest.mark.slow
def test_self_consistency_across_samples(write_job: Any, tmp_path: Path,
                                         data_dir: Path) -> None:
    """samples = 3: three calls per item whose stars vary; alpha across the three samples is
    krippendorff's over the samples x items table read back from judgments.jsonl."""
    calls = iter(range(10_000))

    def reply(body: dict[str, Any]) -> str:
        n = next(calls)
        return f"{(n * 7 + len(body['messages'][-1]['content'])) % 5 + 1} stars"

    rows = [{"id": str(i), "text": "x" * i, "score": i % 5} for i in range(12)]
    job = write_job(SAMPLES_JOB, rows=rows, files={"p.txt": "Rate {{text}} in stars"})
    with ThreadedServer(Script(reply=reply)) as server:
        ran = run_judge("run", job, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
                        "--out", tmp_path / "out", "--yes", env=clean_env(data_dir), cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    table: dict[int, dict[str, float]] = defaultdict(dict)
    for line in (tmp_path / "out" / "judgments.jsonl").read_text().splitlines():
        j = json.loads(line)
        table[j["sample"]][j["item_id"]] = j["score"]
    assert sorted(table) == [0, 1, 2]
    ids = sorted(table[0])
    data = [[table[s][i] for i in ids] for s in range(3)]
    [row] = [r for r in read_csv(tmp_path / "out" / "reliability.csv")
             if r["figure"] == "self_consistency" and r["statistic"] == "alpha_interval"]
    assert (row["a"], row["b"], row["n"]) == ("fake/stars", "3 samples", "12")
    assert float(row["value"]) == pytest.approx(
        krippendorff.alpha(reliability_data=data, level_of_measurement="interval"))


SAMPLES_JOB = """
[[datasets]]
name = "mine"
path = "data.jsonl"
[datasets.fields]
id = "id"
text = { text = "text" }
human = { quality = "score" }

[[prompts]]
name = "stars"
template = "p.txt"
parser = "stars"
aspects = ["quality"]
samples = 3

[models.fake]
spec = "fake"
"""


@pytest.mark.slow
def test_self_consistency_across_choices_of_one_answer(write_job: Any, tmp_path: Path,
                                                       data_dir: Path) -> None:
    """params.n = 4 (G-Eval's sampling): each of the 4 choices is a sample; one choice that
    does not parse is missing, not a score."""
    def reply(body: dict[str, Any]) -> str:
        k = len(body["messages"][-1]["content"])
        texts = [f"{(k + c * (k % 3)) % 5 + 1} stars" for c in range(4)]
        if k % 4 == 0:
            texts[3] = "no idea"
        return CHOICE_SEP.join(texts)

    rows = [{"id": str(i), "text": "x" * i, "score": i % 5} for i in range(16)]
    job = write_job(SAMPLES_JOB.replace("samples = 3", "params = { n = 4 }"), rows=rows,
                    files={"p.txt": "Rate {{text}} in stars"})
    with ThreadedServer(Script(reply=reply)) as server:
        ran = run_judge("run", job, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
                        "--out", tmp_path / "out", "--yes", env=clean_env(data_dir), cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    table: list[list[float | None]] = [[], [], [], []]
    for line in (tmp_path / "out" / "judgments.jsonl").read_text().splitlines():
        j = json.loads(line)
        assert len(j["raw"]) == 4
        for c, text in enumerate(j["raw"]):
            table[c].append(float(text[0]) if text[0].isdigit() else None)
    assert sum(v is None for v in table[3]) == 4  # messages of 16, 20, 24, 28 characters
    data = [[np.nan if v is None else v for v in row] for row in table]
    [row] = [r for r in read_csv(tmp_path / "out" / "reliability.csv")
             if r["figure"] == "self_consistency" and r["statistic"] == "alpha_ordinal"]
    assert (row["a"], row["b"], row["n"]) == ("fake/stars", "4 samples", "16")
    assert float(row["value"]) == pytest.approx(
        krippendorff.alpha(reliability_data=data, level_of_measurement="ordinal"))


def test_interval_alpha_in_closed_form_matches_the_package() -> None:
    from runner.reduce.reliability import _interval_alpha
    table = np.array(KRIPPENDORFF_2011, dtype=float)
    table = table[:, np.sum(~np.isnan(table), axis=0) >= 2]
    assert round(_interval_alpha(table), 3) == 0.849
    rng = np.random.default_rng(5)
    noisy = rng.normal(size=(3, 50)) + rng.normal(size=50)
    noisy[rng.random((3, 50)) < 0.2] = np.nan
    noisy = noisy[:, np.sum(~np.isnan(noisy), axis=0) >= 2]
    assert _interval_alpha(noisy) == pytest.approx(
        krippendorff.alpha(reliability_data=noisy, level_of_measurement="interval"))
    # continuous scores (more than MAX_VALUES distinct values): interval only, and fast
    continuous = (rng.normal(size=5000) + rng.normal(size=(2, 5000))).tolist()
    assert alpha(continuous, "ordinal") is None
    assert alpha(continuous, "interval") == pytest.approx(
        _interval_alpha(np.array(continuous)))
    assert weighted_kappa([0, 5000], [0, 1]) is None  # 5,001 categories


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval", "ratio"])
def test_alpha_is_the_packages_bit_for_bit(level: str) -> None:
    """alpha sums the coincidence matrix over each unit's value pairs instead of the package's
    units x values x values array: the same additions in the same order, so the same bits."""
    rng = np.random.default_rng(len(level))
    for trial in range(60):
        coders, units, values = int(rng.integers(2, 6)), int(rng.integers(2, 200)), 2 + trial
        data = rng.integers(0, values, (coders, units)) * (0.5 if trial % 2 else 1.0)
        table = [[None if rng.random() < 0.3 else float(v) for v in row] for row in data]
        arr = np.array(table, dtype=float)
        pairable = arr[:, np.sum(~np.isnan(arr), axis=0) >= 2]
        if pairable.shape[1] < 2 or np.unique(pairable[~np.isnan(pairable)]).size < 2:
            assert alpha(table, level) is None  # type: ignore[arg-type]
            continue
        want = float(krippendorff.alpha(reliability_data=pairable, level_of_measurement=level))
        assert alpha(table, level) == want  # type: ignore[arg-type]
