"""The columnar cells (runner.reduce.cells) against the dict of cells they replaced: the same
scores.csv bytes, summary, leaderboard, judge series and reliability tables on random judgments
with several samples, failures of every type, juries, subsets, metrics and annotators."""

from __future__ import annotations

import io
import math
import statistics
import types
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from runner.data.datasets import Item
from runner.job.spec import JurySpec
from runner.reduce.cells import CellBuilder, Cells, grouped
from runner.reduce.correlate import Row, correlate
from runner.reduce.judgments import Judgment
from runner.reduce.jury import judge_name, member, verdict
from runner.report import reliability as report_reliability
from runner.report import tables as report_tables
from runner.report.write import judge_rows
from runner.tasks import Task

ASPECTS = ("a", "b")
PROMPTS = (("p1", 3), ("p2", 1))  # (name, samples)
MODELS = ("m1", "m2", "m3")


def _items(rng: np.random.Generator, dataset: str, n: int, subsets: bool) -> list[Item]:
    out = []
    for i in range(n):
        human = {a: float(rng.integers(1, 6)) for a in ASPECTS if rng.random() < 0.85}
        votes = {a: tuple(float(v) for v in rng.integers(1, 6, int(rng.integers(2, 4))))
                 for a in ASPECTS if rng.random() < 0.4}
        metrics: dict[str, dict[str, float]] = {}
        if rng.random() < 0.7:
            metrics["*"] = {"bleu": float(rng.random()), "ter": float(rng.random())}
        if rng.random() < 0.3:
            metrics["a"] = {"bert": float(rng.random())}
        if i % 6 == 5:  # whole-number human scores as ints, as a loader may leave them
            human = {a: int(v) for a, v in human.items()}
        # labels scores.csv must quote: a comma, a quote, a line break; and non-ASCII
        item_id = f'{dataset}-"{i}", x' if i % 7 == 3 else f"{dataset}-{i}"
        group = f"g{i // 4}\nnext" if i % 11 == 2 else f"g{i // 4}"
        out.append(Item(dataset=dataset, item_id=item_id, group=group,
                        system=f"s{int(rng.integers(0, 5))}" + ("é" if i % 3 == 0 else ""),
                        subset=str(rng.choice(["x", "y"])) if subsets else "",
                        fields={"output": "w " * int(rng.integers(1, 30))}, human=human,
                        annotators=votes, metrics=metrics))
    return out


