"""`judge init`: a first job for a user's data file, to edit rather than write.

`propose` reads the file's columns (the first MAX_ROWS records) and guesses, by name and by
content, which column is the id, the group, the system, the input and the output text, and which
numeric columns are human scores (several annotator columns of one aspect, "fluency_1",
"fluency_2", become a list: their mean and agreement) or metrics, and says each guess. A file
without human scores gets them from a ratings file (`ratings.jsonl` beside the job, filled by
`judge serve --annotator NAME`).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from runner.data.readers import FORMATS, read_records
from runner.errors import ConfigError, DataError

__all__ = ["MAX_ROWS", "STARTERS", "Proposal", "Starter", "propose", "write"]

MAX_ROWS = 5000  # records read to guess from: enough to see ids repeat, quick on any file
_ID = {"id", "item_id", "uid", "key", "example_id", "sample_id", "row_id"}
_GROUP = {"group", "group_id", "doc", "doc_id", "document_id", "source_id", "src_id",
          "question_id", "prompt_id", "input_id", "instance_id", "topic_id"}
_SYSTEM = {"system", "model", "sys", "system_id", "system_name", "model_name", "model_id",
           "generator", "method", "engine"}
_INPUT = {"input", "source", "src", "question", "prompt", "document", "article", "context",
          "instruction", "query", "dialogue", "dialog"}
_OUTPUT = {"output", "answer", "response", "summary", "hypothesis", "hyp", "generation",
           "completion", "prediction", "candidate", "text", "reply", "translation", "story"}
_WHO = {"human", "rating", "rater", "annotator", "annotation", "score", "judgment", "judgement",
        "label", "likert", "mos"}  # a stem that names the rater, not the aspect: "overall"
_HUMAN = _WHO | {"fluency", "coherence", "relevance", "consistency", "adequacy", "quality",
                 "overall", "content", "style", "informativeness", "naturalness", "helpfulness",
                 "correctness", "faithfulness", "accuracy", "grammar"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Starter:
    """A starting prompt: its text and how its answers are read (runner/data/starters.toml)."""

    name: str
    description: str
    parser: str
    parser_options: Mapping[str, Any]
    params: Mapping[str, Any]
    template: str  # "[input]" on its own line: the input block, or nothing


def _read_starters() -> dict[str, Starter]:
    text = resources.files("runner.data").joinpath("starters.toml").read_text("utf-8")
    return {name: Starter(name=name, description=entry["description"], parser=entry["parser"],
                          parser_options=entry.get("parser_options", {}),
                          params=entry["params"], template=entry["template"])
            for name, entry in tomllib.loads(text).items()}


STARTERS: Mapping[str, Starter] = MappingProxyType(_read_starters())
"""The starting prompts by name: stars, number, json, pairwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Proposal:
    """The files `judge init` writes, and what it guessed."""

    job: Path
    job_text: str
    prompt: Path
    prompt_text: str
    guesses: list[str]  # one line a guess, e.g. 'id: column "id" (unique in 40 rows)'
    ratings: bool  # human scores come from a ratings file (the data has none)


@dataclass(slots=True)
class _Columns:
    """The guessed role of each column."""

    id: str | None = None
    group: str | None = None
    system: str | None = None
    input: str | None = None
    output: str | None = None
    human: dict[str, list[str]] | None = None
    metrics: list[str] | None = None


def propose(data: Path, starter: str = "stars", job: Path | None = None) -> Proposal:
    """A job for `data`, beside it, with one of the starting prompts.

    Args:
        data: A JSONL, CSV or JSON (list of objects) file.
        starter: A key of STARTERS.
        job: The job file to write (default: the data file's name with .toml).

    Returns:
        The proposal; nothing is written.

    Raises:
        ConfigError: Unknown starter or format, no text column, or pairwise without groups.
        DataError: The file is missing, empty or malformed.
    """
    if starter not in STARTERS:
        raise ConfigError(f"unknown starting prompt {starter!r}; choose one of "
                          f"{', '.join(STARTERS)}")
    fmt = FORMATS.get(data.suffix.lower())
    if fmt is None:
        raise ConfigError(f"{data}: judge init reads .jsonl, .csv or .json files (got "
                          f"{data.suffix or 'no extension'!r})")
    if not data.is_file():
        raise DataError(f"{data}: file not found; give the path of your data file")
    rows = _rows(data, fmt)
    cols, guesses = _guess(data, rows, pairwise=starter == "pairwise")
    job = job or data.with_suffix(".toml")
    prompt = job.with_name(f"{job.stem}-{starter}.txt")
    text = _job_text(data, job, prompt, cols, STARTERS[starter])
    tomllib.loads(text)  # what we write must parse: a bug here, not the user's
    body = STARTERS[starter].template.replace(
        "[input]\n", "Input:\n{{input}}\n\n" if cols.input else "")
    return Proposal(job=job, job_text=text, prompt=prompt, prompt_text=body, guesses=guesses,
                    ratings=not cols.human and starter != "pairwise")


