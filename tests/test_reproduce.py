"""The published correlations, reproduced from the recorded scores (no API call).

* Wang et al. 2023 (arXiv 2303.04048), OpenMEVA: ChatGPT stars vs human, sample level,
  groups with a constant side skipped.
* Lai et al. 2023 (arXiv 2304.13462), formality transfer, content preservation against the
  source: BLEU and ChatGPT vs the mean of the two annotators, nine systems (the human
  reference counts as one), constant groups counted as 0, values x100.
"""

from __future__ import annotations

import os
import timeit
from pathlib import Path

import pytest

from runner.data import datasets
from runner.reduce.correlate import Correlation, Row, correlate

DATA_DIR = Path(os.environ.get("JUDGE_DATA_DIR")
                or Path(__file__).resolve().parents[2] / "shared" / "datasets")
I2F, F2I = "informal->formal", "formal->informal"


@pytest.fixture(scope="module")
def items() -> dict[str, list[datasets.Item]]:
    if not DATA_DIR.is_dir():
        pytest.fail(f"benchmark data not found at {DATA_DIR}: set JUDGE_DATA_DIR")
    return {name: list(datasets.load(name, DATA_DIR)) for name in ("openmeva", "tst_formality")}


def rows(items: list[datasets.Item], aspect: str, metric: str) -> list[Row]:
    return [Row(group=it.group, system=it.system, subset=it.subset,
                judge=(it.metrics.get(aspect) or it.metrics["*"])[metric], human=it.human[aspect])
            for it in items]


def table(result: list[Correlation], scale: float, digits: int) -> dict[tuple[str, ...], float]:
    return {(c.level, c.method, c.subset): round(scale * c.value, digits)
            for c in result if c.value is not None}


def test_openmeva_chatgpt_sample_level(items: dict[str, list[datasets.Item]]) -> None:
    data = rows(items["openmeva"], "overall", "chatgpt")
    assert len(data) == 1000
    got = table(correlate(data, policy="skip", levels=("sample",), n_boot=0), 1, 3)
    assert got == {("sample", "spearman", "all"): 0.472, ("sample", "pearson", "all"): 0.490,
                   ("sample", "kendall", "all"): 0.427}


LAI = {  # Lai et al. 2023, content preservation (source), x100
    "bleu": {("system", "pairwise_accuracy", I2F): 47.2, ("system", "pairwise_accuracy", F2I): 69.4,
             ("sample", "kendall", I2F): 24.4, ("sample", "kendall", F2I): 39.2,
             ("sample", "kendall", "all"): 31.8,
             ("dataset", "kendall", I2F): 17.0, ("dataset", "kendall", F2I): 32.8,
             ("dataset", "kendall", "all"): 24.8},
    "chatgpt": {("system", "pairwise_accuracy", I2F): 80.6,
                ("system", "pairwise_accuracy", F2I): 94.4,
                ("system", "pairwise_accuracy", "all"): 87.5,
                ("sample", "kendall", I2F): 46.8, ("sample", "kendall", F2I): 64.9,
                ("sample", "kendall", "all"): 55.9,
                ("dataset", "kendall", I2F): 48.3, ("dataset", "kendall", F2I): 60.6,
                ("dataset", "kendall", "all"): 54.3},
}


@pytest.mark.parametrize("metric", sorted(LAI))
def test_formality_content_preservation(items: dict[str, list[datasets.Item]],
                                        metric: str) -> None:
    data = rows(items["tst_formality"], "content", metric)
    assert len(data) == 80 * 9 and len({r.system for r in data}) == 9  # "ref" is a system
    result = correlate(data, policy="zero", methods=("kendall",), n_boot=0)
    got = table(result, 100, 1)
    assert {k: got[k] for k in LAI[metric]} == LAI[metric]
    counts = {(c.level, c.subset): (c.n_groups, c.n_items) for c in result}
    assert counts["sample", I2F] == counts["dataset", F2I] == (40, 360)
    assert counts["sample", "all"] == (80, 720)


def test_openmeva_bootstrap_is_fast(items: dict[str, list[datasets.Item]]) -> None:
    data = rows(items["openmeva"], "overall", "chatgpt")
    seconds = min(timeit.repeat(lambda: correlate(data, n_boot=1000), number=1, repeat=3))
    assert seconds < 3.0  # about 0.1 s on an idle laptop core
