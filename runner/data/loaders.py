"""Loaders of the registered data sets: each upstream layout, read into `Item`s.

Invariants every loader keeps (tested in tests/test_datasets.py):
- `item_id` is unique within the data set and derived only from upstream ids and names,
  so it is stable across runs and machines.
- Numbers are floats; text fields are passed through byte for byte (no formatting,
  no stripping), so `{` and `}` in the data reach the template engine untouched.

Each loader is a `Loader`, found in `LOADERS`. Loaders never download and never hash;
`runner.data.datasets` checks that the files exist before calling them; `runner.data.readers`
reads the bytes.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType, UnionType
from typing import Any, NamedTuple

from runner.data.readers import jsonl, read_bytes, read_json, safe_unpickle
from runner.errors import DataError

__all__ = ["LOADERS", "Item", "Loader"]


class Item(NamedTuple):
    """One output to be judged, with its source, human scores and recorded metrics.

    A NamedTuple, not a frozen dataclass, for the reason runner.tasks.Task is one (here ~0.08 s
    of loading a 25k-item job); built with keyword arguments all the same."""

    dataset: str  # the data set name as the job calls it
    item_id: str  # unique within the data set, stable across runs
    group: str  # the shared source: document, story beginning, source sentence, question
    system: str  # which system produced the output ("" if unknown or none)
    subset: str  # e.g. "informal->formal"; "" when the data set has no subsets
    fields: Mapping[str, str]  # template fields, e.g. {"source": ..., "output": ...}
    human: Mapping[str, float]  # aspect -> human score (mean of the annotators)
    annotators: Mapping[str, tuple[float, ...]]  # aspect -> per-annotator scores, if released
    metrics: Mapping[str, Mapping[str, float]]  # aspect -> metric -> value; "*" = every aspect
    extra: Mapping[str, Any] = MappingProxyType({})  # category, line, recorded judge...

    def aspect_metrics(self, aspect: str) -> dict[str, float]:
        """The item's metrics for one aspect: those recorded for every aspect ("*"), overridden
        by the aspect's own.

        Args:
            aspect: the aspect judged.

        Returns:
            Metric name -> value.
        """
        return {**self.metrics.get("*", {}), **self.metrics.get(aspect, {})}


Loader = Callable[[Sequence[Path], str], Iterator[Item]]
"""A registered data set's reader, as every loader below is: (the registered files, absolute,
in registry order; the data set's name in the job) -> its items in file order, read lazily (a
DataError names a bad file and record)."""


# ---------------------------------------------------------------------------- helpers


def _refetch_hint(dataset: str) -> str:
    return f"check it with `judge datasets verify {dataset}` and re-fetch"


@contextmanager
def _record(path: Path, where: str, dataset: str) -> Iterator[None]:
    """Turn a missing key or a wrong type inside one record into a one-line DataError."""
    try:
        yield
    except KeyError as exc:
        raise DataError(f"{path}: {where} has no field {exc.args[0]!r}; "
                        f"{_refetch_hint(dataset)}") from None
    except (TypeError, ValueError) as exc:  # TypeError: indexing a list or str by name
        raise DataError(f"{path}: {where}: {exc}; {_refetch_hint(dataset)}") from None


def _obj(value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is a {type(value).__name__}, expected an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is a {type(value).__name__}, expected a list")
    return value


def _text(record: Mapping[str, Any], key: str) -> str:
    value = record[key]
    if not isinstance(value, str):
        raise ValueError(f"field {key!r} is a {type(value).__name__}, expected text")
    return value


def _scalar(record: Mapping[str, Any], key: str, kinds: type | UnionType, expected: str) -> Any:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ValueError(f"field {key!r} is {value!r}, expected {expected}")
    return value


def _num(record: Mapping[str, Any], key: str) -> float:
    return float(_scalar(record, key, int | float, "a number"))


def _numbers(record: Mapping[str, Any], skip: tuple[str, ...] = ()) -> dict[str, float]:
    return {key: _num(record, key) for key in record if key not in skip}


def _one_file(files: Sequence[Path], pattern: str) -> Path:
    matches = [path for path in files if fnmatch.fnmatch(path.name, pattern)]
    if len(matches) != 1:  # a registry bug, not a user error
        raise DataError(f"registry: expected one file matching {pattern!r}, got {matches}")
    return matches[0]


def _read_jsonl(path: Path, dataset: str) -> list[Any]:
    return [row for _, row in jsonl(path, _refetch_hint(dataset))]


def _read_pickle(path: Path, dataset: str) -> Any:
    data = read_bytes(path, _refetch_hint(dataset))  # its error names the path and the fix
    try:
        return safe_unpickle(data)
    except DataError as exc:
        raise DataError(f"{path}: {exc}; {_refetch_hint(dataset)}") from None


def _pickled_dict(files: Sequence[Path], dataset: str) -> tuple[Path, dict[Any, Any]]:
    """BARTScore's data.pkl of the data set: a dict at the top level (restricted unpickler)."""
    path = _one_file(files, "data.pkl")
    with _record(path, "the top level", dataset):
        return path, _obj(_read_pickle(path, dataset), "the top level")


