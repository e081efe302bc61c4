"""Tests for runner.data.datasets: registered sets on the real files, user files, pickles, fetch."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import math
import os
import pickle
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.data import readers, userfile
from runner.data.datasets import (
    REGISTRY,
    FieldMap,
    Item,
    fetch,
    load,
    load_file,
    verify,
)
from runner.data.loaders import LOADERS
from runner.data.readers import safe_unpickle
from runner.errors import ConfigError, DataError

DATA_DIR = Path(os.environ.get("JUDGE_DATA_DIR")
                or Path(__file__).parents[2] / "shared" / "datasets")
OPENMEVA = REGISTRY["openmeva"].files[0]


@pytest.fixture(scope="module")
def data_dir() -> Path:  # module scope (overrides conftest's) so `items` loads once
    if not (DATA_DIR / OPENMEVA.path).is_file():
        pytest.fail(f"benchmark data not found under {DATA_DIR}: set JUDGE_DATA_DIR")
    return DATA_DIR


@pytest.fixture(scope="module")
def items(data_dir: Path) -> dict[str, list[Item]]:
    return {name: list(load(name, data_dir)) for name in REGISTRY if name != "geval_prompts"}


# ------------------------------------------------------------------ registry, verify


def test_registry_is_consistent() -> None:
    assert list(REGISTRY)[:5] == ["openmeva", "tst_formality", "summeval", "geval_prompts",
                                  "bagel"]
    for name, info in REGISTRY.items():
        assert info.name == name and info.files and info.license and info.description
        assert info.lower_is_better <= {"fwppl", "gpt2_ppl", "wmd"}
        for remote in info.files:
            assert len(remote.sha256) == 64 and remote.size > 0
            assert remote.url.startswith("https://raw.githubusercontent.com/")
            assert len(remote.url.split("/")[5]) == 40  # pinned to a commit


def test_verify_real_files_ok(data_dir: Path) -> None:
    for name in REGISTRY:
        assert {status for _, status in verify(name, data_dir)} == {"ok"}, name


def test_verify_reports_missing_and_mismatch(tmp_path: Path, data_dir: Path) -> None:
    assert verify("openmeva", tmp_path) == [(OPENMEVA.path, "missing")]
    copy = tmp_path / OPENMEVA.path
    copy.parent.mkdir(parents=True)
    shutil.copyfile(data_dir / OPENMEVA.path, copy)
    assert verify("openmeva", tmp_path) == [(OPENMEVA.path, "ok")]
    data = bytearray(copy.read_bytes())
    data[100] ^= 1  # same size, different bytes
    copy.write_bytes(bytes(data))
    assert verify("openmeva", tmp_path) == [(OPENMEVA.path, "sha256 mismatch")]


def test_unknown_dataset_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown data set 'nope'.*openmeva"):
        load("nope", tmp_path)


def test_missing_files_name_path_and_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load("openmeva", tmp_path)
    message = str(info.value)
    assert str(tmp_path / OPENMEVA.path) in message
    assert "judge datasets fetch openmeva" in message and "JUDGE_DATA_DIR" in message
    assert "\n" not in message


def test_geval_prompts_has_files_but_no_items(data_dir: Path) -> None:
    names = [Path(f.path).name for f in REGISTRY["geval_prompts"].files]
    assert names == [f"{a}_detailed.txt" for a in ("coh", "con", "flu", "rel")]
    with pytest.raises(ConfigError, match="prompt files, not items"):
        load("geval_prompts", data_dir)


# ------------------------------------------------------------------ registered sets


def _check_common(name: str, loaded: list[Item]) -> None:
    info = REGISTRY[name]
    assert len({item.item_id for item in loaded}) == len(loaded)
    for item in loaded:
        assert item.dataset == name
        assert tuple(item.fields) == info.fields
        assert set(item.human) == set(info.aspects)
        assert all(isinstance(v, float) for v in item.human.values())
        assert item.subset in info.subsets or (item.subset == "" and not info.subsets)


@pytest.mark.parametrize("name,count,groups", [
    ("openmeva", 1000, 200), ("tst_formality", 720, 80), ("summeval", 1600, 100),
    ("bagel", 404, 202), ("korean_chat", 1764, 252), ("colossalai_en", 25, 25),
    ("colossalai_cn", 25, 25),
])
def test_counts(items: dict[str, list[Item]], name: str, count: int, groups: int) -> None:
    loaded = items[name]
    assert len(loaded) == count
    assert len({item.group for item in loaded}) == groups
    _check_common(name, loaded)


def test_openmeva_values(items: dict[str, list[Item]]) -> None:
    first = items["openmeva"][0]
    assert (first.item_id, first.group, first.system) == ("125:fusion", "125", "fusion")
    assert first.human == {"overall": 2.2}
    assert first.fields["beginning"] == "[FEMALE] loved watching reality shows ."
    assert first.fields["storyline"].startswith("one day , a car passed her on her lawn .")
    assert first.metrics["*"]["chatgpt"] == 3.0
    assert first.metrics["*"]["fwppl"] == pytest.approx(61.263240814208984)
    assert "human" not in first.metrics["*"] and len(first.metrics["*"]) == 19
    assert [item.system for item in items["openmeva"][:5]] == [
        "fusion", "s2s", "gpt_kg", "gpt", "plan_write"]
    assert REGISTRY["openmeva"].lower_is_better == {"fwppl"}


def test_tst_formality_structure(items: dict[str, list[Item]]) -> None:
    loaded = items["tst_formality"]
    systems = ["bart", "high", "ibt", "luo", "niu", "rao", "ref", "yi", "zhou"]
    assert [item.system for item in loaded[:9]] == systems
    assert Counter(item.subset for item in loaded) == {"informal->formal": 360,
                                                       "formal->informal": 360}
    assert {i.subset for i in loaded if int(i.group) < 40} == {"informal->formal"}
    first = loaded[0]
    assert (first.item_id, first.group, first.extra) == ("0:bart", "0", {"line": 0})
    assert first.fields == {"source": "it all depends on when ur ready.",
                            "output": "It depends on when you are ready.",
                            "reference": "It all depends on when you are ready."}
    assert first.annotators["content"] == (62.4, 77.3)
    assert first.human["content"] == pytest.approx(69.85)
    assert set(first.metrics["style"]) == {"r-pt16", "c-pt16", "c-gyafc", "chatgpt",
                                           "chatgpt_multi"}
    assert set(first.metrics["fluency"]) == {"gpt2_ppl", "chatgpt", "chatgpt_multi"}
    assert "chatgpt_multi" not in first.metrics["content_ref"]
    assert {"comet-20-both", "comet-22-all"} <= set(first.metrics["content_ref"])
    for item in loaded:
        assert item.human["content_ref"] == item.human["content"]
        assert item.annotators["content_ref"] == item.annotators["content"]
        assert item.metrics["content_ref"]["chatgpt"] == item.metrics["content"]["chatgpt"]
        if item.system == "ref":
            assert item.fields["output"] == item.fields["reference"]


def test_summeval_values(items: dict[str, list[Item]]) -> None:
    first = items["summeval"][0]
    assert first.group == "dm-test-8764fb95bfad8ee849274873a92fb8d6b400eee2"
    assert first.item_id == first.group + ":M11"
    assert first.human == pytest.approx({"coherence": 4 / 3, "consistency": 1.0,
                                         "fluency": 3.0, "relevance": 5 / 3})
    assert first.fields["document"].startswith("Paul Merson has restarted his row")
    assert len(first.extra["references"]) == 11
    assert first.extra["references"][0] == first.fields["reference"]
    assert len({item.system for item in items["summeval"]}) == 16


def test_bagel_values(items: dict[str, list[Item]]) -> None:
    first = items["bagel"][0]
    assert (first.item_id, first.system) == ("0", "")
    assert first.group == first.fields["mr"] == "inform(name=none,area=citycentre,near='X')"
    assert first.fields["text"] == "There is sorry no information matching constraints near X ."
    assert first.human == {"informativeness": 6.0, "naturalness": 4.0, "quality": 5.0}
    assert len(first.extra["references"]) == 18


def test_korean_chat_values(items: dict[str, list[Item]]) -> None:
    loaded = items["korean_chat"]
    first = loaded[0]
    assert (first.item_id, first.group) == ("user_oriented_task_0:gpt_3_5_turbo_0125",
                                            "user_oriented_task_0")
    assert first.human == {} and first.extra["motivation_app"] == "Grammarly"
    judged = Counter(item.system for item in loaded if "recorded_judge" in item.extra)
    assert set(judged) == {"gpt_3_5_turbo_0125", "gpt_4_0125_preview", "koalpaca_v1_1b",
                           "kullm3", "kullm_v2", "upstage-solar"}  # no pkl for kullm_v3
    assert all(count == 252 for count in judged.values())
    kullm3 = next(item for item in loaded if item.system == "kullm3")
    assert kullm3.extra["recorded_judge"].startswith("- Fluency (1-5): 5\n")


def test_colossalai_values(items: dict[str, list[Item]]) -> None:
    first = items["colossalai_en"][0]
    assert first.fields == {"question": "Which are some popular fiction books that I should "
                                        "read?", "input": "", "target": "", "output": ""}
    assert (first.item_id, first.subset, first.extra) == ("1", "brainstorming",
                                                          {"category": "brainstorming"})
    assert items["colossalai_cn"][0].fields["question"] == "列举一些可以促进头发生长的食物。"


def test_load_options(data_dir: Path) -> None:
    loaded = list(load("tst_formality", data_dir,
                       options={"subsets": ["formal->informal"], "systems": ["ref", "bart"]}))
    assert len(loaded) == 80 and loaded[0].item_id == "40:bart"
    with pytest.raises(ConfigError, match="unknown option 'limit'"):
        load("openmeva", data_dir, options={"limit": 3})
    with pytest.raises(ConfigError, match="unknown subset 'x'"):
        load("tst_formality", data_dir, options={"subsets": ["x"]})
    with pytest.raises(ConfigError, match="no item has system 'bert'"):
        list(load("openmeva", data_dir, options={"systems": ["bert"]}))


def test_corrupt_registered_file_is_data_error(tmp_path: Path) -> None:
    path = tmp_path / OPENMEVA.path
    path.parent.mkdir(parents=True)
    path.write_text('[{"doc_id": "1", "prompt": "p", "reference": "r"}]')
    with pytest.raises(DataError, match=r"record 0 has no field 'gen'.*verify openmeva"):
        list(load("openmeva", tmp_path))
    path.write_text("[{")
    with pytest.raises(DataError, match="not valid JSON"):
        list(load("openmeva", tmp_path))


def test_unreadable_pickle_names_the_file_and_fix_once(tmp_path: Path) -> None:
    path = tmp_path / "data.pkl"
    path.mkdir()  # unreadable as a file, for root too
    loader = LOADERS["summeval"]
    assert loader is not None
    with pytest.raises(DataError) as info:
        list(loader([path], "summeval"))
    assert str(info.value) == (f"{path}: cannot read (Is a directory); check it with "
                               "`judge datasets verify summeval` and re-fetch")


def test_korean_chat_empty_instances_is_data_error(tmp_path: Path) -> None:
    path = tmp_path / "user_oriented_instructions_eval.jsonl"
    path.write_text('{"id": "q1", "instruction": "i", "instances": []}\n', encoding="utf-8")
    loader = LOADERS["korean_chat"]
    assert loader is not None
    with pytest.raises(DataError) as info:
        list(loader([path], "korean_chat"))
    assert str(info.value) == (f"{path}: line 1: instances is empty, expected one holding the "
                               "reference output; check it with `judge datasets verify "
                               "korean_chat` and re-fetch")


# ------------------------------------------------------------------ user files

ROWS: list[dict[str, Any]] = [
    {"id": "a", "doc": "d1", "sys": "s1", "src": "Format {this} {{x}}", "out": "o1",
     "h1": 4, "h2": 5, "flu": 3.5, "bleu": 0.5, "ppl": 12.0},
    {"id": "b", "doc": "d1", "sys": "s2", "src": "Format {this} {{x}}", "out": "{0}",
     "h1": 2, "h2": 2, "flu": 1, "bleu": 0.25, "ppl": 30.0},
]
MAPPING = FieldMap(id="id", group="doc", system="sys", text={"source": "src", "output": "out"},
                   human={"overall": ("h1", "h2"), "fluency": "flu"},
                   metrics=("bleu", "ppl"), lower_is_better=("ppl",))


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    else:
        header = list(rows[0])
        lines = [",".join(header)] + [",".join(f'"{row[k]}"' for k in header) for row in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".json"])
def test_load_file_formats(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"mine{suffix}", ROWS)
    loaded = list(load_file(path, MAPPING, dataset="mine"))
    assert [item.item_id for item in loaded] == ["a", "b"]
    first, second = loaded
    assert (first.dataset, first.group, first.system, first.subset) == ("mine", "d1", "s1", "")
    assert first.fields == {"source": "Format {this} {{x}}", "output": "o1"}
    assert second.fields["output"] == "{0}"
    assert first.human == {"overall": 4.5, "fluency": 3.5}
    assert first.annotators == {"overall": (4.0, 5.0)}
    assert second.metrics == {"*": {"bleu": 0.25, "ppl": 30.0}}


def test_load_file_defaults_and_explicit_format(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", ROWS)
    renamed = path.rename(tmp_path / "rows.txt")
    mapping = FieldMap(text={"output": "out"}, human={}, format="jsonl")
    loaded = list(load_file(renamed, mapping, dataset="d"))
    assert [(i.item_id, i.group, i.system) for i in loaded] == [("0", "0", ""), ("1", "1", "")]
    assert loaded[0].human == {} and loaded[0].metrics == {}
    with pytest.raises(ConfigError, match=r"rows\.txt.*set format"):
        load_file(renamed, FieldMap(text={"output": "out"}, human={}), dataset="d")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=4), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(_JSON)
def test_json_reads_exactly_what_the_standard_library_reads(value: Any) -> None:
    """Lines go through orjson where it can: the values must be json.loads's, type and bits
    (ints past 64 bits stay ints, NaN and Infinity and lone surrogates still load)."""
    line = json.dumps(value).encode()
    got, want = readers.loads(line), json.loads(line)
    assert repr(got) == repr(want)


def test_json_nested_deeper_than_the_check_goes_loads_as_json_reads_it() -> None:
    line = b"[" * 700 + b"1" + b"]" * 700
    assert readers.loads(line) == json.loads(line)


def test_user_file_values_past_orjson_load_as_json_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 123456789012345678901234567890, "out": "\\ud800", '
                     b'"h": NaN}\n{"id": -9999999999999999999, "out": "x", "h": 1e19}\n')
    mapping = FieldMap(text={"output": "out"}, human={}, id="id")
    ids = [item.item_id for item in load_file(path, mapping, dataset="d")]
    assert ids == ["123456789012345678901234567890", "-9999999999999999999"]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".json"])
def test_load_file_missing_column(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"mine{suffix}", ROWS)
    mapping = FieldMap(text={"output": "answer"}, human={})
    with pytest.raises(ConfigError) as info:
        list(load_file(path, mapping, dataset="mine"))
    assert str(path) in str(info.value) and "'answer'" in str(info.value)
    assert "text.output" in str(info.value) and "fix the field mapping" in str(info.value)


def test_repeated_ids_are_found_exactly_when_every_hash_collides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids are remembered as 64-bit hashes; a hash seen before is checked against the file,
    so colliding hashes of distinct ids pass and only a real repeat is an error."""
    monkeypatch.setattr(userfile, "_id64", lambda item_id: 0)
    rows = [{**ROWS[0], "id": name} for name in ("a", "b", 7, "c")]
    distinct = _write(tmp_path / "distinct.jsonl", rows)
    assert [it.item_id for it in load_file(distinct, MAPPING, dataset="x")] == ["a", "b", "7",
                                                                                "c"]
    repeated = _write(tmp_path / "repeated.jsonl", [*rows, {**ROWS[1], "id": "7"}])
    with pytest.raises(DataError, match=r"repeated\.jsonl:5: item id '7'.*repeats the one at "
                                        r".*repeated\.jsonl:3;"):
        list(load_file(repeated, MAPPING, dataset="x"))


