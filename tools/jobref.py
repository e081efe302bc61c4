"""The job file's reference, generated from the loader's own key tables, so it cannot drift.

The keys come from the code that accepts them: every `X.check_keys({...})` set in
`runner/job/load.py` and `runner/job/models.py`, the `allowed` set of `_field_map` in
`runner/prepare.py` (a file data set's `fields`) and `_OPTIONS` in `runner/data/datasets.py` (a
registered set's `options`). Their meanings come from the docstrings (or trailing comments) of the
fields they fill, in `runner/job/spec.py`, `runner/data/userfile.py` and `runner/data/datasets.py`,
or from `NOTES` below where the field says less than a user needs. A key the loader accepts that
has neither is an error, and so is a note for a key the loader no longer accepts: `mkdocs build
--strict` (run by `make lint`) fails.

Used as a MkDocs hook (`hooks:` in mkdocs.yml): `<!-- job-file-keys -->` in a page becomes the
tables. `python tools/jobref.py` prints them.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOAD = ROOT / "runner" / "job" / "load.py"
MODELS = ROOT / "runner" / "job" / "models.py"
SPEC = ROOT / "runner" / "job" / "spec.py"
PREPARE = ROOT / "runner" / "prepare.py"
DATASETS = ROOT / "runner" / "data" / "datasets.py"
USERFILE = ROOT / "runner" / "data" / "userfile.py"
MARKER = "<!-- job-file-keys -->"


@dataclass(frozen=True)
class Section:
    """One table of the job file: where its keys are checked and which class they fill."""

    title: str
    where: tuple[str, str]
    """(function in load.py, variable whose check_keys lists the keys), or a special source."""
    source: Path
    cls: str
    aliases: dict[str, str] = field(default_factory=dict)
    """job-file key -> dataclass field, where the names differ."""
    intro: str = ""


SECTIONS = (
    Section("Top level", ("load_job", "root"), SPEC, "Job",
            intro="Relative paths are resolved against the job file's folder. Unknown keys "
                  "are errors naming the key path."),
    Section("[limits]", ("_limits", "r"), SPEC, "Limits",
            intro="How hard the runner may push an endpoint. None of these enter the cache key."),
    Section("[[datasets]]", ("_dataset", "r"), SPEC, "DatasetSpec",
            intro="A registered data set by `name`, or `name` + `path` + `fields` for your own "
                  "file."),
    Section("[datasets.fields]", ("_field_map", "allowed"), USERFILE, "FieldMap",
            intro="How the columns of your file become items (a file data set only)."),
    Section("[datasets.options]", ("_OPTIONS", ""), DATASETS, "",
            intro="Options of a registered data set."),
    Section("[[prompts]]", ("_prompt", "r"), SPEC, "PromptSpec",
            aliases={"template": "templates"}),
    Section("join tables (prompts, generate)", ("_join", "j"), SPEC, "",
            intro="`join = {question = {fields = [\"question\", \"input\"], sep = \"\\n\"}}`: "
                  "a template field made of the listed fields that are not empty."),
    Section("[[generate]]", ("_generate", "r"), SPEC, "GenerateSpec",
            aliases={"template": "templates", "field": "into"},
            intro="A generation stage: candidate models answer a data set's items; their "
                  "answers become a new data set that prompts can judge."),
    Section("[models.NAME]", ("read_model", "m"), SPEC, "ModelSpec",
            intro="A judge (or a generation candidate). `--model SPEC` replaces the job's "
                  "judges."),
    Section("price (in [models.NAME])", ("_price", "mp"), SPEC, "",
            intro="The model's whole price, USD per 1M tokens of each kind, in place of the "
                  "provider table's (runner/job/providers.py: OpenAI, Anthropic, Gemini and "
                  "Azure list prices as read in November 2025, each with its source)."),
    Section("endpoints (in [models.NAME])", ("_endpoints", "e"), SPEC, "EndpointSpec",
            intro="A fleet: `endpoints = [{base_url = ..., rpm = ...}, ...]`, several replicas, "
                  "keys or regions serving one model."),
    Section("[juries.NAME]", ("_juries", "j"), SPEC, "JurySpec",
            intro="A virtual judge NAME pooling several judges' scores per item (zero calls), "
                  "reported, correlated and compared like any judge."),
    Section("[[imports]]", ("_import", "r"), SPEC, "ImportSpec",
            intro="Recorded judge answers to store under the job's own requests "
                  "(`judge import`)."),
)

# (meaning, default) where the field's own docstring is missing or says less than a user needs.
NOTES: dict[str, dict[str, tuple[str, str]]] = {
    "Top level": {
        "name": ("Job name: the report folder's and the lease's name.", "the file's stem"),
        "output_dir": ("Report folder (`--out` overrides it).", "`runs/<name>`"),
        "policy": ("Sample level, a group where one side is constant: `skip` it (Wang et al., "
                   "G-Eval) or count it as `zero` (Lai et al.).", "`\"skip\"`"),
        "bootstrap": ("Resamples for the 95% CIs.", "`1000`"),
        "seed": ("Seed of the bootstrap (and of every other resampling).", "`0`"),
        "levels": ("Correlation levels to report: `sample`, `dataset`, `system`.",
                   "all three"),
        "methods": ("`pearson`, `spearman`, `kendall` (tau-b), `ccc` (Lin's concordance: "
                    "also penalises a judge on the wrong scale); system level adds "
                    "`pairwise_accuracy`.", "the first three"),
        "leaderboard": ("Also write `leaderboard.csv` (per judged system, each aspect's mean, "
                        "each automatic metric's mean).", "`false`"),
        "scores_csv": ("Also write `scores.csv` (the same table as `scores.parquet`, which is "
                       "always written); `false` for a large study.", "`true`"),
        "limits": ("The `[limits]` table below.", ""),
        "datasets": ("The `[[datasets]]` tables below (at least one).", ""),
        "prompts": ("The `[[prompts]]` tables below.", ""),
        "models": ("The `[models.NAME]` tables below (at least one).", ""),
        "imports": ("The `[[imports]]` tables below.", ""),
        "generate": ("The `[[generate]]` tables below.", ""),
    },
    "[limits]": {
        "rpm": ("Requests per minute per model; unset = unlimited, or learned from the "
                "server's rate-limit headers. Divided by N under `--shard I/N`.", "unset"),
        "tpm": ("Tokens per minute per model (prompt estimate + max_tokens x n); unset = "
                "unlimited or learned. Divided by N under `--shard I/N`.", "unset"),
        "until_ci": ("Stop calling a judge once every 95% CI of its correlation with the "
                     "humans (each aspect, level and method the job reports) is narrower than "
                     "this; the groups are judged whole, in the order of the `--sample` draw. "
                     "`judge run --until-ci W` overrides it. See [Stopping when the answer is "
                     "known](../explanation/statistics.md#stopping-when-the-answer-is-known).",
                     "unset"),
    },
    "[[datasets]]": {
        "name": ("A registered data set (`judge datasets list`), or your name for a file.", ""),
        "path": ("Your file: `.jsonl`, `.csv` or `.json` (a list of objects).", ""),
        "fields": ("The field mapping of a file (`[datasets.fields]` below); required with "
                   "`path`.", ""),
        "options": ("`{systems = [...], subsets = [...]}` for a registered set.", ""),
    },
    "[datasets.fields]": {
        "text": ("Template field -> column, e.g. `{source = \"src\", output = \"hyp\"}` "
                 "(at least one).", "required"),
        "human": ("Aspect -> column, or a list of annotator columns (their mean is the human "
                  "score, and `iaa` compares annotator 2 with annotator 1).", ""),
        "format": ("`jsonl`, `csv` or `json`; unset = from the file's extension.", ""),
        "id": ("Column with the item id.", "the row number"),
        "group": ("Column grouping the items that sample level correlates within (a source: "
                  "document, story beginning, source sentence).", "each item alone"),
        "system": ("Column naming the system that wrote the output (system level).", ""),
        "subset": ("Column naming the item's subset (a split, a direction).", ""),
    },
    "[datasets.options]": {
        "systems": ("Keep only these systems' outputs.", "all"),
        "subsets": ("Keep only these subsets.", "all"),
    },
    "[[prompts]]": {
        "name": ("The prompt's name; reports call a judge `model/prompt`.", "required"),
        "template": ("A file (relative to the job file), or a table by `aspect`, "
                     "`aspect@subset`, `*@subset` (most specific wins). `{{field}}` "
                     "placeholders.", "required"),
        "system": ("A system message (text).", ""),
        "system_file": ("A system message read from a file (not with `system`).", ""),
        "parser": ("`stars`, `number`, `form`, `outputs`, `pair`, `logprob` (see Parsers).",
                   "required"),
        "parser_options": ("The parser's options, e.g. `{min = 1, max = 5}`.", "`{}`"),
        "aspects": ("The aspects this prompt scores (a list, at least one).", "required"),
        "params": ("Request parameters: temperature, max_tokens, n, logprobs, top_logprobs, "
                   "seed, ... (`model`, `messages`, `stream` are the runner's).", "`{}`"),
        "output_field": ("Group mode (`per = \"group\"`): the item field listed as "
                         "`{{outputs}}` / placed as `{{output_N}}`.", "`\"output\"`"),
        "when_empty": ("Field -> template used instead when that item field is empty.", "`{}`"),
        "join": ("Template field -> `{fields = [...], sep = \"\\n\"}` (join tables below).",
                 "`{}`"),
        "requires": ("Fields that must be non-empty (after `join`) for the prompt to apply "
                     "to an item.", "`[]`"),
    },
    "join tables (prompts, generate)": {
        "fields": ("The fields to join (the non-empty ones, in this order).", "required"),
        "sep": ("The separator.", "`\"\\n\"`"),
    },
    "[[generate]]": {
        "dataset": ("The source data set (a name of this job's `[[datasets]]`).", "required"),
        "template": ("A file, or a table by `*@subset`.", "required"),
        "system": ("A system message (text).", ""),
        "models": ("The candidates (names of `[models]`).", "required"),
        "field": ("The template field the answer lands in.", "`\"output\"`"),
        "params": ("Request parameters of the generation requests.", "`{}`"),
        "when_empty": ("As in a prompt.", "`{}`"),
        "join": ("As in a prompt.", "`{}`"),
        "metrics": ("Automatic metrics of each answer: a list, or a table by subset / `*`, "
                    "of `bleu`, `chrf`, `rouge`, `distinct`, `overlap`.", "`[]`"),
        "language": ("Tokenization of the metrics: `en`, or `zh` (characters).", "`\"en\"`"),
    },
    "[models.NAME]": {
        "spec": ("`openai:NAME`, `anthropic:NAME`, `gemini:NAME`, `azure:DEPLOYMENT`, "
                 "`local:NAME`, or a bare `NAME` served at `base_url` (see Model specs).",
                 "required"),
        "base_url": ("Endpoint root ending in `/v1` (`--base-url` and `OPENAI_BASE_URL` "
                     "fill it for a bare name); azure: the resource URL.", "the spec's preset"),
        "api_key_env": ("Environment variable holding the key (never the key itself).",
                        "the spec's preset"),
        "params": ("Request parameters for every prompt sent to this model (a prompt's "
                   "params win).", "`{}`"),
        "rpm": ("Requests per minute for this model.", "unset"),
        "tpm": ("Tokens per minute for this model.", "unset"),
        "price": ("`{input = USD, output = USD, cached_input = USD, cache_write = USD}` "
                  "per 1M tokens, for `judge plan`, `--budget` and every bill; a model "
                  "neither here nor in the table has no price (its cost is unknown, never "
                  "$0).", "the provider table"),
    },
    "price (in [models.NAME])": {
        "input": ("USD per 1M prompt tokens.", "required"),
        "output": ("USD per 1M completion tokens.", "required"),
        "cached_input": ("USD per 1M prompt tokens read from the provider's prompt cache.",
                         "`input`"),
        "cache_write": ("USD per 1M prompt tokens written to the provider's prompt cache "
                        "(Anthropic bills 1.25x input).", "`input`"),
    },
    "[[imports]]": {
        "dataset": ("A data set of this job.", "required"),
        "prompt": ("A prompt of this job.", "required"),
        "model": ("A model of this job.", "required"),
        "field": ("The item field (a column of the data) holding the recorded answer text.",
                  "required"),
    },
    "endpoints (in [models.NAME])": {
        "base_url": ("The replica's endpoint root (ending in /v1 for OpenAI-compatible "
                     "servers; the resource URL for azure).", "required"),
        "api_key_env": ("Environment variable holding this replica's key (never the key "
                        "itself).", "the model's"),
    },
}


def key_sets() -> dict[tuple[str, str], set[str]]:
    """Every key set the loader checks, by (function, variable)."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in (LOAD, MODELS, PREPARE, DATASETS):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id == "_OPTIONS" and isinstance(node.value, ast.Tuple):
                found[("_OPTIONS", "")] = {_const(e) for e in node.value.elts}
            if not isinstance(node, ast.FunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) \
                        and inner.func.attr == "check_keys" and isinstance(inner.args[0], ast.Set) \
                        and isinstance(inner.func.value, ast.Name):
                    found[(node.name, inner.func.value.id)] = {_const(e)
                                                              for e in inner.args[0].elts}
                if isinstance(inner, ast.Assign) and isinstance(inner.value, ast.Set) \
                        and isinstance(inner.targets[0], ast.Name):
                    found[(node.name, inner.targets[0].id)] = {_const(e)
                                                              for e in inner.value.elts}
    return found


