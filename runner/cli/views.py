"""`judge view` (open report.html) and the figures of `judge report --figures` (matplotlib,
imported only then). Registered on the group in runner.cli.main."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click

from runner.cli.session import job_path
from runner.errors import ConfigError
from runner.job.load import load_job

__all__ = ["figures", "view"]


def figures(out_dir: Path, figures_dir: Path) -> int:
    """Write the key plots of out_dir/report.html as PNG and SVG into figures_dir; how many."""
    # Only here: matplotlib costs a second to import, and runs never need it.
    from runner.report.figures import write_figures
    return len(write_figures(out_dir / "report.html", figures_dir))


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
    folder = Path(out) if out else load_job(job_path(job)).output_dir
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