def test_equal_values_of_consecutive_items_are_held_once(tmp_path: Path) -> None:
    """A run holds every item: a group's shared source text, names and scores are one object
    each, items without annotators or metrics share one empty mapping; values stay as read."""
    doc = "A long document. " * 50
    rows = [{"id": f"i{n}", "doc": "d1", "sys": f"s{n % 2}", "src": doc, "out": f"o{n}",
             "h1": 4, "h2": 5, "flu": -0.0 if n == 2 else 3.5, "bleu": 0.5, "ppl": 12.0}
            for n in range(4)]
    path = _write(tmp_path / "shared.jsonl", rows)
    items = list(load_file(path, MAPPING, dataset="x"))
    a, b, c, d = items
    assert [it.fields["source"] for it in items] == [doc] * 4
    assert a.fields["source"] is b.fields["source"] is d.fields["source"]
    assert a.system is c.system and b.system is d.system and a.group is d.group
    assert a.human["fluency"] is b.human["fluency"] and a.human == {"overall": 4.5,
                                                                    "fluency": 3.5}
    assert math.copysign(1, c.human["fluency"]) == -1  # -0.0 is not turned into 0.0
    plain = list(load_file(path, FieldMap(id="id", text={"o": "out"}, human={}), dataset="x"))
    assert plain[0].annotators == plain[0].metrics == plain[0].extra == {}
    assert plain[0].annotators is plain[1].metrics is plain[1].extra


