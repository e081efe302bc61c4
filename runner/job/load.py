"""Read a job file (TOML) into the value objects of `runner.job.spec`, validating everything
before any call.

A job names data sets, prompts (template, parser, aspects, request params), judge models and
limits. Unknown keys are errors naming their key path; relative paths are resolved against the
job file's own folder. Every key: docs/reference/job-file.md, made from the check_keys below.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.errors import ConfigError
from runner.job.models import read_model
from runner.job.reader import Reader, check_params
from runner.job.spec import (
    DEFAULT_METHODS,
    JURY_METHODS,
    LEVELS,
    METHODS,
    POLICIES,
    DatasetSpec,
    GenerateSpec,
    ImportSpec,
    Job,
    JurySpec,
    Limits,
    ModelSpec,
    PromptSpec,
    placeholders,
)
from runner.parse.metrics import LANGUAGES, METRICS
from runner.parse.parsers import check_aspect, check_options, get_parser

__all__ = ["load_job"]


def load_job(path: Path) -> Job:
    """Read and validate a job file.

    Args:
        path: the job's TOML file.

    Returns:
        The whole job, validated: every later stage reads it and nothing re-checks it.

    Raises:
        ConfigError: the file cannot be read, is not TOML, has an unknown key or a wrong value;
            the message names the file, the key path and the fix.
    """
    root = Reader(path, _toml(path))
    root.check_keys({"name", "output_dir", "policy", "bootstrap", "seed", "limits", "datasets",
                     "prompts", "models", "imports", "leaderboard", "levels", "methods",
                     "generate", "juries", "scores_csv", "prompt_cache"})
    name = root.get("name", str, path.stem)
    policy = root.get("policy", str, "skip")
    if policy not in POLICIES:
        raise root.error("policy", f"must be one of {', '.join(POLICIES)} (got {policy!r})")
    datasets = tuple(_dataset(root, i, t) for i, t in enumerate(_tables(root, "datasets")))
    models_table = root.get("models", dict, required=True)
    if not models_table:
        raise root.error("models", "is empty; add e.g. [models.judge] "
                         "spec = \"openai:gpt-4o-mini\"")
    models = tuple(read_model(root.child("models", models_table), key, value)
                   for key, value in models_table.items())
    generate = tuple(_generate(root, i, t, datasets, models)
                     for i, t in enumerate(root.get("generate", list, [])))
    names = [d.name for d in datasets] + [g.name for g in generate]
    _unique(root, "datasets", names)
    prompts = tuple(_prompt(root, i, t, set(names), {m.name for m in models})
                    for i, t in enumerate(_tables(root, "prompts")))
    _unique(root, "prompts", [p.name for p in prompts])
    out = root.get("output_dir", str, f"runs/{name}")
    imports = tuple(_import(root, i, t, datasets, prompts, models)
                    for i, t in enumerate(root.get("imports", list, [])))
    return Job(name=name, path=path, datasets=datasets, prompts=prompts, models=models,
               limits=_limits(root), output_dir=Path(out), policy=policy,
               bootstrap=root.positive("bootstrap", 1000), seed=root.get("seed", int, 0),
               imports=imports, generate=generate, juries=_juries(root, models, prompts),
               leaderboard=root.get("leaderboard", bool, False),
               scores_csv=root.get("scores_csv", bool, True),
               prompt_cache=root.get("prompt_cache", bool, True),
               levels=_choices(root, "levels", LEVELS),
               methods=_choices(root, "methods", METHODS, DEFAULT_METHODS))


def _toml(path: Path) -> dict[str, Any]:
    """The job file's TOML, or a ConfigError naming what keeps it from being read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: job file not found; pass a path or a name under jobs/"
                          ) from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a job file; pass the job's .toml file"
                          ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the job file ({exc}); check the path and "
                          "that it is UTF-8 text") from None
    if text.startswith("\ufeff"):  # tomllib's own message would be "Invalid statement"
        raise ConfigError(f"{path}: starts with a UTF-8 byte-order mark (BOM), which TOML "
                          "readers refuse; save the file as UTF-8 without BOM")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax") from None


