"""runner.reduce.correlate on small synthetic data, cross-checked against direct scipy calls."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from runner.errors import ConfigError, DataError
from runner.reduce import _coef, _kendall
from runner.reduce import correlate as correlate_module
from runner.reduce import levels as levels_module
from runner.reduce import resample as resample_module
from runner.reduce.compare import compare
from runner.reduce.correlate import Correlation, Row, correlate
from runner.reduce.levels import Data, prepare, selections
from runner.reduce.pooled import Pooled
from runner.reduce.series import Labels, Series


def _counts(strata: tuple[int, ...], n_boot: int, seed: int) -> Any:
    """The draw counts of a fresh Resamples (nothing remembered from elsewhere)."""
    return resample_module.Resamples().counts(strata, n_boot, seed)


def _prepared(rows: Any) -> Data:
    return prepare(Series.of_rows(rows))


SCIPY: dict[str, Callable[..., Any]] = {
    "pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}


def synthetic(seed: int = 0, *, groups: int = 12, systems: int = 5,
              subsets: tuple[str, ...] = ("",), noise: float = 1.0,
              discrete: bool = True) -> list[Row]:
    """Groups x systems, judge = human + noise (rounded to stars when discrete)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        for s in range(systems):
            human = float(rng.integers(1, 6)) if discrete else float(rng.random())
            judge = human + noise * rng.normal()
            rows.append(Row(f"g{g}", f"s{s}", subsets[g % len(subsets)],
                            float(np.clip(np.round(judge), 1, 5)) if discrete else judge, human))
    return rows


def by_key(result: list[Correlation]) -> dict[tuple[str, str, str], Correlation]:
    return {(c.level, c.method, c.subset): c for c in result}


def scipy_value(method: str, x: list[float], y: list[float]) -> float:
    return float(SCIPY[method](x, y).statistic)


def sample_scipy(rows: list[Row], method: str, policy: str) -> float:
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[r.subset, r.group].append(r)
    coefs = []
    for g in groups.values():
        x, y = [r.judge for r in g], [r.human for r in g]
        if len(set(x)) < 2 or len(set(y)) < 2:
            if policy == "zero":
                coefs.append(0.0)
            continue
        coefs.append(scipy_value(method, x, y))  # type: ignore[arg-type]
    return float(np.mean(coefs))


def system_means(rows: list[Row]) -> tuple[list[float], list[float]]:
    systems = sorted({r.system for r in rows})
    mx = [float(np.mean([r.judge for r in rows if r.system == s])) for s in systems]
    my = [float(np.mean([r.human for r in rows if r.system == s])) for s in systems]
    return mx, my


@pytest.mark.parametrize("method", ["pearson", "spearman", "kendall"])
@pytest.mark.parametrize("policy", ["skip", "zero"])
def test_all_levels_match_scipy(method: str, policy: str) -> None:
    rows = synthetic(1, groups=30)
    got = by_key(correlate(rows, policy=policy, methods=(method,), n_boot=0))
    assert got["sample", method, "all"].value == pytest.approx(sample_scipy(rows, method, policy),
                                                               abs=1e-12)
    pooled = scipy_value(method, [r.judge for r in rows], [r.human for r in rows])  # type: ignore[misc]
    assert got["dataset", method, "all"].value == pytest.approx(pooled, abs=1e-12)
    mx, my = system_means(rows)
    assert got["system", method, "all"].value == pytest.approx(scipy_value(method, mx, my),
                                                               abs=1e-12)


def test_skip_and_zero_policies_on_constant_groups() -> None:
    rows = [Row("a", s, "", j, h) for s, j, h in (("x", 1, 1), ("y", 2, 2), ("z", 3, 3))]
    rows += [Row("b", s, "", j, 4) for s, j in (("x", 1), ("y", 2), ("z", 3))]  # human constant
    rows += [Row("c", s, "", 5, h) for s, h in (("x", 1), ("y", 3), ("z", 2))]  # judge constant
    rows += [Row("d", s, "", j, h) for s, j, h in (("x", 1, 2), ("y", 2, 1), ("z", 3, 3))]
    rows += [Row("e", "x", "", 1, 1)]  # a single output: no coefficient either
    skip = by_key(correlate(rows, policy="skip", levels=("sample",), n_boot=0))
    zero = by_key(correlate(rows, policy="zero", levels=("sample",), n_boot=0))
    for method in ("pearson", "spearman", "kendall"):
        r_d = scipy_value(method, [1, 2, 3], [2, 1, 3])  # 0.5, 0.5, 1/3
        s, z = skip["sample", method, "all"], zero["sample", method, "all"]
        assert s.value == pytest.approx((1 + r_d) / 2) and (s.n_groups, s.n_items) == (2, 6)
        assert z.value == pytest.approx((1 + r_d) / 5) and (z.n_groups, z.n_items) == (5, 13)