def _judgments(rng: np.random.Generator, items: dict[str, list[Item]], floats: bool
               ) -> list[Judgment]:
    """Every task's judgment (some left out), cells first met in a shuffled order; `floats`:
    some scores not whole numbers (else the means' exact integer path)."""
    out = []
    for dataset, its in items.items():
        for it in its:
            for prompt, samples in PROMPTS:
                for aspect in ASPECTS:
                    for model in MODELS:
                        for sample in range(samples):
                            out.append(_judgment(rng, dataset, it, prompt, aspect, model, sample,
                                                  floats))
    # an item the expansion's lists lack, by a judge the job does not list
    extra = Item(dataset="d1", item_id="stray", group="g0", system="s0", subset="",
                 fields={}, human={"a": 2.0}, annotators={}, metrics={})
    out.append(_judgment(rng, "d1", extra, "late", "a", "m9", 0, floats))
    order = rng.permutation(len(out))[: len(out) * 9 // 10]  # cells in a shuffled order
    return [out[i] for i in sorted(order.tolist(), key=lambda k: (k % 7, k))]


def _judgment(rng: np.random.Generator, dataset: str, it: Item, prompt: str, aspect: str,
              model: str, sample: int, floats: bool) -> Judgment:
    task = Task(key=f"{int(rng.integers(0, 1 << 62)):064x}", dataset=dataset,
                item_id=it.item_id, prompt=prompt, aspect=aspect, model=model, sample=sample,
                body=b"{}", prompt_tokens=1, max_tokens=1)
    kind = rng.random()
    score: float | None
    if kind < 0.1:
        score, error = None, {"type": str(rng.choice(["parse", "refusal", "api"])),
                              "message": "no"}
    else:
        value = rng.integers(1, 6) if kind < 0.7 or not floats else rng.random() * 5
        score, error = float(value), None
        if kind > 0.97:
            score = -0.0 if kind > 0.985 else 0.0  # scores.csv writes each as it is
    return Judgment(task=task, item=it, score=score, values={}, raw="r", error=error,
                    cached=True, usage=None)


def _expansion(items: dict[str, list[Item]], juries: tuple[JurySpec, ...]) -> Any:
    prompts = [types.SimpleNamespace(name=p, datasets=(), aspects=ASPECTS) for p, _ in PROMPTS]
    return types.SimpleNamespace(
        items=items, lower_is_better={"d1": frozenset({"ter"})},
        job=types.SimpleNamespace(prompts=prompts, juries=juries),
        judges=lambda p: [types.SimpleNamespace(name=m) for m in MODELS])


def _keys(cells: Cells) -> list[tuple[str, str, str, str, str]]:
    """(dataset, item_id, prompt, aspect, model) of every cell, in order."""
    return [(cells.datasets[int(cells.item_dataset[i])], cells.items[i].item_id, *j[:2], j[2])
            for i, j in zip(cells.item.tolist(), (cells.judges[c] for c in cells.judge.tolist()),
                            strict=True)]


# --- the reference: the dict of cells and the reports read from it (f08defe) ------------------

def _reference_cells(judgments: list[Judgment], juries: tuple[JurySpec, ...]
                     ) -> dict[tuple[str, str, str, str, str], list[Any]]:
    """key -> [item, score or None, error types]."""
    gathered: dict[tuple[str, str, str, str, str], list[Any]] = {}
    for j in judgments:
        t = j.task
        key = (t.dataset, j.item.item_id, t.prompt, t.aspect, t.model)
        cell = gathered.setdefault(key, [j.item, [], ()])
        if j.score is not None:
            cell[1].append(j.score)
        if j.error is not None:
            cell[2] += (j.error["type"],)
    for cell in gathered.values():
        s = cell[1]
        cell[1] = None if not s else float(s[0]) if len(s) == 1 else statistics.fmean(s)
    scores = {key: cell[1] for key, cell in gathered.items()}
    items = {(key[0], key[1]): cell[0] for key, cell in gathered.items()}
    for jury in juries:
        members = {member(j) for j in jury.judges}
        pooled: dict[tuple[str, str, str], list[float]] = {}
        for (dataset, item_id, prompt, aspect, model), score in scores.items():
            if (model, prompt) in members:
                votes = pooled.setdefault((dataset, item_id, aspect), [])
                votes += [] if score is None else [score]
        quorum = jury.quorum or len(jury.judges)
        for (dataset, item_id, aspect), votes in pooled.items():
            score = verdict(jury.method, votes) if len(votes) >= quorum else None
            gathered[dataset, item_id, "", aspect, jury.name] = [items[dataset, item_id], score,
                                                                 ()]
    return gathered


def _metrics(item: Item, aspect: str) -> dict[str, float]:
    return {**item.metrics.get("*", {}), **item.metrics.get(aspect, {})}


def _reference_scores(cells: dict[tuple[str, str, str, str, str], list[Any]]) -> bytes:
    import csv
    fmt = report_tables.fmt
    names = sorted({m for (_, _, _, aspect, _), c in cells.items() if c[0].metrics
                    for m in _metrics(c[0], aspect)})
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["dataset", "item_id", "group", "system", "subset", "prompt", "aspect", "model",
                "judge_score", "human_score", *names])
    for (dataset, item_id, prompt, aspect, model), (it, score, _) in cells.items():
        metrics = _metrics(it, aspect)
        w.writerow([dataset, item_id, it.group, it.system, it.subset, prompt, aspect, model,
                    fmt(score), fmt(it.human.get(aspect)), *(fmt(metrics.get(m)) for m in names)])
    return out.getvalue().encode()


def _reference_summary(cells: dict[tuple[str, str, str, str, str], list[Any]]
                       ) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str, str], list[list[Any]]] = defaultdict(list)
    for (dataset, _, prompt, aspect, model), cell in cells.items():
        groups[dataset, prompt, aspect, model].append(cell)
    rows = []
    for (dataset, prompt, aspect, model), cs in groups.items():
        scores = [c[1] for c in cs if c[1] is not None]
        errors = [e for c in cs for e in c[2]]
        rows.append({"dataset": dataset, "prompt": prompt, "aspect": aspect, "model": model,
                     "n": len(cs), "scored": len(scores),
                     "mean": statistics.fmean(scores) if scores else None,
                     "std": statistics.stdev(scores) if len(scores) > 1 else None,
                     "parse_failures": errors.count("parse"), "refusals": errors.count("refusal"),
                     "api_failures": errors.count("api"),
                     # the commonest score, the first to reach its count in item order
                     **_top(scores)})
    return rows


