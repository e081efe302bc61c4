"""`judge init DATA`: a first job beside a data file (runner.data.scaffold), and what it guessed.
Registered on the group in runner.cli.main."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from runner.data.scaffold import STARTERS, propose, write

__all__ = ["init"]


@click.command()
@click.argument("data", type=click.Path(path_type=Path))
@click.option("--prompt", "starter", type=click.Choice(list(STARTERS)), default="stars",
              show_default=True,
              help="The starting prompt: " + "; ".join(
                  f"{name}: {s.description}" for name, s in STARTERS.items()) + ".")
@click.option("--job", "job_file", type=click.Path(path_type=Path),
              help="The job file to write [default: DATA's name with .toml, beside it].")
def init(data: Path, starter: str, job_file: Path | None) -> None:
    """Write a job for DATA (.csv, .jsonl or .json) beside it: the id, group, system, text and
    human columns guessed from the file (each guess printed), and a prompt file from a
    starting prompt. Never overwrites a file.

    \b
    Examples:
      judge init outputs.csv
      judge init outputs.jsonl --prompt json
      judge init answers.jsonl --prompt pairwise --job battle.toml
    """
    proposal = propose(data, starter, job_file)
    write(proposal)
    for line in proposal.guesses:
        click.echo(f"guessed {line}")
    click.echo(f"wrote {proposal.job} and {proposal.prompt} (the prompt: edit it)")
    quoted = shlex.quote(str(proposal.job))
    steps = [(f"judge plan {quoted}", "tasks and cost, no call"),
             (f"judge run {quoted}", "OPENAI_API_KEY; or --model NAME --base-url "
                                     "http://127.0.0.1:8000/v1"),
             (f"judge view {quoted}", "the report")]
    if proposal.ratings:
        steps.append(("judge serve --annotator NAME",
                      f"rate items: the human scores ({proposal.job.with_name('ratings.jsonl')})"))
    width = max(len(command) for command, _ in steps) + 2
    click.echo("next:")
    for command, what in steps:
        click.echo(f"  {command.ljust(width)}# {what}")