def test_pairwise_accuracy_with_ties_hand_computed() -> None:
    # system means, judge: A 1, B 1, C 2, D 3, E 3; human: A 1, B 2, C 2, D 3, E 3
    # AB tie/diff no, AC yes, AD yes, AE yes, BC diff/tie no, BD yes, BE yes, CD yes, CE yes,
    # DE tie/tie yes -> 8 of 10
    judge = {"A": 1.0, "B": 1.0, "C": 2.0, "D": 3.0, "E": 3.0}
    human = {"A": 1.0, "B": 2.0, "C": 2.0, "D": 3.0, "E": 3.0}
    rows = [Row(g, s, "", judge[s] + d, human[s] - d) for s in judge for g, d in
            (("g1", 0.5), ("g2", -0.5))]  # per-item noise that cancels in the means
    got = by_key(correlate(rows, levels=("system",), n_boot=0))
    assert got["system", "pairwise_accuracy", "all"].value == pytest.approx(0.8)
    assert got["system", "pairwise_accuracy", "all"].ci_low is None
    mx, my = system_means(rows)
    assert got["system", "kendall", "all"].value == pytest.approx(scipy_value("kendall", mx, my))


def test_all_subset_rules() -> None:
    # unequal group counts, so the mean over groups differs from the mean of subset means
    rows = [r for r in synthetic(2, groups=30, subsets=("i2f", "f2i"))
            if r.subset == "i2f" or int(r.group[1:]) < 10]
    got = correlate(rows, policy="zero", n_boot=0)
    assert [c.subset for c in got][:3] == ["i2f", "i2f", "i2f"]  # first-appearance order
    keys = by_key(got)
    subsets = {s: [r for r in rows if r.subset == s] for s in ("i2f", "f2i")}
    for m in ("pearson", "spearman", "kendall"):
        assert keys["sample", m, "all"].value == pytest.approx(sample_scipy(rows, m, "zero"))
        per = [sample_scipy(part, m, "zero") for part in subsets.values()]
        assert keys["sample", m, "all"].value != pytest.approx(float(np.mean(per)))
        pooled = scipy_value(m, [r.judge for r in rows], [r.human for r in rows])  # type: ignore[misc]
        assert keys["dataset", m, "all"].value == pytest.approx(pooled)
    for m in ("pearson", "spearman", "kendall", "pairwise_accuracy"):
        parts = [keys["system", m, s].value for s in subsets]
        assert keys["system", m, "all"].value == pytest.approx(np.mean(parts))  # type: ignore[arg-type]
    assert keys["dataset", "kendall", "all"].n_groups == 20
    assert keys["dataset", "kendall", "f2i"].n_items == 5 * 5


def test_no_subsets_reports_only_all_and_methods_per_level() -> None:
    got = correlate(synthetic(3), methods=("kendall", "pairwise_accuracy"), n_boot=0)
    assert [(c.level, c.method, c.subset) for c in got] == [
        ("sample", "kendall", "all"), ("dataset", "kendall", "all"),
        ("system", "kendall", "all"), ("system", "pairwise_accuracy", "all")]


def test_missing_judge_scores_are_dropped() -> None:
    rows = synthetic(4, groups=20)
    holes = [Row(r.group, r.system, r.subset, None if i % 7 == 0 else math.nan, r.human)
             if i % 7 in (0, 3) else r for i, r in enumerate(rows)]
    kept = [r for i, r in enumerate(rows) if i % 7 not in (0, 3)]
    assert correlate(holes, seed=5) == correlate(kept, seed=5)
    assert by_key(correlate(holes, n_boot=0))["dataset", "kendall", "all"].n_items == len(kept)


def test_bootstrap_ci_contains_estimate_and_is_seeded() -> None:
    rows = synthetic(5, groups=40, subsets=("a", "b"))
    first = correlate(rows, n_boot=300, seed=11)
    assert first == correlate(rows, n_boot=300, seed=11)
    assert first != correlate(rows, n_boot=300, seed=12)
    for c in first:
        if c.level == "system" and c.subset == "all":  # the mean of the subsets' values
            assert c.ci_low is None and c.ci_high is None
        elif c.level == "system":  # five systems: a CI from the resampled groups
            assert c.n_systems == 5 and c.ci_low is not None and c.ci_high is not None
        else:
            assert c.ci_low is not None and c.ci_high is not None and c.value is not None
            assert c.ci_low <= c.value <= c.ci_high
            assert c.ci_high - c.ci_low < 0.6
    assert all(c.ci_low is None for c in correlate(rows, n_boot=0))