def _top(scores: list[float]) -> dict[str, Any]:
    counts: dict[float, int] = {}
    for score in scores:
        counts[score] = counts.get(score, 0) + 1
    most = max(counts.values(), default=0)
    return {"top_score": next((s for s, n in counts.items() if n == most), None),
            "top_count": most}


def _reference_rows(expansion: Any, cells: dict[tuple[str, str, str, str, str], list[Any]]
                    ) -> dict[tuple[str, str], dict[str, list[Row]]]:
    out: dict[tuple[str, str], dict[str, list[Row]]] = {}
    for (dataset, _, prompt, aspect, model), (it, score, _) in cells.items():
        if (human := it.human.get(aspect)) is None:
            continue
        out.setdefault((dataset, aspect), {}).setdefault(judge_name(model, prompt), []).append(
            Row(it.group, it.system, it.subset, score, human))
    for (dataset, aspect), judges in out.items():
        lower = expansion.lower_is_better.get(dataset, frozenset())
        for it in expansion.items[dataset]:
            if aspect not in it.human or not (it.metrics or it.annotators):
                continue
            human = it.human[aspect]
            for name, value in _metrics(it, aspect).items():
                judges.setdefault(name, []).append(Row(
                    it.group, it.system, it.subset, -value if name in lower else value, human))
            votes = it.annotators.get(aspect, ())
            if len(votes) >= 2:
                judges.setdefault("iaa", []).append(Row(it.group, it.system, it.subset,
                                                        votes[1], votes[0]))
    return out


def _same_rows(got: list[Row], want: list[Row]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.group, g.system, g.subset, g.human) == (w.group, w.system, w.subset, w.human)
        assert g.judge == w.judge or (g.judge is None and (w.judge is None or math.isnan(w.judge)))


# --- the test ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_columnar_reports_equal_those_of_the_dict_of_cells(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if seed % 2:  # scores.csv and the scored pairs a few cells at a time: the parts' edges
        monkeypatch.setattr(report_tables, "ROWS_A_PART", 7)
        monkeypatch.setattr(report_reliability, "_PART", 5)
    rng = np.random.default_rng(seed)
    items = {"d1": _items(rng, "d1", 30, subsets=False),
             "d2": _items(rng, "d2", 24, subsets=True)}
    juries = (JurySpec(name="panel", judges=("m1/p1", "m2/p1"), method="mean"),
              JurySpec(name="med", judges=("m1/p2", "m2/p2", "m3/p2"), method="median",
                       quorum=2),
              JurySpec(name="vote", judges=("m1/p1", "m3/p2"), method="majority", quorum=1))
    expansion = _expansion(items, juries)
    judgments = _judgments(rng, items, floats=seed % 2 == 1)
    want = _reference_cells(judgments, juries)
    tables = report_tables.collect(expansion, judgments, io.BytesIO(), juries)

    assert _keys(tables.cells) == list(want)
    got_scores = io.BytesIO()
    report_tables.scores_csv(tables, got_scores)  # type: ignore[arg-type]
    assert got_scores.getvalue() == _reference_scores(want)
    assert report_tables.summary(tables) == _reference_summary(want)

    got_rows = judge_rows(expansion, tables)
    want_rows = _reference_rows(expansion, want)
    assert list(got_rows) == list(want_rows)
    for where, judges in want_rows.items():
        assert list(got_rows[where]) == list(judges)
        for name, rows in judges.items():
            _same_rows(got_rows[where][name].rows(), rows)
            assert correlate(got_rows[where][name], n_boot=30) == correlate(rows, n_boot=30)

    for dataset in items:
        for aspect in ASPECTS:
            got = report_reliability._by_judge(tables.cells, dataset, aspect)
            ref: dict[str, dict[str, tuple[Item, float]]] = {}
            for (d, item_id, prompt, a, model), (it, score, _) in want.items():
                if d == dataset and a == aspect and score is not None:
                    ref.setdefault(judge_name(model, prompt), {})[item_id] = (it, score)
            assert list(got) == list(ref)
            for name, (ids, scores) in got.items():
                assert [(tables.cells.items[i].item_id, s) for i, s in
                        zip(ids.tolist(), scores.tolist(), strict=True)] == [
                    (k, v[1]) for k, v in ref[name].items()]
    assert report_reliability._scored_pairs(tables.cells) == list(dict.fromkeys(
        (k[0], k[3]) for k, c in want.items() if c[1] is not None))


