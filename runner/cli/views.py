"""`judge report` (rebuild every report from the cache, optionally with figures for a paper)
and `judge view` (open report.html). Registered on the group in runner.cli.main."""

from __future__ import annotations

import os
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any

import click

from runner.cli.session import Selection, manifest, select
from runner.errors import ConfigError
from runner.execute.cache import Cache
from runner.execute.pool import RunStats
from runner.job.load import load_job
from runner.reduce.judgments import judge
from runner.report.write import Tables, write_reports

__all__ = ["report", "view"]

_DEFAULT_DATA_DIR = Path.home() / ".cache" / "judge-runner" / "data"


def _job_path(job: str) -> Path:
    path = Path(job)
    if path.suffix == ".toml" or path.exists():
        return path
    named = Path("jobs") / f"{job}.toml"
    if not named.exists():
        raise ConfigError(f"{job}: no such job file, and no jobs/{job}.toml; pass a path or a "
                          "name under jobs/")
    return named


def _select(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
            cache_dir: str | None, out: str | None) -> Selection:
    return select(_job_path(job), models=models, base_url=base_url, limit=limit,
                  cache_dir=Path(cache_dir or os.environ.get("JUDGE_CACHE_DIR") or "cache"),
                  out=Path(out) if out else None,
                  data_dir=Path(os.environ.get("JUDGE_DATA_DIR") or _DEFAULT_DATA_DIR),
                  env_base_url=os.environ.get("OPENAI_BASE_URL"))


@click.command()
@click.argument("job")
@click.option("--model", "models", multiple=True, metavar="SPEC",
              help="Judge model, replacing the job's (as for `judge run`). Repeatable.")
@click.option("--base-url", help="The endpoint the run used for bare model names, e.g. "
                                 "http://127.0.0.1:8000/v1 [env OPENAI_BASE_URL]: it is part "
                                 "of the cache key, nothing is called.")
@click.option("--limit", type=click.IntRange(min=1),
              help="Only the first N items of each data set, in file order.")
@click.option("--cache-dir", help="Response cache folder [env JUDGE_CACHE_DIR; default ./cache].")
@click.option("--out", help="Report folder [default: the job's output_dir, runs/<job>].")
@click.option("--figures", "figures_dir", metavar="DIR",
              help="Also write the key plots as PNG and SVG for a paper into DIR, e.g. "
                   "--figures runs/openmeva/figures.")
def report(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
           cache_dir: str | None, out: str | None, figures_dir: str | None) -> None:
    """Rebuild every report, report.html included, from the cache alone (no call).

    \b
    Examples:
      judge report openmeva                       rewrite runs/openmeva/ (report.html, CSVs)
      judge report openmeva --figures figs/       ... and figs/*.png, figs/*.svg for a paper
    Takes the same --model/--limit as the run that filled the cache.
    """
    started = time.time()
    sel = _select(job, models, base_url, limit, cache_dir, out)
    stats, command = RunStats(), " ".join(["judge", *sys.argv[1:]])

    def counted(tables: Tables) -> dict[str, Any]:
        stats.total, stats.missing = tables.tasks, tables.missing
        stats.cache_hits = tables.tasks - len(tables.missing)
        return manifest(sel, stats, started, command)

    with Cache(sel.cache_dir) as cache:
        write_reports(sel.out_dir, sel.expansion, judge(sel.expansion, cache), counted)
    click.echo(f"{stats.total} tasks, {stats.cache_hits} cached, {len(stats.missing)} without "
               f"an answer; report: {sel.out_dir / 'report.html'}", err=True)
    if figures_dir:
        # Only here: matplotlib costs a second to import, and runs never need it.
        from runner.report.figures import write_figures
        written = write_figures(sel.out_dir / "report.html", Path(figures_dir))
        click.echo(f"{len(written)} figures in {figures_dir}/ (PNG and SVG)", err=True)


@click.command()
@click.argument("job")
@click.option("--out", help="Report folder [default: the job's output_dir, runs/<job>].")
@click.option("--print", "print_only", is_flag=True,
              help="Only print the report's path, e.g. `judge view openmeva --print`.")
def view(job: str, out: str | None, print_only: bool) -> None:
    """Open runs/<job>/report.html in a browser; print its path where there is none.

    \b
    Examples:
      judge view openmeva
      judge view jobs/summeval.toml --out /tmp/runs/summeval --print
    """
    folder = Path(out) if out else load_job(_job_path(job)).output_dir
    page = (folder / "report.html").resolve()
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
