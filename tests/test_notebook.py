"""examples/notebook.ipynb runs from top to bottom in a real kernel (nbclient), so it cannot rot:
it starts the fake server, runs the two-judge study through runner's API, compares the judges,
draws its figure, and stops the server it started."""

from __future__ import annotations

import re
import socket
import time

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT

NOTEBOOK = ROOT / "examples" / "notebook.ipynb"


def _text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell.get("outputs", []))


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_notebook_runs_the_study_plots_and_stops_its_server() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    started = time.monotonic()
    # The kernel is this interpreter's (ipykernel's own spec); nbclient shuts it down at the end.
    NotebookClient(notebook, timeout=30, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    assert time.monotonic() - started < 60
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    printed = "\n".join(_text(c) for c in code)
    assert "40 calls, 0 cached" in printed  # the first run called every task ...
    assert re.search(r"^40$", printed, re.M)  # ... the second found all 40 in the cache
    assert "gpt-4o-mini/stars" in printed and "gpt-4o-mini/rubric" in printed
    figures = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 1
    url = re.search(r"fake judge at http://127\.0\.0\.1:(\d+)/v1", printed)
    assert url is not None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(url[1])), 2):
        pass  # the last cell stopped the server
