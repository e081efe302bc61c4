"""The documentation cannot drift from the code: the job file reference is generated from the
loader's own key tables (tools/jobref.py, a MkDocs hook), so every key the loader accepts is
documented and a new one without a meaning stops the docs build; the tutorial's outputs are
what the commands print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.job.load import load_job
from tests.conftest import ROOT, JobWriter
from tests.fakeserver import ThreadedServer
from tools import jobref

JUDGE = str(Path(sys.executable).parent / "judge")


def test_every_key_the_loader_accepts_is_in_the_reference() -> None:
    text = jobref.render()
    sets = jobref.key_sets()
    assert ("_prompt", "r") in sets and "output_field" in sets[("_prompt", "r")]
    for section in jobref.SECTIONS:
        table = text.split(f"### {section.title}\n", 1)[1].split("\n### ", 1)[0]
        for key in sets[section.where]:
            assert f"| `{key}` | " in table, (section.title, key)
    prompts = text.split("### [[prompts]]\n", 1)[1].split("\n### ", 1)[0]
    assert "| `output_field` | Group mode" in prompts


def test_a_key_accepted_but_documented_nowhere_fails_the_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sets = jobref.key_sets()
    sets[("_limits", "r")] = sets[("_limits", "r")] | {"burst"}
    monkeypatch.setattr(jobref, "key_sets", lambda: sets)
    with pytest.raises(ValueError, match=r"\[limits\]\.burst: accepted by the loader, "
                                         "documented nowhere"):
        jobref.render()


def test_a_note_for_a_key_the_loader_dropped_fails_the_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(jobref.NOTES["[limits]"], "burst", ("Requests at once.", "1"))
    with pytest.raises(ValueError, match="does not accept"):
        jobref.render()


def test_the_hook_fills_only_its_marker() -> None:
    page = f"# Job file\n\n{jobref.MARKER}\n"
    assert "| `output_field` |" in jobref.on_page_markdown(page)
    assert jobref.on_page_markdown("# Other page\n") == "# Other page\n"


def test_output_field_the_reference_documents_is_what_the_loader_reads(
        write_job: JobWriter) -> None:
    path = write_job('[[datasets]]\nname = "d"\npath = "data.jsonl"\n'
                     '[datasets.fields]\ntext = {answer = "answer"}\n'
                     '[[prompts]]\nname = "p"\ntemplate = "t.txt"\nparser = "outputs"\n'
                     'aspects = ["a"]\nper = "group"\noutput_field = "answer"\n'
                     '[models.m]\nspec = "openai:gpt-4o-mini"\n',
                     rows=[{"answer": "x"}], files={"t.txt": "{{outputs}}"})
    assert load_job(path).prompts[0].output_field == "answer"


@pytest.mark.slow
def test_the_tutorial_shows_what_judge_run_prints(server: ThreadedServer,
                                                  tmp_path: Path) -> None:
    """The tutorial's outputs were pasted from real runs against the fake server: a change to
    what `judge run` or `judge rescore` prints makes this fail until the page is updated."""
    tutorial = (ROOT / "docs" / "tutorial.md").read_text()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    for command in ("run", "run", "rescore"):
        done = subprocess.run(
            [JUDGE, command, str(ROOT / "examples" / "my-data" / "job.toml"), "--model",
             "llama3.1", "--base-url", server.url], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        tail = [line for line in done.stderr.splitlines() if not line.startswith("[")]
        assert len(tail) == 7
        assert "\n".join(tail) in tutorial, f"judge {command} now prints:\n" + "\n".join(tail)