def test_sample_bootstrap_resamples_groups() -> None:
    rows = synthetic(6, groups=25)
    got = correlate(rows, levels=("sample",), methods=("spearman",), n_boot=200, seed=3)[0]
    groups = sorted({r.group for r in rows}, key=lambda g: int(g[1:]))
    coefs = {g: scipy_value("spearman", [r.judge for r in rows if r.group == g],  # type: ignore[misc]
                            [r.human for r in rows if r.group == g]) for g in groups}
    counts = _counts((len(groups),), 200, 3)
    means = [sum(c * coefs[g] for c, g in zip(row, groups, strict=True)) / row.sum()
             for row in counts]
    assert (got.ci_low, got.ci_high) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))


@pytest.mark.parametrize("discrete", [True, False])
def test_dataset_bootstrap_equals_scipy_on_resampled_rows(discrete: bool) -> None:
    rng = np.random.default_rng(7)
    # variable group sizes (1-5 items) and heavy ties, in two subsets
    rows = [Row(f"g{g}", f"s{s}", "ab"[g % 2],
                float(rng.integers(1, 4)) if discrete else float(rng.random()),
                float(rng.integers(1, 5))) for g in range(24) for s in range(rng.integers(1, 6))]
    d = _prepared(rows)
    for sel in selections(d):
        counts = _counts(sel.strata, 40, 1)
        boots = levels_module._boot_pooled(d, sel, ("pearson", "spearman", "kendall"), counts)
        for b, row in enumerate(counts):
            idx = np.concatenate([np.arange(d.edges[g], d.edges[g + 1])
                                  for g in range(sel.g0, sel.g1)
                                  for _ in range(int(row[g - sel.g0]))])
            x, y = d.x[idx], d.y[idx]
            for m in SCIPY:
                want = math.nan if np.ptp(x) == 0 or np.ptp(y) == 0 else scipy_value(m, x, y)
                assert boots[m][b] == pytest.approx(want, abs=1e-12, nan_ok=True)