def _json_list(files: Sequence[Path], pattern: str, dataset: str) -> tuple[Path, list[Any]]:
    """The data set's file matching `pattern`, read as a JSON list of records."""
    path = _one_file(files, pattern)
    data = read_json(path, _refetch_hint(dataset))
    with _record(path, "the top level", dataset):
        return path, _list(data, "the top level")


# ---------------------------------------------------------------------------- loaders


def _openmeva(files: Sequence[Path], dataset: str) -> Iterator[Item]:
    """OpenMEVA-MANS: one item per (story beginning, generator), 200 x 5 = 1000."""
    def build(_: int, record: dict[Any, Any]) -> list[Item]:
        doc_id, gens = _text(record, "doc_id"), _obj(record["gen"], "gen")
        return [Item(
            dataset=dataset, item_id=f"{doc_id}:{system}", group=doc_id, system=system,
            subset="",
            fields={"beginning": _text(record, "prompt"),
                    "storyline": _text(_obj(gen, system), "text"),
                    "reference": _text(record, "reference")},
            human={"overall": _num(_obj(gen["score"], "score"), "human")},
            annotators={},
            metrics={"*": _numbers(gen["score"], skip=("human",))},
        ) for system, gen in gens.items()]
    path, records = _json_list(files, "openmeva.json", dataset)
    yield from _each(path, enumerate(records), dataset, "record", build)


# file name -> aspect. content.ref.json carries the same human numbers as content.src.json
# (checked) but metrics computed against the reference, hence its own aspect.
_TST_FILES = {"content.src.json": "content", "content.ref.json": "content_ref",
              "style.json": "style", "fluency.json": "fluency"}
_TST_LINES, _TST_HUMAN = 80, ("out", "human_1", "human_2")


def _tst_formality(files: Sequence[Path], dataset: str) -> Iterator[Item]:
    """GYAFC formality transfer: one item per (source line, output), 80 x 9 = 720.

    Lines 0-39 are informal->formal, 40-79 formal->informal; the human reference
    counts as system "ref". All four files must agree on src, ref, systems and outputs."""
    tables = {aspect: _read_jsonl(_one_file(files, name), dataset)
              for name, aspect in _TST_FILES.items()}
    base = _one_file(files, "content.src.json")
    for aspect, rows in tables.items():
        if len(rows) != _TST_LINES:
            raise DataError(f"{base.parent}: {aspect} has {len(rows)} lines, expected "
                            f"{_TST_LINES}; {_refetch_hint(dataset)}")
    lines = ((line, {a: t[line] for a, t in tables.items()}) for line in range(_TST_LINES))
    yield from _each(base.parent, lines, dataset, "line", functools.partial(_tst_line, dataset))


def _tst_line(dataset: str, line: int, raw: Mapping[str, Any]) -> Iterator[Item]:
    rows = {aspect: _obj(row, "line") for aspect, row in raw.items()}
    src, ref = _text(rows["content"], "src"), _text(rows["content"], "ref")
    systems = list(_obj(rows["content"]["sys"], "sys"))
    for aspect, row in rows.items():
        if (_text(row, "src"), _text(row, "ref"), list(row["sys"])) != (src, ref, systems):
            raise ValueError(f"{aspect} disagrees with content on src, ref or systems")
    for system in systems:
        outs = {aspect: _obj(row["sys"][system], system) for aspect, row in rows.items()}
        output = _text(outs["content"], "out")
        if any(_text(out, "out") != output for out in outs.values()):
            raise ValueError(f"the files disagree on the output of {system}")
        pairs = {a: (_num(o, "human_1"), _num(o, "human_2")) for a, o in outs.items()}
        yield Item(
            dataset=dataset, item_id=f"{line}:{system}", group=str(line), system=system,
            subset="informal->formal" if line < _TST_LINES // 2 else "formal->informal",
            fields={"source": src, "output": output, "reference": ref},
            human={aspect: sum(pair) / 2 for aspect, pair in pairs.items()},
            annotators=pairs,
            metrics={aspect: _numbers(out, skip=_TST_HUMAN) for aspect, out in outs.items()},
            extra={"line": line},
        )


def _each(path: Path, records: Iterable[tuple[Any, Any]], dataset: str, what: str,
          build: Callable[[Any, dict[Any, Any]], Iterable[Item]]) -> Iterator[Item]:
    """The items `build(key, record)` makes of each (key, record) read from `path`, built
    inside the record's error context (`what` and the key name the record in messages)."""
    for key, raw in records:
        with _record(path, f"{what} {key!r}", dataset):
            items = list(build(key, _obj(raw, f"the {what}")))
        yield from items


def _summeval(files: Sequence[Path], dataset: str) -> Iterator[Item]:
    """SummEval: one item per (document, system), 100 x 16 = 1600."""
    def build(doc_id: Any, doc: dict[Any, Any]) -> list[Item]:
        references = tuple(_list(doc["ref_summs"], "ref_summs"))
        return [Item(
            dataset=dataset, item_id=f"{doc_id}:{system}", group=str(doc_id),
            system=system, subset="",
            fields={"document": _text(doc, "src"), "summary": _text(summ, "sys_summ"),
                    "reference": _text(doc, "ref_summ")},
            human=_numbers(_obj(summ["scores"], "scores")), annotators={}, metrics={},
            extra={"references": references},
        ) for system, summ in _obj(doc["sys_summs"], "sys_summs").items()]
    path, docs = _pickled_dict(files, dataset)
    yield from _each(path, docs.items(), dataset, "document", build)