def _juries(root: Reader, models: tuple[ModelSpec, ...],
            prompts: tuple[PromptSpec, ...]) -> tuple[JurySpec, ...]:
    """`[juries.NAME]`: judges = ["model/prompt", ...] (two or more), method, quorum."""
    table = root.child("juries", root.get("juries", dict, {}))
    judges = {f"{m.name}/{p.name}" for m in models for p in prompts
              if not p.models or m.name in p.models}
    out = []
    for name, spec in table.table.items():
        if not isinstance(spec, dict):
            raise table.error(name, 'must be a table like [juries.panel] judges = '
                              '["gpt/stars", "claude/stars"]')
        if "/" in name or name in ("iaa", "human"):
            raise table.error(name, "is not a jury name: a name without \"/\" that is not iaa "
                              "or human (those name other rows of the reports)")
        j = table.child(name, spec)
        j.check_keys({"judges", "method", "quorum"})
        members = j.get("judges", list, required=True)
        if len(set(members)) < 2 or not all(isinstance(m, str) for m in members):
            raise j.error("judges", f"must list two or more judges (got {members!r})")
        for m in members:
            if m not in judges:
                raise j.error("judges", f"names {m!r}, which is not a judge of this job; "
                              f"judges are model/prompt: {', '.join(sorted(judges))}")
        method = j.get("method", str, "mean")
        if method not in JURY_METHODS:
            raise j.error("method", f"must be one of {', '.join(JURY_METHODS)} (got {method!r})")
        quorum = j.get("quorum", int, 0)
        if not 0 <= quorum <= len(members):
            raise j.error("quorum", f"must be from 1 to {len(members)}, or 0 for all "
                          f"(got {quorum})")
        out.append(JurySpec(name=name, judges=tuple(members), method=method, quorum=quorum))
    return tuple(out)


def _choices(root: Reader, key: str, allowed: tuple[str, ...],
             default: tuple[str, ...] | None = None) -> tuple[str, ...]:
    values = root.get(key, list, list(allowed if default is None else default))
    if not values or any(v not in allowed for v in values):
        raise root.error(key, f"must be a non-empty list of {', '.join(allowed)} (got {values!r})")
    return tuple(values)


def _generate(root: Reader, index: int, table: Any, datasets: tuple[DatasetSpec, ...],
              models: tuple[ModelSpec, ...]) -> GenerateSpec:
    if not isinstance(table, dict):
        raise root.error(f"generate[{index}]", "must be a [[generate]] table")
    r = root.child(f"generate[{index}]", table)
    r.check_keys({"name", "dataset", "template", "system", "models", "field", "params",
                  "when_empty", "join", "metrics", "language", "reference"})
    source = r.get("dataset", str, required=True)
    if source not in [d.name for d in datasets]:
        raise r.error("dataset", f"names {source!r}, which is not a data set of this job")
    candidates = tuple(r.get("models", list, required=True))
    r.among("models", candidates, [m.name for m in models], "is not in [models]")
    params = r.get("params", dict, {})
    check_params(r, params)
    language = r.get("language", str, "en")
    if language not in LANGUAGES:
        raise r.error("language", f"must be one of {', '.join(LANGUAGES)} (got {language!r})")
    return GenerateSpec(name=r.get("name", str, required=True), dataset=source,
                        templates=_templates(r, ("*",)), system=r.get("system", str),
                        models=candidates, into=r.get("field", str, "output"), params=params,
                        when_empty=_when_empty(r),
                        join=_join(r), metrics=_metric_table(r), language=language,
                        reference=_names(r, "reference"))


def _when_empty(r: Reader) -> dict[str, str]:
    """when_empty = {field = "template file"}: the template used when that field is empty."""
    return {f: _read_template(r, f"when_empty.{f}", path)
            for f, path in r.get("when_empty", dict, {}).items()}


def _names(r: Reader, key: str) -> tuple[str, ...]:
    value = r.get(key, list, [])
    if not all(isinstance(v, str) and v for v in value):
        raise r.error(key, f"must be a list of field names (got {value!r})")
    return tuple(value)


def _join(r: Reader) -> dict[str, tuple[tuple[str, ...], str]]:
    out = {}
    for name, spec in r.get("join", dict, {}).items():
        if not isinstance(spec, dict):
            raise r.error(f"join.{name}", "must be a table like "
                          "{fields = [\"question\", \"input\"], sep = \"\\n\"}")
        j = r.child(f"join.{name}", spec)
        j.check_keys({"fields", "sep"})
        if not j.get("fields", list, required=True):
            raise j.error("fields", "is empty; list the fields to join")
        out[name] = (_names(j, "fields"), j.get("sep", str, "\n"))
    return out