def pair_signs(d: Data, g0: int, g1: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The definition, item pair by item pair: groups x groups sums of
    sign(xi - xj) * sign(yi - yj), so that c'Sc is P (tau-b's numerator x 2) for draw counts c."""
    i0, i1 = d.edges[g0], d.edges[g1]
    x, y = d.x[i0:i1], d.y[i0:i1]
    signs = np.sign(x[:, None] - x) * np.sign(y[:, None] - y)
    starts = d.edges[g0:g1] - i0
    return np.add.reduceat(np.add.reduceat(signs, starts, axis=0), starts, axis=1)


def varied(rng: np.random.Generator, n_groups: int, x_values: int, y_values: int) -> list[Row]:
    """Groups of 1-9 items (a third singletons), two subsets; a side with 0 values is
    continuous, else drawn from that many values (ties)."""
    def draw(values: int) -> float:
        return float(rng.random()) if values == 0 else float(rng.integers(0, values))
    sizes = np.where(rng.random(n_groups) < 1 / 3, 1, rng.integers(1, 10, n_groups))
    return [Row(f"g{g}", f"s{s}", "ab"[g % 2], draw(x_values), draw(y_values))
            for g in range(n_groups) for s in range(sizes[g])]


def both_ways(d: Data, g0: int, g1: int, c: np.ndarray[Any, np.dtype[np.float64]]
              ) -> list[np.ndarray[Any, np.dtype[np.float64]]]:
    """P for draw counts c by merges over the cells and by the groups x groups matrix."""
    i0, i1 = d.edges[g0], d.edges[g1]
    p = Pooled(d.x[i0:i1], d.y[i0:i1], d.edges[g0:g1 + 1] - i0, 0)
    merges = _kendall.Pairs(merges=_kendall.plan(p.cx, p.cy))
    direct = _kendall.Pairs(signs=_kendall.group_signs(d.x[i0:i1], d.y[i0:i1],
                                                       d.edges[g0:g1 + 1] - i0))
    return [merges.sums(c, p.txy.drawn(c)), direct.sums(c, p.txy.drawn(c))]


@pytest.mark.parametrize(("x_values", "y_values"),
                         [(5, 0), (0, 5), (3, 40), (40, 3), (0, 0), (2, 2), (101, 9), (1, 6)])
def test_kendall_pair_sums_equal_the_direct_quadratic_form(x_values: int, y_values: int) -> None:
    rng = np.random.default_rng(x_values * 1000 + y_values)
    for trial in range(4):
        d = _prepared(varied(rng, int(rng.integers(1, 80)), x_values, y_values))
        for sel in selections(d):
            c = _counts(sel.strata, 60, trial)
            want = ((c @ pair_signs(d, sel.g0, sel.g1)) * c).sum(axis=1)
            for got in both_ways(d, sel.g0, sel.g1, c):
                np.testing.assert_array_equal(got, want)  # whole numbers: exact


def test_kendall_pair_sums_on_singleton_groups_of_a_larger_set() -> None:
    rng = np.random.default_rng(13)
    n = 1500  # continuous human against a 1-5 judge, every group a single item
    rows = [Row(f"g{i}", "s", "", float(rng.integers(1, 6)), float(rng.random()))
            for i in range(n)]
    d = _prepared(rows)
    c = _counts((n,), 8, 0)
    want = ((c @ pair_signs(d, 0, n)) * c).sum(axis=1)
    for got in both_ways(d, 0, n, c):
        np.testing.assert_array_equal(got, want)


def test_kendall_way_is_chosen_by_cost() -> None:
    rng = np.random.default_rng(14)
    def way(n: int, group: int, judge: Callable[[], float]) -> str:
        d = _prepared([Row(f"g{i // group}", "s", "", judge(), float(rng.random()))
                      for i in range(n)])
        p = Pooled(d.x, d.y, d.edges, 1000)
        return "matrix" if p.pairs().signs is not None else "merges"
    assert way(1000, 5, lambda: float(rng.random())) == "matrix"  # few groups, continuous
    assert way(6000, 6, lambda: float(rng.random())) == "matrix"
    assert way(6000, 6, lambda: float(rng.integers(1, 6))) == "merges"  # a 1-5 judge
    assert way(6000, 1, lambda: float(rng.random())) == "merges"  # too many groups


@pytest.mark.parametrize("draw_cells", [1 << 20, 1, 700])  # all at once, a row, a few rows
def test_counts_are_the_seeded_group_draws(draw_cells: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resample_module, "_DRAW_CELLS", draw_cells)
    for strata in [(1,), (7,), (5, 1, 12), (300, 200)]:
        rng = np.random.default_rng(9)  # the definition: each stratum's draws, one after another
        want = np.concatenate([np.stack([np.bincount(row, minlength=k)
                                         for row in rng.integers(0, k, size=(50, k))])
                               for k in strata], axis=1)
        got = _counts(strata, 50, 9)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("compact", [0, 1 << 26], ids=["drawn again", "kept as bytes"])
@pytest.mark.parametrize(("strata", "step"), [((1,), 7), ((7,), 1), ((5, 1, 12), 13),
                                              ((300, 200), 64), ((40,), 50)])
def test_lazy_draws_are_the_matrix_a_block_at_a_time(strata: tuple[int, ...], step: int,
                                                    compact: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A matrix too big to keep is made a block of resamples at a time, drawn again or
    converted from its uint8 copy: the same bits."""
    monkeypatch.setattr(resample_module, "_DRAW_CELLS", 90)  # the start search in chunks too
    want = resample_module._draw(strata, 50, 4)
    lazy = resample_module.Resamples(kept_cells=0, kept_compact=compact).counts(strata, 50, 4)
    assert isinstance(lazy, resample_module.Draws)
    assert (lazy.compact is not None) == bool(compact)
    blocks = list(lazy.blocks(step))
    assert len(lazy) == 50 and [len(b) for b in blocks][:-1] == [step] * (len(blocks) - 1)
    np.testing.assert_array_equal(np.concatenate(blocks), want)
    np.testing.assert_array_equal(np.concatenate(list(lazy.blocks(50))), want)  # again, whole