def test_load_file_bad_rows(tmp_path: Path) -> None:
    later = _write(tmp_path / "later.jsonl", [ROWS[0], {k: v for k, v in ROWS[1].items()
                                                         if k != "flu"}])
    with pytest.raises(DataError, match=r"later\.jsonl:2: column 'flu'"):
        list(load_file(later, MAPPING, dataset="x"))
    text = _write(tmp_path / "text.jsonl", [{**ROWS[0], "flu": "good"}])
    with pytest.raises(DataError, match="'good', not a finite number"):
        list(load_file(text, MAPPING, dataset="x"))
    dup = _write(tmp_path / "dup.csv", [ROWS[0], ROWS[0]])
    with pytest.raises(DataError,
                       match=r"dup\.csv:3: item id 'a'.*repeats the one at .*dup\.csv:2;"):
        list(load_file(dup, MAPPING, dataset="x"))
    with pytest.raises(DataError, match="file not found"):
        load_file(tmp_path / "absent.csv", MAPPING, dataset="x")
    with pytest.raises(ConfigError, match="'bleu', which is not among the metric"):
        load_file(dup, FieldMap(text={"o": "out"}, human={}, lower_is_better=("bleu",)),
                  dataset="x")


# ------------------------------------------------------------------ pickles


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/tmp/judge_runner_pickle_marker_should_not_exist")


