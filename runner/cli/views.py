"""`judge view` (open report.html), `judge runs` (the kept runs of a job) and the figures of
`judge report --figures` (matplotlib, imported only then). Registered on the group in
runner.cli.main."""

from __future__ import annotations

import csv
import math
import webbrowser
from pathlib import Path
from typing import Any

import click
import orjson

from runner.cli.options import task_selection
from runner.errors import ConfigError
from runner.job.load import load_job
from runner.report.folder import HISTORY, forget_runs, kept_runs, own_bytes
from runner.selection import TaskSelection
from runner.session import job_path

__all__ = ["diff", "figures", "runs", "view"]


def figures(out_dir: Path, figures_dir: Path) -> int:
    """Write the key plots of a report as PNG and SVG for a paper.

    Args:
        out_dir: the report folder, whose report.html holds the plots' data.
        figures_dir: where the PNG and SVG files go (made if missing).

    Returns:
        How many figures were written.
    """
    # Only here: matplotlib costs a second to import, and runs never need it.
    from runner.report.figures import write_figures
    return len(write_figures(out_dir / "report.html", figures_dir))


def _folder(chosen: TaskSelection) -> Path:
    """The job's report folder: --out, else the job's output_dir."""
    return chosen.out if chosen.out else load_job(job_path(chosen.job_name())).output_dir


@click.command()
@task_selection(report_folder_only=True)
@click.argument("run", required=False)
@click.option("--print", "print_only", is_flag=True,
              help="Only print the report's path, e.g. `judge view openmeva --print`.")
def view(task_selection: TaskSelection, run: str | None, print_only: bool) -> None:
    """Open a run's report.html in a browser (the latest, or RUN from `judge runs`); print its
    path where there is no browser.

    \b
    Examples:
      judge view openmeva
      judge view openmeva 20261125T143015.123Z-a1b2c3
      judge view jobs/summeval.toml --out /tmp/runs/summeval --print
    """
    folder, job = _folder(task_selection), task_selection.job_name()
    if run is not None and run != "latest":  # latest: the folder's own set, the newest
        folder = _run_folder(folder, job, run)
    # absolute, not resolved: the folder's report.html is a link through `latest`, and its
    # path (not the run it points at now) is the one to keep
    page = (folder / "report.html").absolute()
    if not page.exists():
        raise ConfigError(f"{page}: no report yet; run `judge report {job}` (or `judge run "
                          f"{job}`) first")
    click.echo(str(page))
    if print_only:
        return
    try:
        opened = webbrowser.get().open(page.as_uri())
    except webbrowser.Error:
        opened = False
    if not opened:
        click.echo("no browser here: open the path above", err=True)


@click.command()
@task_selection(report_folder_only=True)
@click.option("--keep", type=click.IntRange(min=1), metavar="N",
              help="First remove every kept run but the N newest (their reports only: the "
                   "cache keeps every answer, so `judge rescore` rebuilds any of them), and "
                   "say how much space that freed.")