def test_a_matrix_with_a_count_past_a_byte_is_drawn_again_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A count above 255 does not fit the uint8 copy: that matrix is drawn again a block at a
    time, the same bits, and not tried again (counts made 256x here: real ones stay far
    below 255)."""
    real = resample_module._drawn
    monkeypatch.setattr(resample_module, "_drawn",
                        lambda rng, k, rows: real(rng, k, rows) * 256)
    strata = (5, 1, 12)
    want = resample_module._draw(strata, 50, 4)
    assert want.max() > 255
    resamples = resample_module.Resamples(kept_cells=0)
    for _ in range(2):
        lazy = resamples.counts(strata, 50, 4)
        assert isinstance(lazy, resample_module.Draws) and lazy.compact is None
        np.testing.assert_array_equal(np.concatenate(list(lazy.blocks(7))), want)
    assert resamples.compact == {(strata, 50, 4): None}


def test_correlations_from_lazy_draws_equal_those_from_the_matrix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = synthetic(5, groups=40, subsets=("p", "q"), discrete=False)
    held = correlate(rows, levels=("sample", "dataset"), n_boot=300, seed=2)
    for module in (levels_module, correlate_module):  # in blocks of a few resamples
        monkeypatch.setattr(module, "CELLS", 700)
    lazily = resample_module.Resamples(kept_cells=0, kept_compact=0)  # made lazily
    lazy = correlate(rows, levels=("sample", "dataset"), n_boot=300, seed=2, resamples=lazily)
    assert not lazily.drawn and lazily.starts
    as_bytes = resample_module.Resamples(kept_cells=0)  # kept as uint8
    assert correlate(rows, levels=("sample", "dataset"), n_boot=300, seed=2,
                     resamples=as_bytes) == lazy
    assert not as_bytes.drawn and not as_bytes.starts and all(
        c is not None for c in as_bytes.compact.values())
    assert [(c.level, c.method, c.subset, c.value) for c in lazy] == [
        (c.level, c.method, c.subset, c.value) for c in held]
    for a, b in zip(lazy, held, strict=True):
        assert a.ci_low == pytest.approx(b.ci_low, rel=1e-12)
        assert a.ci_high == pytest.approx(b.ci_high, rel=1e-12)
    # each resample's own mean, in resample order (compare pairs two judges' by position)
    rng = np.random.default_rng(1)
    coefs = {"pearson": np.where(rng.random(40) < 0.2, np.nan, rng.random(40)),
             "kendall": rng.random(40)}
    sizes = np.full(40, 5)
    lazy = resample_module.Resamples(kept_cells=0).counts((25, 15), 300, 2)
    drawn = levels_module._samples(coefs, sizes, lazy, "skip")
    matrix = levels_module._samples(coefs, sizes, resample_module._draw((25, 15), 300, 2),
                                       "skip")
    for m in coefs:
        assert drawn[m].value == matrix[m].value and drawn[m].boot is not None
        np.testing.assert_allclose(drawn[m].boot, matrix[m].boot, rtol=1e-12)


@pytest.mark.parametrize("m", [2, 3, 8, 17, 64])
def test_sample_kendall_is_scipy_bit_for_bit(m: int) -> None:
    rng = np.random.default_rng(m)
    xs = rng.integers(1, 6, (500, m)).astype(float)
    ys = np.where(rng.random((500, m)) < 0.5, rng.integers(1, 4, (500, m)), rng.random((500, m)))
    ok = (np.ptp(xs, axis=1) > 0) & (np.ptp(ys, axis=1) > 0)
    want = [stats.kendalltau(x, y).statistic for x, y in zip(xs[ok], ys[ok], strict=True)]
    assert _kendall.tau_b_rows(xs[ok], ys[ok]).tolist() == want


def test_undefined_values_are_none() -> None:
    one_group = [Row("g", s, "", j, h) for s, j, h in (("a", 1, 2), ("b", 2, 1))]
    got = by_key(correlate(one_group, n_boot=50))
    assert got["sample", "kendall", "all"].value == pytest.approx(-1.0)
    constant = [Row(f"g{i}", s, "", 3, h) for i in range(3) for s, h in (("a", 1), ("b", 2))]
    for c in correlate(constant, n_boot=50):
        if c.method != "pairwise_accuracy":
            assert c.value is None and c.ci_low is None, c
    for c in correlate([Row("g", "a", "", None, 1.0)], n_boot=50):
        assert (c.value, c.n_items, c.ci_low) == (None, 0, None)


@pytest.mark.parametrize("kwargs", [{"policy": "drop"}, {"levels": ("corpus",)},
                                    {"methods": ("tau",)}, {"n_boot": -1}])
def test_bad_options_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        correlate(synthetic(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        compare(synthetic(), synthetic(), **kwargs)  # type: ignore[arg-type]


def test_subset_named_all_is_refused() -> None:
    with pytest.raises(DataError, match="reserved"):
        correlate([Row("g", "a", "all", 1, 1)])


def noisy(rows: list[Row], seed: int, noise: float) -> list[Row]:
    rng = np.random.default_rng(seed)
    return [Row(r.group, r.system, r.subset, r.human + noise * rng.normal(), r.human)
            for r in rows]


def test_compare_detects_a_real_difference() -> None:
    base = synthetic(8, groups=60, subsets=("p", "q"), discrete=False)
    good, bad = noisy(base, 1, 0.1), noisy(base, 2, 1.0)
    result = compare(good, bad, n_boot=500)
    assert {(c.level, c.subset) for c in result} == {
        (lv, s) for lv in ("sample", "dataset") for s in ("p", "q", "all")}
    for c in result:
        assert c.diff is not None and c.ci_low is not None and c.p_value is not None
        assert c.diff > 0 and c.ci_low > 0 and c.p_value < 0.01, c
        assert c.n_groups == (60 if c.subset == "all" else 30)  # each subset its own groups
    values = by_key(correlate(good, levels=("sample", "dataset"), n_boot=0))
    for c in result:
        assert c.judge_a == values[c.level, c.method, c.subset].value


def test_compare_finds_no_difference_between_equals() -> None:
    base = synthetic(9, groups=60, discrete=False)
    a = noisy(base, 3, 0.5)
    same = compare(a, list(reversed(a)), n_boot=200)
    assert all(c.diff == 0 and c.p_value == 1 for c in same)
    twins = compare(a, noisy(base, 4, 0.5), n_boot=500)
    for c in twins:
        assert c.p_value is not None and c.p_value > 0.05, c
        assert c.ci_low is not None and c.ci_high is not None
        assert c.ci_low < 0 < c.ci_high


def test_compare_pairs_common_scored_items_only() -> None:
    a = synthetic(10, groups=20)
    b = [Row(r.group, r.system, r.subset, None if i % 5 == 0 else r.judge, r.human)
         for i, r in enumerate(a[:-5])]
    result = compare(a, b, levels=("dataset",), methods=("kendall",), n_boot=0)
    kept = [r for i, r in enumerate(a[:-5]) if i % 5]
    assert result[0].judge_a == pytest.approx(scipy_value(
        "kendall", [r.judge for r in kept], [r.human for r in kept]))  # type: ignore[misc]
    assert result[0].n_groups == 19
    swapped = compare(b, a, levels=("dataset",), methods=("kendall",), n_boot=0)[0]
    assert (swapped.judge_a, swapped.judge_b, swapped.n_groups) == (
        result[0].judge_b, result[0].judge_a, 19)  # the first judge's gaps are left out too


def test_compare_defaults_to_1000_resamples_of_seed_0() -> None:
    base = synthetic(14, discrete=False)
    a, b = noisy(base, 1, 0.3), noisy(base, 2, 0.6)
    assert compare(a, b) == compare(a, b, levels=("sample", "dataset"), n_boot=1000, seed=0)


def test_compare_of_an_undefined_coefficient_has_no_difference() -> None:
    a = synthetic(13)
    flat = [Row(r.group, r.system, r.subset, 3.0, r.human) for r in a]  # a constant judge
    (c,) = compare(flat, a, levels=("dataset",), methods=("pearson",), n_boot=50)
    assert c.judge_a is None and c.judge_b is not None
    assert (c.diff, c.ci_low, c.ci_high, c.p_value) == (None, None, None, None)


def test_compare_rejects_duplicates_mismatches_and_system_level() -> None:
    a = synthetic(11)
    with pytest.raises(DataError, match="two rows"):
        compare(a + a[:1], a)
    # the first row whose output an earlier row has, the first pair whose humans differ
    with pytest.raises(DataError, match="group 'g1', system 's2', subset ''; compare"):
        compare(a + a[7:8] + a[:1], a)
    differ = [Row(r.group, r.system, r.subset, r.judge, r.human + (i in (6, 9)))
              for i, r in enumerate(a)]
    with pytest.raises(DataError, match=r"group 'g1', system 's1': .* \(5\.0 vs 6\.0\)"):
        compare(a, differ)
    with pytest.raises(ConfigError, match="system"):
        compare(a, a, levels=("system",))


def test_pairwise_accuracy_counts_every_pair() -> None:
    rng = np.random.default_rng(12)
    mx, my = rng.integers(0, 3, 6).astype(float), rng.integers(0, 3, 6).astype(float)
    rows = [Row("g", f"s{i}", "", float(mx[i]), float(my[i])) for i in range(6)]
    pairs = list(itertools.combinations(range(6), 2))
    want = sum(np.sign(mx[i] - mx[j]) == np.sign(my[i] - my[j]) for i, j in pairs) / len(pairs)
    got = by_key(correlate(rows, levels=("system",), n_boot=0))
    assert got["system", "pairwise_accuracy", "all"].value == pytest.approx(want)


# ------------------------------------- scipy's statistics in numpy (runner.reduce._coef)

FINITE = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
SAMPLES = st.integers(2, 60).flatmap(lambda n: st.tuples(
    st.lists(FINITE | st.sampled_from([1.0, 2.0, 3.0]), min_size=n, max_size=n),
    st.lists(st.integers(1, 5).map(float) | FINITE, min_size=n, max_size=n)))


@settings(max_examples=300, deadline=None)
@given(SAMPLES)
def test_coef_is_scipy_bit_for_bit(sample: tuple[list[float], list[float]]) -> None:
    """Point values are _coef's, not scipy's: the same float operations must give the same
    bits, ties, two points and large values included."""
    x, y = np.array(sample[0]), np.array(sample[1])
    assert _coef.rankdata(x).tolist() == stats.rankdata(x).tolist()
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return
    assert float(_coef.pearson(x, y)) == float(stats.pearsonr(x, y).statistic)
    assert _coef.spearman(x, y) == float(stats.spearmanr(x, y).statistic)
    assert _coef.kendall(x, y) == float(stats.kendalltau(x, y).statistic)


@pytest.mark.parametrize("m", [2, 3, 9, 65])
def test_coef_rows_are_scipy_bit_for_bit(m: int) -> None:
    rng = np.random.default_rng(m)
    xs = rng.integers(1, 6, (300, m)).astype(float)
    ys = np.where(rng.random((300, m)) < 0.5, rng.integers(1, 4, (300, m)), rng.random((300, m)))
    ok = (np.ptp(xs, axis=1) > 0) & (np.ptp(ys, axis=1) > 0)
    xs, ys = xs[ok], ys[ok]
    np.testing.assert_array_equal(_coef.rankdata(ys), stats.rankdata(ys, axis=1))
    np.testing.assert_array_equal(_coef.pearson(xs, ys), stats.pearsonr(xs, ys, axis=1).statistic)
    assert np.isnan(_coef.pearson(np.ones((1, m)), ys[:1])).all()


def test_pearson_of_a_constant_row_is_nan_even_when_its_mean_rounds() -> None:
    """The mean of three 0.1s is not 0.1, so the centred row is not exactly 0: the constant
    test, not a 0/0, makes it NaN (as scipy does), on either side."""
    xs = np.array([[0.1] * 3, [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]])
    ys = np.array([[1.0, 2.0, 3.0], [0.1] * 3, [1.0, 2.0, 3.0]])
    got = _coef.pearson(xs, ys)
    assert np.isnan(got[:2]).all() and got[2] == stats.pearsonr(xs[2], ys[2]).statistic


@pytest.mark.parametrize("cells", [1, 400, 1 << 22])
def test_group_signs_in_blocks_of_any_size(cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row blocks of whole groups, down to one group per block when a group alone is bigger
    than a block: the same sums as every item pair one by one."""
    rng = np.random.default_rng(7)
    x, y = rng.integers(0, 4, 40).astype(np.float64), rng.random(40)
    edges = np.array([0, 3, 15, 16, 30, 40])
    want = np.zeros((5, 5))
    group = np.repeat(np.arange(5), np.diff(edges))
    for i, j in itertools.product(range(40), repeat=2):
        want[group[i], group[j]] += np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
    monkeypatch.setattr(_kendall, "_CELLS", cells)
    np.testing.assert_array_equal(_kendall.group_signs(x, y, edges), want)