def test_the_mean_of_several_samples_is_fmean_bit_for_bit() -> None:
    """Non-integer samples take math.fsum's correctly rounded sum, as statistics.fmean does
    (a plain running sum differs in the last bit for these)."""
    it = Item(dataset="d", item_id="i", group="g", system="s", subset="", fields={},
              human={}, annotators={}, metrics={})
    expansion = _expansion({"d": [it]}, ())
    values = [[0.1, 0.2, 0.3], [1e16, 1.0, -1e16], [3.0, 4.0], [2.5]]
    builder = CellBuilder(expansion)
    for k, scores in enumerate(values):
        for s in scores:
            builder.add("d", it, ("p1", "a", f"m{k}"), s, None)
    got = builder.finish().score.tolist()
    assert got == [statistics.fmean(v) for v in values]
    assert got[0] != sum(values[0]) / 3  # what a running sum would give


def _item(item_id: str, dataset: str = "d") -> Item:
    return Item(dataset=dataset, item_id=item_id, group="g", system="s", subset="", fields={},
                human={}, annotators={}, metrics={})


def test_means_take_the_integer_shortcut_only_where_it_is_exact() -> None:
    """The shortcut (the first score plus the rest summed) is fsum's value only for whole
    scores whose sums stay exact: fractions alone, and whole numbers past 2**52, take fsum."""
    it = _item("i")
    for values in ([[0.3, 0.1, 0.2]], [[1.0, 2.0 ** 53, 1.0], [2.0, 3.0]]):
        builder = CellBuilder(_expansion({"d": [it]}, ()))
        for k, scores in enumerate(values):
            for s in scores:
                builder.add("d", it, ("p1", "a", f"m{k}"), s, None)
        assert builder.finish().score.tolist() == [statistics.fmean(v) for v in values]


def test_an_item_or_a_judge_the_job_does_not_list_gets_cells_of_its_own() -> None:
    """An item missing from the expansion's lists, judged by a listed judge, and a judge met
    only while collecting (the grid widens from one column): each cell apart."""
    listed = _item("listed")
    expansion = types.SimpleNamespace(
        items={"d": [listed]}, job=types.SimpleNamespace(prompts=[types.SimpleNamespace(
            name="p", datasets=(), aspects=("a",))]),
        judges=lambda p: [types.SimpleNamespace(name="m")])
    builder = CellBuilder(expansion)  # type: ignore[arg-type]
    builder.add("d", _item("stray"), ("p", "a", "m"), 4.0, None)
    builder.add("d", listed, ("p", "a", "m"), 2.0, None)
    builder.add("d", _item("stray"), ("p", "a", "late"), 3.0, None)
    builder.add("d", listed, ("p", "a", "late"), 5.0, None)
    builder.add("d", listed, ("p", "a", "m"), 1.0, None)  # a second sample of a cell
    cells = builder.finish()
    assert _keys(cells) == [("d", "stray", "p", "a", "m"), ("d", "listed", "p", "a", "m"),
                            ("d", "stray", "p", "a", "late"), ("d", "listed", "p", "a", "late")]
    assert cells.score.tolist() == [4.0, 1.5, 3.0, 5.0]


def test_a_prompt_limited_to_data_sets_lists_its_judges_only_there() -> None:
    """Judge codes follow the job's listing per data set as each is met: a prompt with
    `datasets` is listed when its own data set opens, not another's."""
    prompts = [types.SimpleNamespace(name="only2", datasets=("d2",), aspects=("a",)),
               types.SimpleNamespace(name="all", datasets=(), aspects=("a", "b"))]
    one, two = _item("x", "d1"), _item("y", "d2")
    expansion = types.SimpleNamespace(items={"d1": [one], "d2": [two]},
                                      job=types.SimpleNamespace(prompts=prompts),
                                      judges=lambda p: [types.SimpleNamespace(name="m")])
    builder = CellBuilder(expansion)  # type: ignore[arg-type]
    builder.add("d1", one, ("all", "b", "m"), 3.0, None)
    builder.add("d2", two, ("only2", "a", "m"), 4.0, None)
    assert builder.finish().judges == [("all", "a", "m"), ("all", "b", "m"),
                                       ("only2", "a", "m")]


