"""`judge ratings export|import`: a ratings file to and from Label Studio's JSON
(runner.data.labelstudio). Registered on the group in runner.cli.main."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from runner.api import job_path
from runner.cli.options import data_dir
from runner.data.annotations import append_ratings, read_ratings
from runner.data.labelstudio import from_label_studio, to_label_studio
from runner.errors import DataError
from runner.job.load import load_job
from runner.prepare import prepare

__all__ = ["ratings"]

_FORMAT = click.option("--format", "fmt", type=click.Choice(["label-studio"]),
                       default="label-studio", show_default=True,
                       help="Label Studio's JSON: a list of tasks with their annotations.")


@click.group()
def ratings() -> None:
    """Move a ratings file (`judge serve --annotator NAME` appends to it) to and from Label
    Studio."""


@ratings.command("export")
@click.argument("ratings_file", type=click.Path(path_type=Path, dir_okay=False))
@_FORMAT
@click.option("--job", "job_file",
              help="Put each item's text fields (from this job's data) in its task, for Label "
                   "Studio to show.")
@click.option("--out", "out", type=click.Path(path_type=Path, dir_okay=False),
              help="Write here [default: standard output].")
def export(ratings_file: Path, fmt: str, job_file: str | None, out: Path | None) -> None:
    """Write RATINGS_FILE's latest ratings as Label Studio tasks (one per rated item).

    \b
    Examples:
      judge ratings export ratings.jsonl --out tasks.json
      judge ratings export ratings.jsonl --job outputs.toml --out tasks.json
    """
    fields = None
    if job_file is not None:  # only its items' text: not a task selection
        expansion = prepare(load_job(job_path(job_file)), data_dir())
        fields = {it.item_id: dict(it.fields) for items in expansion.items.values()
                  for it in items}
    text = orjson.dumps(to_label_studio(read_ratings(ratings_file), fields),
                        option=orjson.OPT_INDENT_2) + b"\n"
    if out is None:
        click.echo(text.decode(), nl=False)
        return
    try:
        out.write_bytes(text)
    except OSError as exc:
        raise DataError(f"{out}: cannot write ({exc.strerror}); choose another --out") from None
    click.echo(f"wrote {out}", err=True)


@ratings.command("import")
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.argument("ratings_file", type=click.Path(path_type=Path, dir_okay=False))
@_FORMAT
@click.option("--item-field", default="item", show_default=True,
              help="The key of each task's data that holds the item id.")
def import_(source: Path, ratings_file: Path, fmt: str, item_field: str) -> None:
    """Append the ratings of SOURCE (Label Studio's JSON export) to RATINGS_FILE; a rating
    already there (same item, aspect, annotator, score and time) is not added again.

    \b
    Examples:
      judge ratings import project-3-at-2026-11-27.json ratings.jsonl
      judge ratings import export.json ratings.jsonl --item-field id
    """
    try:
        tasks = orjson.loads(source.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise DataError(f"{source}: not JSON ({exc}); export the project as JSON") from None
    got = from_label_studio(tasks, item_field=item_field, where=str(source))
    have = set(read_ratings(ratings_file))
    new = [r for r in dict.fromkeys(got) if r not in have]
    append_ratings(ratings_file, new)
    click.echo(f"imported {len(new)} ratings into {ratings_file} "
               f"({len(got) - len(new)} already there)")
