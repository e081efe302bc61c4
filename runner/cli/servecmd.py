"""`judge serve`: the study desk (runner.serve) over a folder of runs, until Ctrl-C."""

from __future__ import annotations

import os
from pathlib import Path

import click

from runner.api import run_async
from runner.cli.options import data_dir
from runner.errors import ConfigError

__all__ = ["serve"]


@click.command()
@click.argument("folder", type=click.Path(path_type=Path), default=Path("runs"))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Any other than 127.0.0.1, localhost or ::1 (e.g. 0.0.0.0 "
                   "to reach the desk from another machine) needs a random token, printed in "
                   "the URL.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to bind (0: any free one).")
@click.option("--annotator", metavar="NAME",
              help="Rate items as NAME on the rating page (/rate): the job's aspects on the "
                   "scales its prompts declare, no judge's score shown, skip allowed. Each "
                   "rating is appended to the ratings file the job's human field declares "
                   "for its aspect (judge init's ratings.jsonl), else beside the data file, "
                   "<data file stem>.ratings.jsonl (for a registered data set, beside the job "
                   "file, <job stem>.<data set>.ratings.jsonl). The queue takes whole groups "
                   "in the order of the latest run's --sample draw.")
@click.option("--show-scores", is_flag=True,
              help="Show the judges' scores of the item being rated (the job's latest run) on "
                   "the rating page; without it rating is blind.")
def serve(folder: Path, host: str, port: int, annotator: str | None,
          show_scores: bool) -> None:
    """Serve the study desk over FOLDER (default runs/, or one job's report folder): every job
    and its kept runs, each run's report, two runs side by side with `judge diff`'s figures,
    the item browser across runs (filters; the request and answer of any judgment), a run in
    progress with its counts, ETA and correlations so far, and with --annotator a rating
    page. Reads the runs and the cache, never writes them. Run it from the folder the runs
    were made in (their job files are found from there) [env JUDGE_DATA_DIR].

    \b
    Examples:
      judge serve
      judge serve runs/openmeva --annotator alice
      judge serve --host 0.0.0.0 --port 8080
    """
    # here: aiohttp's server and numpy (the diff's bootstrap) are not needed at start-up
    from runner.serve import Desk, make_app, new_token  # 0.37 s after runner.cli.main
    from runner.serve import serve as serve_app  # (the same module)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder; give a folder of runs (runs/) or a job's "
                          "report folder")
    if annotator is not None and not annotator.strip():
        raise ConfigError("--annotator: give a name (it is recorded with every rating)")
    if show_scores and annotator is None:
        raise ConfigError("--show-scores shows scores on the rating page: give --annotator NAME "
                          "too")
    desk = Desk(folder, data_dir(), annotator=annotator and annotator.strip(),
                show_scores=show_scores, environ=dict(os.environ))
    token = new_token(host)
    app = make_app(desk, token)
    try:
        run_async(serve_app(app, host, port, lambda url: click.echo(
            f"judge desk on {url} (Ctrl-C to stop)")))
    except OSError as exc:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there "
                          f"({exc.strerror or exc}); pick another --port") from None
