"""The study commands, from the cache alone (no network): rescore, report, plan, status,
compare, and import (a study's recorded answers into the cache). Registered on the group in
runner/cli/main.py.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from runner import api
from runner.api import ModelPlan
from runner.cli import views
from runner.cli.options import PARTIAL_HELP, resolve, task_selection
from runner.cli.outcome import rebuild_reports
from runner.errors import ConfigError
from runner.execute.imports import import_answers
from runner.execute.store.backend import cached_flags
from runner.job.providers import row
from runner.reduce.judgments import judge
from runner.selection import TaskSelection
from runner.tasks import task_key

if TYPE_CHECKING:
    from runner.reduce.series import Series

__all__ = ["compare", "import_", "plan", "report", "rescore", "status"]


@click.command()
@task_selection()
@click.option("--partial", is_flag=True, help=PARTIAL_HELP)
def rescore(task_selection: TaskSelection, partial: bool) -> None:
    """Re-parse every cached answer with the current parsers and rewrite every report.

    Never opens a network connection: change a parser, rescore, get new numbers in seconds.
    Exit 0 when every task has an answer, 1 when some failed or have none (unless --partial).
    """
    rebuild_reports(resolve(task_selection), time.time(), partial=partial)


@click.command()
@task_selection()
@click.option("--figures", "figures_dir", metavar="DIR",
              help="Also write the key plots as PNG and SVG for a paper into DIR, e.g. "
                   "--figures runs/openmeva/figures.")
@click.option("--partial", is_flag=True, help=PARTIAL_HELP)
def report(task_selection: TaskSelection, figures_dir: str | None, partial: bool) -> None:
    """Rebuild every report, report.html included, from the cache alone (no call).

    \b
    Examples:
      judge report openmeva                       rewrite runs/openmeva/ (report.html, CSVs)
      judge report openmeva --figures figs/       ... and figs/*.png, figs/*.svg for a paper
    Takes the same --model/--limit (and --cache) as the run that filled the cache.
    """
    started = time.time()
    sel = resolve(task_selection)

    def figures() -> None:
        click.echo(f"report: {sel.out_dir / 'report.html'}", err=True)
        if figures_dir:
            count = views.figures(sel.out_dir, Path(figures_dir))
            click.echo(f"{count} figures in {figures_dir}/ (PNG and SVG)", err=True)

    rebuild_reports(sel, started, figures, partial)


@click.command()
@task_selection()
@click.option("--power", nargs=2, metavar="A B",
              help="Sample-size planning from this (pilot) run's cache: items needed to "
                   "separate judges A and B, e.g. --power fake/stars fake/geval --width 0.1. "
                   "Writes power.csv.")
@click.option("--width", type=click.FloatRange(min=0, min_open=True), default=0.1,
              show_default=True, help="With --power: the wanted width of the 95% CI of the "
                                      "difference of the two correlations.")
def plan(task_selection: TaskSelection, power: tuple[str, str] | None, width: float) -> None:
    """Show tasks, cache hits, calls to make, estimated tokens and cost. No network.

    Costs come from the provider table's list prices (USD per 1M tokens) or the job's
    `price = {...}`, three ways: online, online with the provider's prompt caching (a
    prompt's static prefix billed at the cached-input price after its first request, where
    the prefix reaches the provider's minimum; prompts under it are named), and batch.
    Tokens are estimated at 4 characters a token (no tokenizer download); completion tokens
    are counted at max_tokens x n, an upper bound.

    With --power A B (e.g. `judge plan openmeva --power fake/stars fake/geval --width 0.1`),
    plan instead reads the cached pilot run and prints, per data set, aspect and method, how
    many items a study needs for a 95% CI of corr(A) - corr(B) that wide, and for one that
    excludes 0 at the pilot's difference (bootstrap over the pilot's items).
    """
    if power:
        _plan_power(resolve(task_selection), power, width)
        return
    sel = resolve(task_selection, stream=True)
    plans = api.plan(sel)
    echo = click.echo
    echo(f"job {sel.job.name}: {sum(len(v) for v in sel.expansion.items.values())} items, "
         f"{len(sel.job.prompts)} prompts, {len(sel.job.models)} models")
    for p in plans:
        echo(f"  {p.model.name} ({p.model.spec}): {p.tasks} tasks, {p.cached} cached, "
             f"{p.repeats} repeat an earlier request, {p.calls} to call, ~{p.prompt_tokens} "
             f"prompt + <={p.completion_tokens} completion tokens, "
             f"{_three_ways([p]) if p.cost is not None else 'price unknown: set price in the job'}")
        for prompt, aspect, tokens in p.bill.short():
            echo(f"    {prompt} ({aspect}): too short to be cached (static prefix ~{tokens} "
                 f"tokens, under {p.model.kind}'s minimum of {p.bill.minimum})")
    echo("total: " + ("unknown cost" if any(p.cost is None for p in plans) else
                      _three_ways(plans)))
    if sel.missing_answers:
        echo(f"{sel.missing_answers} generated answers are not cached yet: the judge tasks over "
             "them are not counted until `judge run` has generated them")


def _three_ways(plans: list[ModelPlan]) -> str:
    """`~$X online, prompt caching ~$Y, batch ~$Z` of priced plans (local: just `~$0`;
    a kind the runner cannot batch counts at its online price in the batch figure)."""
    ways = [sum(p.bill.cost(way if way != "batch" or row(p.model.kind).batch else "online")
                or 0.0 for p in plans) for way in ("online", "caching", "batch")]
    if all(p.model.kind == "local" for p in plans):
        return f"~${ways[0]:.4f}"
    batch = f"batch ~${ways[2]:.4f}" if any(row(p.model.kind).batch for p in plans) else \
        f"no batch for {plans[0].model.kind}"
    return f"~${ways[0]:.4f} online, prompt caching ~${ways[1]:.4f}, {batch}"


def _plan_power(sel: api.WorkingSet, judges: tuple[str, str], width: float) -> None:
    """judge plan --power: power.csv and its table, from the cached pilot."""
    # numpy: report.reliability 0.31 s, report.significance 0.14 s and report.write 0.42 s to
    # import, `plan` without --power pays none
    from runner.report.reliability import csv_bytes
    from runner.report.significance import POWER_COLUMNS, power_lines, power_rows
    from runner.report.write import write_atomic
    by_data = _judge_rows(sel)
    for name in judges:
        if not any(name in judges_there for judges_there in by_data.values()):
            found = sorted({j for d in by_data.values() for j in d})
            raise ConfigError(f"{sel.job.path}: --power names no judge {name!r}; judges in "
                              f"the cache: {', '.join(found) or 'none (run the pilot first)'}")
    methods = [m for m in ("pearson", "spearman") if m in sel.job.methods] or ["pearson"]
    rows = power_rows(by_data, judges, width=width, methods=methods, seed=sel.job.seed)
    write_atomic(sel.out_dir / "power.csv", csv_bytes(POWER_COLUMNS, rows))
    for line in power_lines(rows, judges, width):
        click.echo(line)


def _judge_rows(sel: api.WorkingSet) -> dict[tuple[str, str], dict[str, Series]]:
    """report.write.judge_rows of the selection, judged from the cache."""
    from runner.report.write import collect, judge_rows  # numpy: see _plan_power
    with api.open_selected(sel, read_only=True) as c:
        tables = collect(sel.expansion, judge(sel.expansion, c), io.BytesIO(),
                         sel.expansion.job.juries)
    return judge_rows(sel.expansion, tables)


@click.command()
@task_selection()
def status(task_selection: TaskSelection) -> None:
    """How far a job is: tasks cached now, and the last run's manifest counts. No network."""
    sel = resolve(task_selection, stream=True)
    with api.open_selected(sel, read_only=True) as cache:
        total = cached = 0
        for _, hit in cached_flags(cache, api.all_tasks(sel.expansion), task_key):
            total += 1
            cached += hit
    click.echo(f"job {sel.job.name}: {cached}/{total} tasks cached, {total - cached} to call")
    manifest = sel.out_dir / "manifest.json"
    if manifest.exists():
        data = orjson.loads(manifest.read_bytes())
        counts = ", ".join(f"{k} {v}" for k, v in data.get("counts", {}).items())
        click.echo(f"last run {data.get('ended')}: {counts}")
    else:
        click.echo(f"no run yet ({manifest} does not exist)")


@click.command()
@task_selection()
@click.option("--judges", nargs=2, required=True, metavar="A B",
              help="Two judges as named in correlations.csv: `model/prompt` for LLM judges, or "
                   "a metric column such as rouge1-f.")
@click.option("--permutations", type=click.IntRange(min=0), default=0, metavar="N",
              help="Also a paired permutation test with N permutations at dataset level, "
                   "e.g. --permutations 10000 (column permutation_p).")
def compare(task_selection: TaskSelection, judges: tuple[str, str], permutations: int) -> None:
    """Paired bootstrap test of the difference between two judges' correlations with humans.

    Both judges are scored on the same resampled groups (sample and dataset level), from the
    cache only (no network). Writes compare.csv next to the reports and prints the table:
    diff = A - B with its 95% CI and a two-sided p-value. At dataset level, also Williams'
    test of the two dependent correlations with the human (williams_t, williams_p, two-sided)
    and, with --permutations N, a paired permutation test (permutation_p), e.g.
    `judge compare tst-formality --judges gpt35/single gpt35/multi --permutations 10000`.
    """
    # numpy, 0.31 s + 0.14 s + 0.42 s to import: only `judge compare` pays them
    from runner.report.reliability import csv_bytes
    from runner.report.significance import SIGNIFICANCE_COLUMNS, significance
    from runner.report.write import COMPARE_COLUMNS, comparison, write_atomic
    sel = resolve(task_selection)
    series = _judge_rows(sel)
    rows = significance(comparison(sel.expansion, series, judges), series, judges,
                        permutations=permutations, seed=sel.job.seed)
    write_atomic(sel.out_dir / "compare.csv",
                 csv_bytes([*COMPARE_COLUMNS, *SIGNIFICANCE_COLUMNS], rows))
    shown = ["dataset", "aspect", "level", "method", "subset", "value_a", "value_b", "diff",
             "ci_low", "ci_high", "p_value"]
    shown += ["williams_p", *(["permutation_p"] if permutations else [])]
    click.echo(f"A = {judges[0]}, B = {judges[1]}")
    click.echo(" ".join(f"{c:>9}" for c in shown))
    for r in rows:
        click.echo(" ".join(f"{r[c]:>9.3f}" if isinstance(r[c], float) else f"{r[c]!s:>9}"
                            for c in shown))


@click.command("import")
@task_selection()
@click.option("--force", is_flag=True, help="Overwrite answers already in the cache.")
def import_(task_selection: TaskSelection, force: bool) -> None:
    """Store a study's recorded judge answers ([[imports]] in the job) in the cache.

    Each answer is stored under the exact request the job would send, marked as imported
    with its source; then the reports are rebuilt from the cache (as `judge rescore`), so the
    real parsers and reducer run over the study's own answers. No network.
    """
    started = time.time()
    sel = resolve(task_selection)
    with api.open_selected(sel) as c:
        counts = import_answers(sel.expansion, c, force=force)
    click.echo(f"imported {counts.stored} answers ({counts.already_cached} already cached, "
               f"{counts.without_answer} tasks without a recorded answer)", err=True)
    # partial: a study's recorded answers rarely cover every task
    rebuild_reports(sel, started, partial=True)
