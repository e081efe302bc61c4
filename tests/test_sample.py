"""--sample N --seed S: a pilot study's items drawn at random, whole groups at a time, the same
draw on every command."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from runner.api import selection
from runner.data.datasets import Item
from runner.prepare import sample_ids
from tests.fakeserver import ThreadedServer
from tests.test_cli import ROOT, clean_env, error_line, run_judge


def _items(groups: int, size: int) -> list[Item]:
    return [Item(dataset="d", item_id=f"{g}:{i}", group=f"g{g}" if size > 1 else "", system="s",
                 subset="", fields={}, human={}, annotators={}, metrics={}, extra={})
            for g in range(groups) for i in range(size)]


def test_a_draw_takes_whole_groups_until_n_items() -> None:
    items = _items(10, 4)
    drawn = sample_ids(items, 10, seed=1)
    groups = {i.split(":")[0] for i in drawn}
    assert len(drawn) == 12 and len(groups) == 3  # three whole groups of four
    assert all(f"{g}:{k}" in drawn for g in groups for k in range(4))
    assert sample_ids(items, 10, seed=1) == drawn  # the same draw every time
    assert sample_ids(items, 10, seed=2) != drawn
    assert sample_ids(items, 100, seed=1) == {i.item_id for i in items}


def test_items_without_groups_are_drawn_one_by_one() -> None:
    items = _items(30, 1)
    drawn = sample_ids(items, 7, seed=0)
    assert len(drawn) == 7 and drawn < {i.item_id for i in items}
    assert drawn != {i.item_id for i in items[:7]}  # not the first seven


def test_the_seed_chooses_the_draw(data_dir: Path) -> None:
    """Through runner.api.selection, as every command selects: one seed draws the same items
    twice, another seed other items, no seed the seed 0."""
    def drawn(seed: int | None) -> set[str]:
        sel = selection(ROOT / "jobs" / "summeval.toml", models=("fake",),
                        base_url="http://127.0.0.1:9/v1", sample=20, seed=seed,
                        data_dir=data_dir, environ={})
        assert sel.task_selection.seed == (seed or 0)
        return {i.item_id for items in sel.expansion.items.values() for i in items}

    assert len(drawn(3)) == 32 and drawn(3) == drawn(3) != drawn(4)
    assert drawn(None) == drawn(0) != drawn(3)


@pytest.mark.slow
def test_every_command_sees_the_same_sample(server: ThreadedServer, tmp_path: Path,
                                            data_dir: Path) -> None:
    job = ROOT / "jobs" / "summeval.toml"
    common = ("--model", "fake", "--base-url", server.url, "--sample", 20, "--seed", 3,
              "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")
    env = clean_env(data_dir)
    run = run_judge("run", job, *common, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    calls = server.state.requests
    rescore = run_judge("rescore", job, *common, env=env, cwd=tmp_path)
    assert rescore.returncode == 0, rescore.stderr  # every sampled task is cached
    assert server.state.requests == calls
    with (tmp_path / "out" / "scores.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    groups = {r["group"] for r in rows}
    assert len(groups) == 2 and len({r["item_id"] for r in rows}) == 32  # 2 documents x 16

    both = run_judge("plan", job, *common, "--limit", 5, env=env, cwd=tmp_path)
    assert both.returncode == 2
    assert error_line(both.stderr) == "Error: --limit and --sample choose the items two ways; " \
                                      "give one"
