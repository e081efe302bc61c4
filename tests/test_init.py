"""`judge init`: a job guessed from a data file, that `judge plan` accepts as written."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import pytest

from runner.data.scaffold import STARTERS, propose, write
from runner.errors import ConfigError
from tests.test_cli import clean_env, run_judge

SYSTEMS = ("tidy", "scrambled")


def small_csv(path: Path, *, raters: bool = True) -> Path:
    """10 documents x 2 systems, with two raters' fluency and a length column."""
    with path.open("w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "doc_id", "system", "source", "summary", "length",
                      *(["fluency_1", "fluency_2"] if raters else [])])
        for d in range(10):
            for n, s in enumerate(SYSTEMS):
                out.writerow([f"d{d}-{s}", f"d{d}", s, f"The news of day {d}.",
                              f"Summary {d} ({s})", 3 + d % 4,
                              *([1 + (d + n) % 5, 1 + (d * n) % 5] if raters else [])])
    return path


def test_the_guesses_name_each_role_and_the_job_maps_them(tmp_path: Path) -> None:
    proposal = propose(small_csv(tmp_path / "outputs.csv"), "number")
    assert proposal.job == tmp_path / "outputs.toml"
    assert proposal.prompt == tmp_path / "outputs-number.txt"
    assert proposal.guesses[:5] == [
        "id: column 'id' (unique in the first 20 rows)",
        "output (the judged text): column 'summary'", "input: column 'source'",
        "group: column 'doc_id'", "system: column 'system'"]
    assert "human fluency: columns 'fluency_1', 'fluency_2' (annotators: their mean, and " \
        "their agreement)" in proposal.guesses
    job = tomllib.loads(proposal.job_text)
    fields = job["datasets"][0]["fields"]
    assert fields == {"id": "id", "group": "doc_id", "system": "system",
                      "text": {"input": "source", "output": "summary"},
                      "human": {"fluency": ["fluency_1", "fluency_2"]}, "metrics": ["length"]}
    assert job["prompts"][0]["aspects"] == ["fluency"]
    assert job["prompts"][0]["parser_options"] == {"min": 1, "max": 10}
    assert "{{input}}" in proposal.prompt_text and "[input]" not in proposal.prompt_text
    assert not proposal.ratings


def test_without_human_columns_the_job_reads_a_ratings_file(tmp_path: Path) -> None:
    proposal = propose(small_csv(tmp_path / "o.csv", raters=False))
    fields = tomllib.loads(proposal.job_text)["datasets"][0]["fields"]
    assert fields["human"] == {"overall": {"ratings": "ratings.jsonl"}}
    assert proposal.ratings


def test_init_never_overwrites_a_job(tmp_path: Path) -> None:
    data = small_csv(tmp_path / "o.csv")
    (tmp_path / "o.toml").write_text("# mine\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"o.toml: already exists; judge init never "
                                          r"overwrites a file"):
        write(propose(data))
    assert (tmp_path / "o.toml").read_text(encoding="utf-8") == "# mine\n"
    assert not (tmp_path / "o-stars.txt").exists()


def test_pairwise_needs_a_group(tmp_path: Path) -> None:
    data = tmp_path / "flat.jsonl"
    data.write_text('{"answer": "a"}\n{"answer": "b"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="pairwise prompt compares the outputs of one group"):
        propose(data, "pairwise")


@pytest.mark.slow
@pytest.mark.parametrize("starter", list(STARTERS))
def test_judge_plan_accepts_the_job_init_writes(tmp_path: Path, data_dir: Path,
                                                starter: str) -> None:
    data = small_csv(tmp_path / "outputs.csv")
    env = clean_env(data_dir)
    made = run_judge("init", data, "--prompt", starter, env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "guessed group: column 'doc_id'" in made.stdout
    assert "judge plan " + str(tmp_path / "outputs.toml") in made.stdout
    plan = run_judge("plan", tmp_path / "outputs.toml", env=env, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "20 tasks" in plan.stdout, plan.stdout  # pairwise: 10 pairs, in both orders
    again = run_judge("init", data, "--prompt", starter, env=env, cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


def tst_formality_csv(data_dir: Path, path: Path) -> Path:
    """Two systems' outputs of the formality data (tst_formality/data/outputs/*.human.txt, TSV
    without a header: survey id, input, output, reference, then content, style and fluency of
    annotator 1 and of annotator 2) as one CSV with a header, as a researcher would have it."""
    roles = ["survey_id", "input", "output", "reference", "content_1", "style_1", "fluency_1",
             "content_2", "style_2", "fluency_2"]
    with path.open("w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "system", *roles])
        for system in ("BART", "HIGH"):
            source = data_dir / "tst_formality" / "data" / "outputs" / f"{system}.human.txt"
            lines = source.read_text(encoding="utf-8").splitlines()
            for n, line in enumerate(lines):
                out.writerow([f"{system}-{n}", system, *line.split("\t")[:len(roles)]])
    return path


@pytest.mark.slow
def test_init_on_a_csv_of_the_shared_formality_data(tmp_path: Path, data_dir: Path) -> None:
    data = tst_formality_csv(data_dir, tmp_path / "formality.csv")
    env = clean_env(data_dir)
    made = run_judge("init", data, env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    for guess in ("id: column 'id'", "output (the judged text): column 'output'",
                  "input: column 'input'", "group: column 'input'", "system: column 'system'",
                  "human content: columns 'content_1', 'content_2'",
                  "not used: 'survey_id', 'reference'"):
        assert f"guessed {guess}" in made.stdout, made.stdout
    job = tomllib.loads((tmp_path / "formality.toml").read_text(encoding="utf-8"))
    assert job["prompts"][0]["aspects"] == ["content", "style", "fluency"]
    plan = run_judge("plan", tmp_path / "formality.toml", env=env, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "job formality: 160 items" in plan.stdout