def test_safe_unpickle_plain_data() -> None:
    value = {"a": [1, 2.5, None, True], "b": ("x", b"\x00\xff"), 3: {"nested": []}}
    for protocol in range(3, pickle.HIGHEST_PROTOCOL + 1):
        assert safe_unpickle(pickle.dumps(value, protocol=protocol)) == value
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert safe_unpickle(pickle.dumps(cyclic))[0][0] is not None


@pytest.mark.parametrize("payload", [
    pickle.dumps(_Boom(), protocol=0), pickle.dumps(_Boom()),
    pickle.dumps(os.system), pickle.dumps(ValueError("x")), pickle.dumps({1, 2}),
    pickle.dumps(bytearray(b"x"), protocol=5), b"cos\nsystem\n(S'true'\ntR.",
    b"not a pickle", pickle.dumps([1, 2])[:-3],
])
def test_safe_unpickle_refuses(payload: bytes) -> None:
    MARKER.unlink(missing_ok=True)
    with pytest.raises(DataError, match="pickle refused"):
        safe_unpickle(payload)
    assert not MARKER.exists()


# ------------------------------------------------------------------ fetch


@pytest.fixture
def mirror(tmp_path: Path, data_dir: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """Serve a throwaway copy of openmeva.json at OWNER/REPO/COMMIT/PATH on 127.0.0.1."""
    root = tmp_path / "served"
    served = root / OPENMEVA.url.removeprefix("https://raw.githubusercontent.com/")
    served.parent.mkdir(parents=True)
    shutil.copyfile(data_dir / OPENMEVA.path, served)
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep pytest output clean

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served, requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


def test_fetch_downloads_verifies_and_skips(tmp_path: Path,
                                            mirror: tuple[str, Path, list[str]]) -> None:
    url, served, requests = mirror
    data = tmp_path / "data"
    assert fetch("openmeva", data, mirror=url) == [data / OPENMEVA.path]
    assert hashlib.sha256((data / OPENMEVA.path).read_bytes()).hexdigest() == OPENMEVA.sha256
    assert _files(data) == [data / OPENMEVA.path]
    assert verify("openmeva", data) == [(OPENMEVA.path, "ok")]
    assert len(list(load("openmeva", data))) == 1000
    assert fetch("openmeva", data, mirror=url) == [] and len(requests) == 1
    (data / OPENMEVA.path).write_bytes(b"damaged")  # a corrupt local copy is replaced
    assert fetch("openmeva", data, mirror=url + "/") == [data / OPENMEVA.path]
    assert verify("openmeva", data) == [(OPENMEVA.path, "ok")]


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_fetch_corrupt_download_leaves_nothing(tmp_path: Path, damage: str,
                                               mirror: tuple[str, Path, list[str]]) -> None:
    url, served, _ = mirror
    body = bytearray(served.read_bytes())
    if damage == "flip":
        body[-10] ^= 1
    elif damage == "truncate":
        del body[-10:]
    else:
        body += b" "
    served.write_bytes(bytes(body))
    data = tmp_path / "data"
    with pytest.raises(DataError) as info:
        fetch("openmeva", data, mirror=url)
    assert url in str(info.value) and "\n" not in str(info.value)
    assert _files(data) == []


def test_fetch_http_error_and_bad_mirror(tmp_path: Path,
                                         mirror: tuple[str, Path, list[str]]) -> None:
    url, served, _ = mirror
    served.unlink()
    with pytest.raises(DataError, match="HTTP 404"):
        fetch("openmeva", tmp_path / "data", mirror=url)
    assert _files(tmp_path / "data") == []
    with pytest.raises(ConfigError, match="mirror"):
        fetch("openmeva", tmp_path / "data", mirror="ftp://example.org")