def test_kendall_plans_are_frozen_value_objects() -> None:
    merges = _kendall.plan(np.array([0, 1, 2]), np.array([1, 0, 2]))
    counts = _kendall.counts(np.array([0, 1]), np.array([0, 0]), (1, 2))
    for value in (merges[0], _kendall.Pairs(merges=merges), counts):
        assert not hasattr(value, "__dict__")  # slots
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, None)


def test_kendall_with_a_constant_side_is_nan() -> None:
    """Every pair ties on one side: tau-b is undefined (scipy gives NaN), not -1 or 0."""
    for x, y in (([2, 2, 2, 2], [1, 2, 3, 4]), ([1, 2, 3, 4], [5, 5, 5, 5]), ([1, 1], [3, 3])):
        assert math.isnan(_coef.kendall(x, y))
    assert _coef.kendall([1, 1, 2], [1, 2, 3]) == stats.kendalltau([1, 1, 2], [1, 2, 3]).statistic


def test_kendall_of_identical_or_reversed_ties_is_exactly_one_or_minus_one() -> None:
    """With ties, tau-b's c / sqrt(n) / sqrt(n) rounds past 1 (1.0000000000000002 for five
    points of two values): the clip keeps it in [-1, 1], as scipy does."""
    x = np.array([0.0, 1.0, 0.0, 1.0, 0.0])
    assert _coef.kendall(x, x) == 1.0 and _coef.kendall(x, -x) == -1.0