def _bagel(files: Sequence[Path], dataset: str) -> Iterator[Item]:
    """BAGEL: one item per output, 404 (202 meaning representations, 2 outputs each)."""
    def build(key: Any, record: dict[Any, Any]) -> list[Item]:
        references = tuple(_list(record["ref_summs"], "ref_summs"))
        if not references or not all(isinstance(r, str) for r in references):
            raise ValueError("ref_summs must be a non-empty list of text")
        return [Item(
            dataset=dataset, item_id=str(key), group=_text(record, "src"), system="",
            subset="",
            fields={"mr": _text(record, "src"), "text": _text(record, "sys_summ"),
                    "reference": references[0]},
            human=_numbers(_obj(record["scores"], "scores")), annotators={}, metrics={},
            extra={"references": references},
        )]
    path, outputs = _pickled_dict(files, dataset)
    yield from _each(path, outputs.items(), dataset, "item", build)


def _korean_chat(files: Sequence[Path], dataset: str) -> Iterator[Item]:
    """Korean instructions: one item per (instruction, model), 252 x 7 = 1764.

    Models are the generated/*.jsonl stems, sorted. `extra["recorded_judge"]` is the raw
    gpt-4-0125-preview response from chatgpt_results/<model>.pkl where that file exists."""
    questions_path = _one_file(files, "user_oriented_instructions_eval.jsonl")
    questions = _read_jsonl(questions_path, dataset)
    answers = {p.stem: (p, _read_jsonl(p, dataset))
               for p in sorted(files) if p.parent.name == "generated"}
    judged = {p.stem: (p, _read_pickle(p, dataset))
              for p in files if p.parent.name == "chatgpt_results"}
    for path, rows in [*answers.values(), *judged.values()]:
        if not isinstance(rows, list) or len(rows) != len(questions):
            raise DataError(f"{path}: expected a list of {len(questions)} entries aligned "
                            f"with {questions_path.name}; {_refetch_hint(dataset)}")
    yield from _each(questions_path, enumerate(questions, start=1), dataset, "line",
                     lambda n, question: _korean_line(dataset, n - 1, question, answers, judged))


def _korean_line(dataset: str, index: int, question: dict[Any, Any],
                 answers: Mapping[str, tuple[Path, list[Any]]],
                 judged: Mapping[str, tuple[Path, Any]]) -> Iterator[Item]:
    instruction, qid = _text(question, "instruction"), _text(question, "id")
    instances = _list(question["instances"], "instances")
    if not instances:
        raise ValueError("instances is empty, expected one holding the reference output")
    instance = _obj(instances[0], "instances[0]")
    for model, (path, rows) in answers.items():
        row = _obj(rows[index], f"{path.name} line {index + 1}")
        if _text(row, "instruction") != instruction:
            raise ValueError(f"{path.name} line {index + 1} answers a different instruction")
        extra: dict[str, Any] = {"motivation_app": _text(question, "motivation_app"),
                                 "reference_output": _text(instance, "output")}
        if model in judged:
            recorded = judged[model][1][index]
            if not isinstance(recorded, str):
                raise ValueError(f"{model}.pkl entry {index} is not text")
            extra["recorded_judge"] = recorded
        yield Item(
            dataset=dataset, item_id=f"{qid}:{model}", group=qid, system=model, subset="",
            fields={"instruction": instruction, "input": _text(row, "input"),
                    "answer": _text(row, "answer")},
            human={}, annotators={}, metrics={}, extra=extra,
        )


def _colossalai(files: Sequence[Path], dataset: str) -> Iterator[Item]:
    """ColossalEval GPT-evaluation examples: 25 questions, subset = category."""
    def build(_: int, record: dict[Any, Any]) -> list[Item]:
        qid = str(_scalar(record, "id", int | str, "an integer or text id"))
        category = _text(record, "category")
        return [Item(
            dataset=dataset, item_id=qid, group=qid, system="", subset=category,
            fields={"question": _text(record, "instruction"),
                    "input": _text(record, "input"), "target": _text(record, "target"),
                    "output": _text(record, "output")},
            human={}, annotators={}, metrics={}, extra={"category": category},
        )]
    path, records = _json_list(files, "eval_*_examples.json", dataset)
    yield from _each(path, enumerate(records), dataset, "record", build)


LOADERS: Mapping[str, Loader | None] = {
    "openmeva": _openmeva, "tst_formality": _tst_formality, "summeval": _summeval,
    "geval_prompts": None, "bagel": _bagel, "korean_chat": _korean_chat,
    "colossalai_en": _colossalai, "colossalai_cn": _colossalai,
}
"""Registered data set -> its loader; None: a set of prompt files only (`load` refuses it)."""
