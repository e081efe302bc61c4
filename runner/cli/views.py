"""`judge view` (open report.html), `judge runs` (the kept runs of a job) and the figures of
`judge report --figures` (matplotlib, imported only then). Registered on the group in
runner.cli.main."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click

from runner.api import load_job
from runner.cli.options import task_selection
from runner.errors import ConfigError
from runner.report.folder import HISTORY, forget_runs, kept_runs, write_atomic
from runner.selection import TaskSelection

__all__ = ["diff", "figures", "runs", "view"]


def figures(out_dir: Path, figures_dir: Path) -> int:
    """Write the key plots of a report as PNG and SVG for a paper.

    Args:
        out_dir: the report folder, whose report.html holds the plots' data.
        figures_dir: where the PNG and SVG files go (made if missing).

    Returns:
        How many figures were written.
    """
    # Only here: matplotlib, and runs never need it.
    from runner.report.figures import write_figures  # 0.38 s after runner.cli.main
    return len(write_figures(out_dir / "report.html", figures_dir))


def _folder(chosen: TaskSelection) -> Path:
    """The job's report folder: --out, else the job's output_dir."""
    return chosen.out if chosen.out else load_job(chosen.job_name()).output_dir


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
    from runner.report.kept import RUN_COLUMNS, run_row, size  # numpy: 0.13 s at start-up
    folder = _folder(task_selection)
    if keep is not None:
        removed, freed = forget_runs(folder, keep)
        click.echo(f"removed {len(removed)} kept run{'s' * (len(removed) != 1)}"
                   + (f" ({', '.join(removed)})" if removed else "")
                   + f"; freed {size(freed)}", err=True)
    kept = kept_runs(folder)
    if not kept:
        raise ConfigError(f"{folder / HISTORY}: no kept runs yet; `judge run "
                          f"{task_selection.job_name()}` makes one")
    rows = [RUN_COLUMNS, *(run_row(path) for path in kept)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


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
    from runner.report.diff import DIFF_COLUMNS, diff_folders  # 0.08 s at start-up
    from runner.report.reliability import csv_bytes  # numpy: 0.13 s at start-up
    job = task_selection.job_name()
    loaded = load_job(job)
    folder = task_selection.out or loaded.output_dir
    compared = diff_folders(_run_folder(folder, job, run_a), _run_folder(folder, job, run_b),
                            loaded)
    if not compared.rows:
        raise ConfigError(f"{run_a} and {run_b}: no data set and aspect with a judge in both "
                          "to pair (the same judge name, or one judge in each)")
    write_atomic(folder / "diff.csv", csv_bytes(DIFF_COLUMNS, compared.rows))
    click.echo(f"{run_a} -> {run_b} ({compared.method}; change = B - A, 95% CI, paired "
               "bootstrap; n = groups both runs scored):")
    for line in compared.lines:
        click.echo(line)
    click.echo(f"all methods and levels: {folder / 'diff.csv'}", err=True)


def _run_folder(folder: Path, job: str, run: str) -> Path:
    """The folder of the kept run RUN (`latest`: the newest) of the report folder `folder`."""
    path = folder / "latest" if run == "latest" else folder / HISTORY / run
    if not (path / "manifest.json").is_file():
        raise ConfigError(f"{path}: no such run; `judge runs {job}` lists them")
    return path

