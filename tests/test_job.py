"""Tests for runner.job.load: job files load into frozen dataclasses; bad input names file and
key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from runner.errors import ConfigError
from runner.job.bill import Price
from runner.job.load import load_job
from runner.job.models import parse_model_spec
from runner.job.providers import KINDS
from runner.job.spec import Job, Limits
from tests.conftest import ROOT, JobWriter

OPENAI_BASE_URL = KINDS["openai"].base_url

PROMPT = "Rate {{output}} for {{aspect}}.\n"
ROWS = [{"id": "a", "output": "one", "score": 3}]

VALID = """
name = "mini"
seed = 7

[limits]
concurrency = 4
rpm = 120
tpm = 6000.5
max_retries = 2
timeout_s = 5

[[datasets]]
name = "mine"
path = "data.jsonl"
fields = { id = "id", text = { output = "output" }, human = { overall = "score" } }

[[datasets]]
name = "openmeva"

[[prompts]]
name = "stars"
template = "prompt.txt"
system = "You are a judge."
parser = "stars"
aspects = ["overall", "fluency"]
datasets = ["mine"]
params = { temperature = 0, max_tokens = 8 }
samples = 2

[models.gpt]
spec = "openai:gpt-4o-mini"
api_key_env = "MY_KEY"
params = { seed = 1 }
price = { input = 0.15, output = 0.6 }

[models.small]
spec = "local:smollm2"