def _const(node: ast.expr) -> str:
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        raise ValueError(f"not a string constant at line {node.lineno}")
    return node.value


def field_docs(path: Path, cls: str) -> dict[str, tuple[str, str]]:
    """A dataclass's fields: name -> (docstring or trailing comment, default as source)."""
    source = path.read_text("utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    out: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            doc = ""
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                    and isinstance(nxt.value.value, str):
                doc = " ".join(nxt.value.value.split())
            elif "#" in lines[stmt.lineno - 1]:
                doc = lines[stmt.lineno - 1].split("#", 1)[1].strip()
            default = ""
            if isinstance(stmt.value, ast.Constant):
                default = f"`{_toml(stmt.value.value)}`"
            out[stmt.target.id] = (doc, default)
    return out


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return "unset" if value is None else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The tables, one per section; raises ValueError on an undocumented or stale key."""
    sets = key_sets()
    problems: list[str] = []
    parts: list[str] = []
    for section in SECTIONS:
        keys = sets.get(section.where)
        if keys is None:
            problems.append(f"{section.title}: no key set found at {section.where}")
            continue
        docs = field_docs(section.source, section.cls) if section.cls else {}
        notes = NOTES.get(section.title, {})
        problems += [f"{section.title}.{k}: a note for a key the loader does not accept"
                     for k in sorted(set(notes) - keys)]
        rows = ["| key | meaning | default |", "|---|---|---|"]
        for key in sorted(keys):
            doc, default = docs.get(section.aliases.get(key, key), ("", ""))
            note, note_default = notes.get(key, ("", ""))
            if not (note or doc):
                problems.append(f"{section.title}.{key}: accepted by the loader, documented "
                                "nowhere (add a docstring in spec.py or a note in "
                                "tools/jobref.py)")
            rows.append(f"| `{key}` | {_cell(note or doc)} | {_cell(note_default or default)} |")
        intro = f"{section.intro}\n\n" if section.intro else ""
        parts.append(f"### {section.title}\n\n{intro}" + "\n".join(rows) + "\n")
    if problems:
        raise ValueError("job file reference: " + "; ".join(problems))
    return "\n".join(parts)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: fill the marker with the generated tables."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown


if __name__ == "__main__":
    sys.stdout.write(render())