def _metric_table(r: Reader) -> dict[str, tuple[str, ...]]:
    value = r.get("metrics", (list, dict), [])
    table = {"*": value} if isinstance(value, list) else value
    for subset, names in table.items():
        if not isinstance(names, list) or any(n not in METRICS for n in names):
            where = "metrics" if isinstance(value, list) else f"metrics.{subset}"
            raise r.error(where, f"must list metrics among {', '.join(METRICS)} "
                          f"(got {names!r})")
    return {subset: tuple(names) for subset, names in table.items()}


def _import(root: Reader, index: int, table: Any, datasets: tuple[DatasetSpec, ...],
            prompts: tuple[PromptSpec, ...], models: tuple[ModelSpec, ...]) -> ImportSpec:
    if not isinstance(table, dict):
        raise root.error(f"imports[{index}]", "must be an [[imports]] table")
    r = root.child(f"imports[{index}]", table)
    r.check_keys({"dataset", "prompt", "model", "field"})
    spec = ImportSpec(dataset=r.get("dataset", str, required=True),
                      prompt=r.get("prompt", str, required=True),
                      model=r.get("model", str, required=True),
                      field=r.get("field", str, required=True))
    for key, value, names in (("dataset", spec.dataset, [d.name for d in datasets]),
                              ("prompt", spec.prompt, [p.name for p in prompts]),
                              ("model", spec.model, [m.name for m in models])):
        r.among(key, [value], names, "the job does not define")
    return spec


def _tables(root: Reader, key: str) -> list[Mapping[str, Any]]:
    tables = root.get(key, list, required=True)
    if not tables or not all(isinstance(t, dict) for t in tables):
        raise root.error(key, f"must be one or more [[{key}]] tables")
    return list(tables)


def _unique(root: Reader, key: str, names: list[str]) -> None:
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise root.error(key, f"has two entries named {twice!r}; names must be unique")


def _limits(root: Reader) -> Limits:
    r = root.child("limits", root.get("limits", dict, {}))
    r.check_keys({"concurrency", "rpm", "tpm", "max_retries", "timeout_s", "down_after_s",
                  "max_wait_s", "until_ci"})
    retries = r.get("max_retries", int, 6)
    if retries < 0:
        raise r.error("max_retries", f"must be 0 or more (got {retries})")
    return Limits(concurrency=r.positive("concurrency", 16), rpm=r.positive("rpm", None, float),
                  tpm=r.positive("tpm", None, float), max_retries=retries,
                  timeout_s=float(r.positive("timeout_s", 60.0, float)),
                  down_after_s=float(r.positive("down_after_s", 60.0, float)),
                  max_wait_s=float(r.positive("max_wait_s", 600.0, float)),
                  until_ci=r.positive("until_ci", None, float))


def _dataset(root: Reader, index: int, table: Mapping[str, Any]) -> DatasetSpec:
    r = root.child(f"datasets[{index}]", table)
    r.check_keys({"name", "path", "fields", "options"})
    name = r.get("name", str, required=True)
    raw_path = r.get("path", str)
    fields = r.get("fields", dict, {})
    if raw_path is not None and not fields:
        raise r.error("fields", "is missing: a file data set needs a field mapping "
                      "(text = {output = \"column\"}, human = {aspect = \"column\"}, ...)")
    path = (root.file.parent / raw_path) if raw_path is not None else None
    return DatasetSpec(name=name, path=path, fields=fields, options=r.get("options", dict, {}))