[models.vllm]
spec = "Qwen/Qwen2.5-7B-Instruct"
base_url = "http://127.0.0.1:8000/v1/"
rpm = 30
"""


def _load(write_job: JobWriter, toml: str) -> Job:
    return load_job(write_job(toml, rows=ROWS, files={"prompt.txt": PROMPT}))


def _error(write_job: JobWriter, toml: str) -> str:
    path = write_job(toml, rows=ROWS, files={"prompt.txt": PROMPT})
    with pytest.raises(ConfigError) as info:
        load_job(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    return message


def test_valid_file_loads(write_job: JobWriter) -> None:
    job = _load(write_job, VALID)
    folder = job.path.parent
    assert job.name == "mini" and job.seed == 7 and job.policy == "skip"
    assert job.limits == Limits(concurrency=4, rpm=120, tpm=6000.5, max_retries=2, timeout_s=5.0)
    mine, meva = job.datasets
    assert mine.name == "mine" and mine.path == folder / "data.jsonl"  # relative to the job
    assert mine.fields["text"] == {"output": "output"}
    assert meva.name == "openmeva" and meva.path is None
    (prompt,) = job.prompts
    assert prompt.templates == {"*": PROMPT} and prompt.template("fluency") == PROMPT
    assert prompt.system == "You are a judge." and prompt.parser == "stars"
    assert prompt.aspects == ("overall", "fluency") and prompt.datasets == ("mine",)
    assert prompt.params == {"temperature": 0, "max_tokens": 8} and prompt.samples == 2
    gpt, small, vllm = job.models
    assert (gpt.name, gpt.kind, gpt.model, gpt.base_url) == ("gpt", "openai", "gpt-4o-mini",
                                                             OPENAI_BASE_URL)
    assert gpt.api_key_env == "MY_KEY" and gpt.key_required
    assert gpt.price == Price(input=0.15, output=0.6)
    assert gpt.params == {"seed": 1}
    assert (small.kind, small.model, small.base_url, small.endpoint) == (
        "local", "smollm2", None, "local:smollm2")
    assert (vllm.kind, vllm.model, vllm.rpm) == ("compatible", "Qwen/Qwen2.5-7B-Instruct", 30)
    assert vllm.endpoint == "http://127.0.0.1:8000/v1"  # trailing slash does not split the cache
    assert job.output_dir == Path("runs/mini")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.name = "other"  # type: ignore[misc]


def test_example_job_loads() -> None:
    job = load_job(ROOT / "jobs" / "openmeva.toml")
    assert [d.name for d in job.datasets] == ["openmeva"]
    assert job.limits.concurrency == 8 and job.limits.rpm == 3000
    assert "{{beginning}}" in job.prompts[0].template("overall")
    assert [m.kind for m in job.models] == ["local"]


def test_missing_job_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="job file not found"):
        load_job(tmp_path / "nope.toml")


def test_malformed_toml(write_job: JobWriter) -> None:
    message = _error(write_job, VALID + "\n[limits\nrpm = 1\n")
    assert "not valid TOML" in message and "line" in message


@pytest.mark.parametrize(("old", "new", "where"), [
    ("seed = 7", "seed = 7\nseeds = 1", "seeds is not a known key"),
    ("rpm = 120", "rpm = 120\nrps = 2", "limits.rps is not a known key"),
    ('name = "mine"', 'name = "mine"\npth = "x"', "datasets[0].pth is not a known key"),
    ('parser = "stars"', 'parser = "stars"\ntempalte = "x"', "prompts[0].tempalte is not a"),
    ('api_key_env = "MY_KEY"', 'api_key_env = "MY_KEY"\nkey = "sk-x"',
     "models.gpt.key is not a known key"),
    ("price = { input = 0.15, output = 0.6 }", "price = { input = 0.15, outptu = 0.6 }",
     "models.gpt.price.outptu is not a known key"),
])
def test_unknown_key_names_its_path(write_job: JobWriter, old: str, new: str, where: str) -> None:
    message = _error(write_job, VALID.replace(old, new, 1))
    assert where in message and "use one of" in message


def test_missing_models(write_job: JobWriter) -> None:
    toml = VALID.split("[models.gpt]")[0]
    assert "models.missing" not in toml
    assert "models is missing" in _error(write_job, toml)
    assert "models is empty" in _error(write_job, toml + "[models]\n")


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("rpm = 120", "rpm = 0", "limits.rpm must be a positive number (got 0)"),
    ("tpm = 6000.5", "tpm = -1", "limits.tpm must be a positive number (got -1)"),
    ("concurrency = 4", "concurrency = 0", "limits.concurrency must be a positive integer"),
    ("concurrency = 4", "concurrency = 2.5", "limits.concurrency must be int (got 2.5)"),
    ("max_retries = 2", "max_retries = -1", "limits.max_retries must be 0 or more (got -1)"),
    ("timeout_s = 5", "timeout_s = true", "limits.timeout_s must be int or float (got True)"),
    ("samples = 2", "samples = 0", "prompts[0].samples must be a positive integer (got 0)"),
])
def test_bad_numbers(write_job: JobWriter, old: str, new: str, expected: str) -> None:
    assert expected in _error(write_job, VALID.replace(old, new, 1))


@pytest.mark.parametrize(("line", "expected"), [
    ("rpm = 0", "models.vllm.rpm must be a positive number (got 0)"),
    ("tpm = -1", "models.vllm.tpm must be a positive number (got -1)"),
    ('mode = "async"', "models.vllm.mode must be \"online\" or \"batch\" (got 'async')"),
    ("batch_discount = 1", "models.vllm.batch_discount must be the share of the online price "
                           "saved, from 0 up to (not including) 1, e.g. 0.5 (got 1)"),
])
def test_model_value_errors_name_the_file_and_key_once(write_job: JobWriter, tmp_path: Path,
                                                        line: str, expected: str) -> None:
    message = _error(write_job, VALID.replace("rpm = 30", line, 1))
    assert message == f"{tmp_path / 'job' / 'job.toml'}: {expected}"


def test_unknown_template_file(write_job: JobWriter) -> None:
    message = _error(write_job, VALID.replace('"prompt.txt"', '"nope.txt"'))
    assert "prompts[0].template points to" in message and "nope.txt" in message


def test_inline_templates_are_the_template_itself(write_job: JobWriter) -> None:
    inline = 'Rate this story:\n{{output}}\nStars:'
    toml = VALID.replace('template = "prompt.txt"', f'template = """{inline}"""')
    one_line = VALID.replace('template = "prompt.txt"', 'template = "Stars for {{output}}?"')
    assert _load(write_job, toml).prompts[0].template("overall") == inline
    assert _load(write_job, one_line).prompts[0].template("overall") == "Stars for {{output}}?"


def test_template_per_aspect(write_job: JobWriter) -> None:
    toml = VALID.replace('template = "prompt.txt"',
                         'template = { overall = "prompt.txt", fluency = "fluency.txt" }')
    path = write_job(toml, rows=ROWS, files={"prompt.txt": PROMPT, "fluency.txt": "F {{output}}"})
    prompt = load_job(path).prompts[0]
    assert prompt.template("overall") == PROMPT and prompt.template("fluency") == "F {{output}}"
    toml = VALID.replace('template = "prompt.txt"', 'template = { overall = "prompt.txt" }')
    assert "prompts[0].template has no template for aspect(s) fluency" in _error(write_job, toml)
    toml = VALID.replace('template = "prompt.txt"',
                         'template = { overall = "prompt.txt", fluency = "gone.txt" }')
    assert "prompts[0].template.fluency points to" in _error(write_job, toml)


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("params = { temperature = 0, max_tokens = 8 }", 'params = { model = "x" }',
     "prompts[0].params.model is set by the runner; remove it"),
    ("params = { temperature = 0, max_tokens = 8 }", "params = { stream = true }",
     "prompts[0].params.stream is set by the runner"),
    ("params = { seed = 1 }", "params = { messages = [] }",
     "models.gpt.params.messages is set by the runner"),
    ("params = { temperature = 0, max_tokens = 8 }", "params = { n = 0 }",
     "prompts[0].params.n must be a positive integer (got 0)"),
    ("params = { temperature = 0, max_tokens = 8 }", 'params = { max_tokens = "64" }',
     "prompts[0].params.max_tokens must be a positive integer (got '64')"),
])
def test_reserved_and_bad_params(write_job: JobWriter, old: str, new: str, expected: str) -> None:
    assert expected in _error(write_job, VALID.replace(old, new, 1))


def test_prompt_datasets_must_name_a_job_dataset(write_job: JobWriter) -> None:
    message = _error(write_job, VALID.replace('datasets = ["mine"]', 'datasets = ["mien"]'))
    assert "prompts[0].datasets names 'mien', which is not a data set of this job" in message
    assert "mine, openmeva" in message


def test_unknown_parser(write_job: JobWriter) -> None:
    message = _error(write_job, VALID.replace('parser = "stars"', 'parser = "strs"'))
    assert "prompts[0].parser" in message and "'strs'" in message


@pytest.mark.parametrize("table", ["datasets", "prompts"])
def test_duplicate_names(write_job: JobWriter, table: str) -> None:
    if table == "datasets":
        toml = VALID.replace('name = "openmeva"', 'name = "mine"\npath = "data.jsonl"\n'
                             'fields = { text = { output = "output" } }')
    else:
        toml = VALID.replace("[models.gpt]", '[[prompts]]\nname = "stars"\ntemplate = '
                             '"prompt.txt"\nparser = "number"\naspects = ["x"]\n\n[models.gpt]')
    message = _error(write_job, toml)
    assert f"{table} has two entries named" in message


def test_file_dataset_needs_fields(write_job: JobWriter) -> None:
    toml = VALID.replace(
        'fields = { id = "id", text = { output = "output" }, human = { overall = "score" } }', "")
    assert "datasets[0].fields is missing" in _error(write_job, toml)


def test_model_spec_errors_name_the_model(write_job: JobWriter) -> None:
    assert "models.vllm.spec" in _error(write_job, VALID.replace(
        '"Qwen/Qwen2.5-7B-Instruct"', '" "'))
    assert "models.vllm.spec is missing" in _error(write_job, VALID.replace(
        'spec = "Qwen/Qwen2.5-7B-Instruct"', ""))
    assert "models.small must be a table" in _error(write_job, VALID.replace(
        '[models.small]\nspec = "local:smollm2"', '[models]\nsmall = "local:smollm2"'))


@pytest.mark.parametrize(("spec", "kind", "model", "base_url"), [
    ("openai:gpt-4o", "openai", "gpt-4o", OPENAI_BASE_URL),
    ("local:smollm2", "local", "smollm2", None),
    ("llama3.1:8b", "compatible", "llama3.1:8b", "http://h:1/v1"),  # an Ollama tag is no prefix
    ("Qwen/Qwen2.5-7B-Instruct", "compatible", "Qwen/Qwen2.5-7B-Instruct", "http://h:1/v1"),
])
def test_parse_model_spec(spec: str, kind: str, model: str, base_url: str | None) -> None:
    parsed = parse_model_spec(spec, base_url="http://h:1/v1" if kind == "compatible" else None)
    assert (parsed.kind, parsed.model, parsed.base_url, parsed.name) == (kind, model, base_url,
                                                                         spec)
    assert parsed.key_required == (kind == "openai")


def test_parse_model_spec_openai_base_url_override() -> None:
    spec = parse_model_spec("openai:gpt-4o", name="j", base_url="http://proxy/v1")
    assert spec.base_url == "http://proxy/v1" and spec.name == "j" and spec.key_required


@pytest.mark.parametrize("spec", ["", "  ", "openai:", "local:"])
def test_parse_model_spec_rejects_empty_names(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"(openai|local):NAME"):
        parse_model_spec(spec)