def write(proposal: Proposal) -> None:
    """Create the job and prompt files; an existing file is never overwritten.

    Args:
        proposal: the job and prompt to write, from propose.

    Raises:
        ConfigError: Either file exists (nothing is written).
    """
    for path in (proposal.job, proposal.prompt):
        if path.exists():
            raise ConfigError(f"{path}: already exists; judge init never overwrites a file: "
                              "edit it, or give another name with --job")
    proposal.prompt.write_text(proposal.prompt_text, encoding="utf-8")
    try:
        with proposal.job.open("x", encoding="utf-8") as f:
            f.write(proposal.job_text)
    except FileExistsError:  # made meanwhile: keep theirs
        proposal.prompt.unlink()
        raise ConfigError(f"{proposal.job}: already exists; judge init never overwrites a "
                          "file") from None


def _rows(data: Path, fmt: str) -> list[dict[str, Any]]:
    rows = []
    for index, where, row in read_records(data, fmt):
        if index >= MAX_ROWS:
            break
        if not isinstance(row, dict):
            raise DataError(f"{where}: a {type(row).__name__}, expected an object of columns")
        rows.append(row)
    if not rows:
        raise DataError(f"{data}: no records; judge init needs a header and rows to guess from")
    return rows


def _norm(column: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", column.lower()).strip("_")


def _numeric(values: Sequence[Any]) -> bool:
    present = [v for v in values if v not in (None, "")]
    if not present:
        return False
    for v in present:
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            return False
        try:
            float(v)
        except ValueError:
            return False
    return True


def _guess(data: Path, rows: list[dict[str, Any]], *, pairwise: bool
           ) -> tuple[_Columns, list[str]]:
    names = list(dict.fromkeys(k for row in rows for k in row))
    values = {c: [row.get(c) for row in rows] for c in names}
    numeric = {c for c in names if _numeric(values[c])}
    text = [c for c in names if c not in numeric]
    cols, said = _Columns(), []
    n = len(rows)
    cols.id = next((c for c in names
                    if _norm(c) in _ID and len(set(map(str, values[c]))) == n), None)
    said.append(f"id: column {cols.id!r} (unique in the first {n} rows)" if cols.id else
                "id: none found (a column named id with unique values): the row number")
    cols.system = next((c for c in names if _norm(c) in _SYSTEM), None)
    cols.group = next((c for c in names if _norm(c) in _GROUP and c != cols.id), None)
    taken = {cols.id, cols.system, cols.group}
    free = [c for c in text if c not in taken]
    cols.output = next((c for c in free if _norm(c) in _OUTPUT), None) or max(
        free, key=lambda c: sum(len(str(v or "")) for v in values[c]), default=None)
    if cols.output is None:
        raise ConfigError(f"{data}: no text column to judge (columns: {', '.join(names)}); "
                          "judge init needs a column holding the outputs")
    rest = [c for c in free if c != cols.output]
    cols.input = next((c for c in rest if _norm(c) in _INPUT), rest[0] if len(rest) == 1 else None)
    if cols.group is None and cols.input and len(set(map(str, values[cols.input]))) < n:
        cols.group = cols.input  # rows sharing an input are the outputs for one source
    said.append(f"output (the judged text): column {cols.output!r}")
    said.append(f"input: column {cols.input!r}" if cols.input else "input: none")
    said.append(f"group: column {cols.group!r}" if cols.group else
                "group: none (each item alone: sample-level correlations need a group column)")
    said.append(f"system: column {cols.system!r}" if cols.system else "system: none")
    if pairwise and cols.group is None:
        raise ConfigError(f"{data}: the pairwise prompt compares the outputs of one group, and "
                          "no group column was found; add one (e.g. question_id) or use "
                          "--prompt stars")
    cols.human, cols.metrics = _scores(names, numeric - taken)
    for aspect, columns in cols.human.items():
        said.append(f"human {aspect}: column{'s' if len(columns) > 1 else ''} "
                    f"{', '.join(map(repr, columns))}"
                    + (" (annotators: their mean, and their agreement)" if len(columns) > 1
                       else ""))
    if not cols.human:
        said.append("human: no score column found: ratings from ratings.jsonl "
                    "(judge serve --annotator NAME)")
    if cols.metrics:
        said.append(f"metrics (correlated like a judge): {', '.join(map(repr, cols.metrics))}")
    used = {cols.output, cols.input, *taken, *cols.metrics, *(c for v in cols.human.values()
                                                            for c in v)}
    unused = [c for c in names if c not in used]
    if unused:
        said.append(f"not used: {', '.join(map(repr, unused))}")
    return cols, said


def _scores(names: list[str], numeric: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Numeric columns as human aspects (by name) and metrics (the others)."""
    human: dict[str, list[str]] = {}
    metrics = []
    for c in [c for c in names if c in numeric]:
        if _norm(c) == "id" or _norm(c).endswith("_id"):
            continue  # a number naming something: neither a score nor a metric
        words = set(_norm(c).split("_")) | {re.sub(r"\d+$", "", w) for w in _norm(c).split("_")}
        if not words & _HUMAN:
            metrics.append(c)
            continue
        stem = re.sub(r"_?\d+$", "", _norm(c)) or "overall"
        stem = re.sub(r"^(human|rater|annotator)_|_(human|rater|annotator)$", "", stem)
        human.setdefault("overall" if stem in _WHO else stem, []).append(c)
    return human, metrics


def _q(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text, ensure_ascii=False)


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _q(name)


def _value(v: Any) -> str:
    """A TOML value: an inline table for a mapping."""
    if isinstance(v, str):
        return _q(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def _job_text(data: Path, job: Path, prompt: Path, cols: _Columns, starter: Starter) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", data.stem).strip("-") or "data"
    rel = Path(os.path.relpath(data.resolve(), job.parent.resolve()))
    human: dict[str, Any] = {a: c[0] if len(c) == 1 else c for a, c in (cols.human or {}).items()}
    aspects = list(human) or ["overall"]
    if starter.name == "pairwise":
        aspects = ["quality"]  # a battle: scored against the other output, not a human rating
    elif not human:
        human = {"overall": {"ratings": "ratings.jsonl"}}
    text = {"input": cols.input, "output": cols.output} if cols.input else {"output": cols.output}
    lines = [f"# Written by `judge init {data.name} --prompt {starter.name}`: a start, to edit.",
             "# Every key: docs/reference/job-file.md. Then:",
             f"#   judge plan {job.name}",
             f"#   judge run {job.name}        # OPENAI_API_KEY, or --model NAME --base-url URL",
             f"#   judge view {job.name}",
             f"name = {_q(name)}", "", "[[datasets]]", f"name = {_q(name)}",
             f"path = {_q(rel.as_posix())}", "[datasets.fields]"]
    lines += [f"{key} = {_q(col)}" for key, col in
              (("id", cols.id), ("group", cols.group), ("system", cols.system)) if col]
    lines += [f"text = {_value(text)}", f"human = {_value(human)}"]
    if cols.metrics:
        lines.append(f"metrics = {_value(cols.metrics)}")
    lines += ["", "[[prompts]]", f"name = {_q(starter.name)}", f"template = {_q(prompt.name)}",
              f"parser = {_q(starter.parser)}"]
    if starter.parser_options:
        lines.append(f"parser_options = {_value(starter.parser_options)}")
    if starter.name == "pairwise":
        lines += ['per = "group"                # one request shows two outputs of a group',
                  'order = "both"               # ... and again swapped (position bias)',
                  'output_field = "output"']
    lines += [f"aspects = {_value(aspects)}", f"params = {_value(starter.params)}",
              "", "[models.judge]", 'spec = "openai:gpt-4o-mini"    # --model replaces it', ""]
    return "\n".join(lines)