def runs(task_selection: TaskSelection, keep: int | None) -> None:
    """List the job's kept runs, oldest first: id, kind (run, or rebuild from the cache),
    models, tasks, calls, estimated cost, cached (the share of prompt tokens read from the
    provider's prompt cache), saved (by caching and batching, against list price), disk (what
    removing the run frees: its files no other name links), and the best LLM judge's
    correlation.

    Every `judge run`, `rescore`, `report` and `import` keeps its report set in
    runs/<job>/history/RUN; the folder's report files are links to the newest (`latest`),
    which --keep never removes. `judge view JOB RUN` opens one. Each run holds its own files:
    ~5 GB at ten million judgments.

    \b
    Examples:
      judge runs openmeva
      judge runs openmeva --keep 3
    """
    folder = _folder(task_selection)
    if keep is not None:
        removed, freed = forget_runs(folder, keep)
        click.echo(f"removed {len(removed)} kept run{'s' * (len(removed) != 1)}"
                   + (f" ({', '.join(removed)})" if removed else "")
                   + f"; freed {_size(freed)}", err=True)
    kept = kept_runs(folder)
    if not kept:
        raise ConfigError(f"{folder / HISTORY}: no kept runs yet; `judge run "
                          f"{task_selection.job_name()}` makes one")
    rows = [("run", "kind", "models", "tasks", "calls", "cost", "cached", "saved", "disk",
             "best correlation")]
    for path in kept:
        m = orjson.loads((path / "manifest.json").read_bytes())
        counts = m.get("counts", {})
        cost = m.get("estimated_cost_usd")
        rows.append((path.name, m.get("kind", "run"),
                     ",".join(x["name"] for x in m.get("models", [])),
                     str(counts.get("tasks", "")), str(counts.get("api_calls", "")),
                     "unknown" if cost is None else f"${cost:.4f}", *_saved(m.get("bill")),
                     _size(own_bytes(path)), _best(path)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _saved(bill: Any) -> tuple[str, str]:
    """The `cached` and `saved` columns of a manifest's bill (runner.job.providers.Bill): the
    share of prompt tokens read from a provider's prompt cache, and what caching and batching
    saved against list price ("unknown" without a price; "" in a manifest without a bill)."""
    if not isinstance(bill, dict):
        return "", ""
    tokens, saved = bill["tokens"], bill["saved_usd"]
    prompt = tokens["input"] + tokens["cached_input"] + tokens["cache_write"]
    share = f"{tokens['cached_input'] / prompt:.0%}" if prompt else "-"
    if saved["caching"] is None:
        return share, "unknown"
    return share, f"${saved['caching'] + saved['batching']:.4f}"


def _size(n: int) -> str:
    """`0B`, `512B`, `35kB`, `1.2GB`: bytes in decimal units, without a space (one column)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{n}B"


def _best(run: Path) -> str:
    """`fake/stars 0.472 n=40 (spearman, sample, openmeva/overall)`: the highest correlation
    among the ranked judges (runner.report.standing, the rule of the run's own table and
    report.html: enough answers parsed, enough groups) over all items at the first level,
    spearman where computed; "none ranked" if there are coefficients but none is ranked, ""
    without any."""
    from runner.report.standing import points, ranked  # numpy (correlate): not at start-up
    rows, summary = _read_csv(run / "correlations.csv"), _read_csv(run / "summary.csv")
    rows = [r for r in rows if "/" in r["judge"] and r["subset"] == "all" and r["value"]
            and math.isfinite(float(r["value"]))]
    if not rows:
        return ""
    # as the run's own result table (runner.report.headline): spearman, else the job's first
    methods = list(dict.fromkeys(r["method"] for r in rows))
    method = "spearman" if "spearman" in methods else methods[0]
    level = rows[0]["level"]
    eligible = {(d, a, judge) for (d, a, lv, m, _), judges in ranked(rows, summary).items()
                if lv == level and m == method for judge in judges}
    candidates = [r for r in rows if r["method"] == method and r["level"] == level
                  and (r["dataset"], r["aspect"], r["judge"]) in eligible]
    if not candidates:  # too few answers parsed, or too few groups, to say which is best
        return f"none ranked ({method}, {level})"
    top = max(candidates, key=lambda r: float(r["value"]))
    return (f"{top['judge']} {float(top['value']):.3f} n={points(top)} ({method}, {level}, "
            f"{top['dataset']}/{top['aspect']})")


def _read_csv(path: Path) -> list[dict[str, str]]:
    """A kept run's CSV report as rows ([] when the run has none)."""
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@click.command()
@task_selection(report_folder_only=True)
@click.argument("run_a")
@click.argument("run_b")
def diff(task_selection: TaskSelection, run_a: str, run_b: str) -> None:
    """What changed between two kept runs (RUN_A, RUN_B from `judge runs`; `latest` for the
    newest): each judge's correlation with the human scores in both, the change (B - A) with
    its 95% CI and p-value from a paired bootstrap over the groups both scored. Writes
    diff.csv beside the reports.

    \b
    A judge is paired with the same judge in the other run (a prompt or parser changed under
    one name), or, where each run has one judge, with that one. Example:
      judge diff openmeva 20261125T101500.000Z-1a2b3c latest
    """
    from runner.report.diff import DIFF_COLUMNS, diff_runs, read_scores  # numpy: only here
    from runner.report.folder import write_atomic
    from runner.report.reliability import csv_bytes
    from runner.report.standing import MIN_PARSED_SHARE, parsed_counts
    job = task_selection.job_name()
    loaded = load_job(job_path(job))
    folder = task_selection.out or loaded.output_dir
    series = [read_scores(_run_folder(folder, job, run)) for run in (run_a, run_b)]
    rows = diff_runs(*series, policy=loaded.policy, levels=loaded.levels,
                     methods=loaded.methods, n_boot=loaded.bootstrap, seed=loaded.seed)
    if not rows:
        raise ConfigError(f"{run_a} and {run_b}: no data set and aspect with a judge in both "
                          "to pair (the same judge name, or one judge in each)")
    write_atomic(folder / "diff.csv", csv_bytes(DIFF_COLUMNS, rows))
    method = "spearman" if "spearman" in loaded.methods else loaded.methods[0]
    click.echo(f"{run_a} -> {run_b} ({method}; change = B - A, 95% CI, paired bootstrap; "
               "n = groups both runs scored):")
    parsed = [parsed_counts(_read_csv(_run_folder(folder, job, run) / "summary.csv"))
              for run in (run_a, run_b)]
    for line in _diff_lines([r for r in rows if r["method"] == method], *parsed,
                            least=MIN_PARSED_SHARE):
        click.echo(line)
    click.echo(f"all methods and levels: {folder / 'diff.csv'}", err=True)


Parsed = dict[tuple[str, str, str], tuple[int, int]]


def _diff_lines(rows: list[dict[str, Any]], parsed_a: Parsed, parsed_b: Parsed, *,
                least: float) -> list[str]:
    """One line per diff row with its n; a line per data set and aspect the two runs share no
    group of (every value n/a: other items, e.g. another --sample or --limit); and a note on
    a judge that parsed fewer than `least` of its answers in both runs (the share below which
    runner.report.standing does not rank a judge)."""
    lines, shared = [], {(r["dataset"], r["aspect"]) for r in rows if r["n_groups"]}
    for r in rows:
        where = (r["dataset"], r["aspect"])
        few = [f"{s} of {n}" for s, n in (parsed_a.get((*where, r["judge_a"]), (0, 0)),
                                          parsed_b.get((*where, r["judge_b"]), (0, 0)))
               if n and s < least * n]
        lines.append(f"  {r['dataset']} / {r['aspect']}  {r['judge_a']} -> {r['judge_b']}  "
                     f"{r['level']}: {_num(r['value_a'])} -> {_num(r['value_b'])}  "
                     f"{_num(r['change'], sign=True)} [{_num(r['ci_low'])}, "
                     f"{_num(r['ci_high'])}]  p={_num(r['p_value'])}  n={r['n_groups']}"
                     + (f"  (few answers parsed in both runs: {few[0]}, {few[1]})"
                        if len(few) == 2 else ""))
    for dataset, aspect in dict.fromkeys((r["dataset"], r["aspect"]) for r in rows):
        if (dataset, aspect) not in shared:
            lines.append(f"  {dataset} / {aspect}: the two runs share no scored group (other "
                         "items: another --sample, --limit or data file): nothing to compare")
    return lines


def _run_folder(folder: Path, job: str, run: str) -> Path:
    """The folder of the kept run RUN (`latest`: the newest) of the report folder `folder`."""
    path = folder / "latest" if run == "latest" else folder / HISTORY / run
    if not (path / "manifest.json").is_file():
        raise ConfigError(f"{path}: no such run; `judge runs {job}` lists them")
    return path


def _num(value: float | None, sign: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.3f}" if sign else f"{value:.3f}"