def test_failures_are_counted_by_type_and_an_unknown_type_not_at_all() -> None:
    it = _item("i")
    builder = CellBuilder(_expansion({"d": [it]}, ()))
    for failure in ("api", "parse", "api", "length", None):
        builder.add("d", it, ("p1", "a", "m1"), None, failure)
    cells = builder.finish()
    assert cells.failures.tolist() == [[1, 0, 2]] and not cells.scored.any()


def test_no_cells_are_empty_columns() -> None:
    cells = CellBuilder(_expansion({"d": [_item("i")]}, ())).finish()
    assert isinstance(cells, Cells) and len(cells) == 0 and _keys(cells) == []
    assert not hasattr(cells, "__dict__")  # slots
    for column in (cells.item, cells.judge, cells.score, cells.scored):
        assert column.shape == (0,)
    assert cells.failures.shape == (0, 3)


def test_grouped_keeps_first_appearance_past_a_radix_of_int16() -> None:
    """Up to 32,767 distinct keys rank in int16, more in int32; none is ([], [])."""
    assert grouped(np.zeros(0, dtype=np.int32), 4) == ([], [])
    keys = np.concatenate([np.arange(40_000)[::-1], [5, 39_999]])
    distinct, positions = grouped(keys, 40_000)
    assert distinct == list(range(40_000))[::-1]
    assert positions[0].tolist() == [0, 40_001] and positions[-6].tolist() == [39_994, 40_000]


@pytest.mark.parametrize("seed", range(4))
def test_sample_columns_give_the_self_consistency_tables_of_the_dicts(seed: int) -> None:
    """SampleScores (four columns) against the nested dicts Positions kept before: the same
    keys in the same order and the same samples x items tables, with items seen without a
    score (a judgment of n choices none of which scored), scores repeated in one sample (two
    orders) and non-integer scores."""
    from runner.reduce.samples import SampleScores

    rng = np.random.default_rng(seed)
    columns = SampleScores()
    dicts: dict[tuple[str, str, str], dict[str, dict[int, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for _ in range(400):
        key = (f"m{rng.integers(0, 3)}/p", f"d{rng.integers(0, 2)}", str(rng.choice(["a", "b"])))
        item_id = f"i{rng.integers(0, 25):02d}"
        if rng.random() < 0.1:  # seen, no score
            columns.touch(key, item_id)
            dicts[key][item_id]  # noqa: B018  # touched, as Positions.watch did
            continue
        sample = int(rng.integers(0, 4 if key[0] != "m2/p" else 1))
        score = float(rng.integers(1, 6)) if rng.random() < 0.6 else float(rng.random() * 5)
        columns.add(key, item_id, sample, score)
        dicts[key][item_id][sample].append(score)
    want = []
    for key, items in dicts.items():
        if max((len(s) for s in items.values()), default=0) < 2:
            continue
        ids = sorted(items)
        want.append((key, [[statistics.fmean(items[i][s]) if items[i].get(s) else None
                            for i in ids] for s in sorted({s for i in ids for s in items[i]})]))
    got = list(columns.tables())
    assert got == want and len(got) >= 2


def test_order_columns_give_each_group_s_orders_as_the_dicts_did() -> None:
    """OrderScores (four columns) against the dict per group of dicts per order of lists that
    Positions kept before: the same groups in the same order, each with its orders, members
    (seen even without a score) and scores."""
    from runner.reduce.orders import OrderScores

    rng = np.random.default_rng(7)
    columns = OrderScores()
    dicts: dict[tuple[str, str, str, str], dict[tuple[str, ...], dict[str, list[float]]]] = (
        defaultdict(dict))
    for _ in range(500):
        key = (f"m{rng.integers(0, 2)}/p", "d", str(rng.choice(["a", "b"])),
               f"g{rng.integers(0, 12)}")
        members = [f"{key[3]}-{k}" for k in range(3)]
        order = tuple(str(m) for m in rng.permutation(members)[:2])
        member = str(rng.choice(order))
        score = None if rng.random() < 0.2 else float(rng.integers(1, 11))
        columns.add(key, order, member, score)
        got = dicts[key].setdefault(order, {}).setdefault(member, [])
        if score is not None:
            got.append(score)
    assert list(columns.groups()) == list(dicts.items())