def _prompt(root: Reader, index: int, table: Mapping[str, Any],
            dataset_names: set[str], model_names: set[str]) -> PromptSpec:
    r = root.child(f"prompts[{index}]", table)
    r.check_keys({"name", "template", "system", "system_file", "parser", "parser_options",
                  "aspects", "datasets", "params", "samples", "per", "output_field",
                  "when_empty", "aspect_options", "models", "order", "join", "requires",
                  "prefix_until"})
    name = r.get("name", str, required=True)
    aspects = tuple(r.get("aspects", list, required=True))
    if not aspects or not all(isinstance(a, str) for a in aspects):
        raise r.error("aspects", "must be a non-empty list of aspect names")
    templates = _templates(r, aspects)
    system = r.get("system", str)
    system_file = r.get("system_file", str)
    if system_file is not None:
        if system is not None:
            raise r.error("system_file", "and system are both set; keep one")
        system = _read_template(r, "system_file", system_file)
    for_datasets = tuple(r.get("datasets", list, []))
    r.among("datasets", for_datasets, sorted(dataset_names), "is not a data set of this job")
    params = r.get("params", dict, {})
    check_params(r, params)
    judges = tuple(r.get("models", list, []))
    r.among("models", judges, sorted(model_names), "is not in [models]")
    per = r.get("per", str, "item")
    if per not in ("item", "group"):
        raise r.error("per", f"must be \"item\" or \"group\" (got {per!r})")
    order = r.get("order", str, "given")
    if order not in ("given", "both") or (order == "both" and per != "group"):
        raise r.error("order", "must be \"given\" or, with per = \"group\", \"both\" "
                      f"(got {order!r})")
    parser_name = r.get("parser", str, required=True)
    parser_opts = r.get("parser_options", dict, {})
    aspect_opts = r.get("aspect_options", dict, {})
    _check_parser(r, parser_name, parser_opts, aspect_opts, aspects, per)
    when_empty = _when_empty(r)
    return PromptSpec(name=name, templates=templates, system=system, per=per,
                      output_field=r.get("output_field", str, "output"), when_empty=when_empty,
                      parser=parser_name, parser_options=parser_opts,
                      aspect_options=aspect_opts, aspects=aspects, models=judges,
                      datasets=for_datasets, params=params, samples=r.positive("samples", 1),
                      order=order, join=_join(r), requires=_names(r, "requires"),
                      prefix_until=_prefix_until(r, templates, system))


def _prefix_until(r: Reader, templates: Mapping[str, str], system: str | None) -> str | None:
    """The prompt's `prefix_until`: a placeholder of its templates (or system), or None."""
    until: str | None = r.get("prefix_until", str)
    if until is not None and not any(until in placeholders(t)
                                     for t in [*templates.values(), system or ""]):
        raise r.error("prefix_until", f"names {{{{{until}}}}}, which no template of the "
                      "prompt has; name a placeholder, e.g. \"summary\"")
    return until


def _check_parser(r: Reader, name: str, options: Mapping[str, Any],
                  aspect_opts: Mapping[str, Any], aspects: tuple[str, ...], per: str) -> None:
    """The prompt's parser options, for the prompt and for each aspect (see check_aspect)."""
    # In group mode the outputs parser's `count` is the group's size, known per request.
    try:
        parser = get_parser(name)
        counted = per == "group" and "count" in parser.options
        probe = {"count": 1, **options} if counted else options
        check_options(parser, probe)
        for aspect, extra in aspect_opts.items():
            if aspect not in aspects or not isinstance(extra, dict):
                raise ConfigError(f"aspect_options.{aspect} must be a table for one of the "
                                  f"prompt's aspects ({', '.join(aspects)})")
            check_options(parser, {**probe, **extra})
        for aspect in aspects if per == "item" else ():
            check_aspect(parser, {**options, **aspect_opts.get(aspect, {})}, aspect, aspects)
    except ConfigError as exc:
        raise r.error("parser", f"is wrong: {exc}") from None


def _templates(r: Reader, aspects: tuple[str, ...]) -> dict[str, str]:
    value = r.get("template", (str, dict), required=True)
    if isinstance(value, str):
        return {"*": _read_template(r, "template", value)}
    keys = {k.partition("@")[0] for k in value}
    missing = [a for a in aspects if a not in keys and "*" not in keys]
    if missing:
        raise r.error("template", f"has no template for aspect(s) {', '.join(missing)}")
    return {aspect: _read_template(r, f"template.{aspect}", path) for aspect, path in value.items()}


def _read_template(r: Reader, key: str, raw: str) -> str:
    """A template file's text (the path relative to the job file), or the template itself
    when `raw` is one (an inline template: it has a line break or a {{placeholder}})."""
    if "\n" in raw or "{{" in raw:
        return raw
    file = r.file.parent / raw
    try:
        return file.read_text(encoding="utf-8")
    except OSError:
        raise r.error(key, f"points to {file}, which cannot be read; fix the path "
                      "(relative to the job file)") from None