def test_kendall_of_large_continuous_samples_is_scipy_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.random(20_000), rng.random(20_000) + rng.integers(0, 3, 20_000)
    assert _coef.kendall(x, y) == stats.kendalltau(x, y).statistic
    assert _coef.kendall(x.round(2), y) == stats.kendalltau(x.round(2), y).statistic


@pytest.mark.parametrize("cells", [1 << 22, 50])
def test_counts_drawn_are_table_times_draws(cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole table or non-zero entries (a small _CELLS forces the entries), the same counts."""
    monkeypatch.setattr(_kendall, "_CELLS", cells)
    rng = np.random.default_rng(5)
    group, value = rng.integers(0, 30, 400), rng.integers(0, 17, 400)
    value[:17] = np.arange(17)  # every value occurs
    table = np.zeros((30, 17))
    np.add.at(table, (group, value), 1)
    counts = _kendall.counts(value, group, (30, 17))
    assert (counts.table is None) == (cells == 50)
    c = _counts((30,), 25, 2)
    got = counts.drawn(c)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, table.T @ c.T)


# --- the reducer's input as columns ----------------------------------------------------------

def _reference_prepare(rows: list[Row]) -> Data:
    """correlate._prepare as it was on Row lists (f08defe): the definition the columns keep."""
    x = np.array([r.judge for r in rows], dtype=np.float64)
    y = np.array([r.human for r in rows], dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    keys: dict[tuple[str, str], int] = {}
    code = np.array([keys.setdefault((r.subset, r.group), len(keys)) for r in rows],
                    dtype=np.intp)[ok]
    names = list(keys)
    first_code, first_at = np.unique(code, return_index=True)
    appearance = first_code[np.argsort(first_at)]
    group_rank = np.empty(len(names), dtype=np.intp)
    group_rank[appearance] = np.arange(len(appearance))
    subsets = tuple(dict.fromkeys(names[c][0] for c in appearance))
    subset_of = {s: i for i, s in enumerate(subsets)}
    group_subset = np.array([subset_of.get(n[0], -1) for n in names], dtype=np.intp)
    perm = np.lexsort((group_rank[code], group_subset[code]))
    order, kept = ok[perm], code[perm]
    firsts = np.flatnonzero(np.r_[True, kept[1:] != kept[:-1]]) if len(kept) else kept
    system_names = [rows[i].system for i in order]
    systems = {s: i for i, s in enumerate(sorted(set(system_names)))}
    bounds = np.searchsorted(group_subset[kept[firsts]], np.arange(len(subsets)))
    return Data(x=x[order], y=y[order],
                 system=np.array([systems[s] for s in system_names], dtype=np.intp),
                 edges=np.r_[firsts, len(kept)].astype(np.intp),
                 bounds=np.r_[bounds, len(firsts)].astype(np.intp), subsets=subsets)


def _shuffled_labels(s: Series, rng: np.random.Generator) -> Series:
    """The same rows with label codes numbered in another order (as a data set's shared labels
    number them), and names no row uses."""
    columns, names = [], []
    for labels, column in ((s.labels.groups, s.group), (s.labels.systems, s.system),
                           (s.labels.subsets, s.subset)):
        extra = [f"unused{k}" for k in range(3)]
        every = list(labels) + extra
        perm = rng.permutation(len(every))
        new_code = np.empty(len(every), dtype=np.int32)
        new_code[perm] = np.arange(len(every))
        shuffled = [""] * len(every)
        for old, new in enumerate(new_code.tolist()):
            shuffled[new] = every[old]
        columns.append(new_code[column])
        names.append(tuple(shuffled))
    return Series(s.judge, s.human, *columns, Labels(*names))


def _same_data(a: Data, b: Data) -> None:
    for field in ("x", "y", "system", "edges", "bounds"):
        got, want = getattr(a, field), getattr(b, field)
        assert got.dtype == want.dtype, field
        np.testing.assert_array_equal(got, want, err_msg=field)
    assert a.subsets == b.subsets


@pytest.mark.parametrize("trial", range(40))
def test_prepare_from_a_series_equals_prepare_from_its_rows(trial: int) -> None:
    """_prepare on a Series gives the Data the Row-list code gave: subsets and groups in order
    of first appearance among usable rows, systems by sorted name, whatever the label codes'
    numbering (NaN and None judges, NaN humans, subsets, repeated groups, empty)."""
    rng = np.random.default_rng(trial)
    n = int(rng.integers(0, 60))
    subsets = [["", "x"], ["b", "a", "c"], [""]][trial % 3]
    rows = []
    for _ in range(n):
        judge: float | None = float(rng.integers(1, 6))
        if rng.random() < 0.15:
            judge = None if rng.random() < 0.5 else math.nan
        human = math.nan if rng.random() < 0.05 else float(rng.random())
        rows.append(Row(f"g{rng.integers(0, 8)}", f"s{rng.integers(0, 6)}",
                        str(rng.choice(subsets)), judge, human))
    series = Series.of_rows(rows)
    want = _reference_prepare(rows)
    _same_data(prepare(series), want)
    _same_data(prepare(_shuffled_labels(series, rng)), want)


def test_correlate_and_compare_take_a_series_or_rows_alike() -> None:
    a, b = synthetic(1, subsets=("p", "q")), noisy(synthetic(1, subsets=("p", "q")), 2, 0.7)
    rng = np.random.default_rng(0)
    sa = _shuffled_labels(Series.of_rows(a), rng)
    assert correlate(sa, n_boot=50, seed=1) == correlate(a, n_boot=50, seed=1)
    assert compare(sa, Series.of_rows(b), n_boot=50) == compare(a, b, n_boot=50)
