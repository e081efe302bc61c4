"""report.html: one self-contained page (no network at view time).

The data is prepared in Python (runner.report.pagedata) and embedded as JSON in a
`<script type="application/json">` block; a small hand-written script (templates/report.js)
draws it as inline SVG and fills the tables with `textContent` only, so no value from a data
set or a judge answer is ever parsed as HTML. Hand-rolled SVG instead of an inlined plotting
library keeps the page small and leaves nothing to fetch: with the charts sent as aggregates
and the item browser as a bounded sample, a ten-million-judgment study's page (25 judges x 4
aspects) is 0.66 MB and draws in ~1 s in headless chromium (bench/page.py). The JSON is
escaped so that `</script>` (or any `<`) inside a value cannot end the block: `<`, `>` and
`&` become `\\u003c`, `\\u003e`, `\\u0026`, which JSON.parse reads back.
The charts (templates/charts.js) are spliced into report.js's closure at `/*CHARTS*/`: one
script, two files of a readable size.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from runner.errors import ReportError

__all__ = ["embed_json", "read_page_data", "render"]

_OPEN = '<script type="application/json" id="report-data">'
_CLOSE = "</script>"


def _template(name: str) -> str:
    return resources.files("runner.report").joinpath("templates", name).read_text("utf-8")


def embed_json(data: Mapping[str, Any]) -> str:
    """JSON that is safe inside a script block: no `<`, `>` or `&` left literally.

    Args:
        data: the report's data.

    Returns:
        The JSON text.
    """
    text = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render(data: Mapping[str, Any]) -> bytes:
    """The page: template, style, script and data in one file.

    Args:
        data: the report's data (runner.report.pagedata).

    Returns:
        report.html's bytes.
    """
    page = _template("report.html")
    parts = {"TITLE": html.escape(f"{data.get('job', '')}: judge report"),
             "STYLE": _template("report.css"),
             "DATA": f"{_OPEN}{embed_json(data)}{_CLOSE}",
             "SCRIPT": _template("report.js").replace("/*CHARTS*/", _template("charts.js"), 1)}
    for name, value in parts.items():
        page = page.replace(f"<!--{name}-->", value, 1)
    return page.encode()


def read_page_data(path: Path) -> dict[str, Any]:
    """The data embedded in a report.html (the figures are drawn from it).

    Args:
        path: a report.html.

    Returns:
        The data it embeds.

    Raises:
        ReportError: The file cannot be read or holds no report data.
    """
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report ({exc.strerror}); run `judge report "
                          "JOB` to write it") from None
    start = text.find(_OPEN)
    end = text.find(_CLOSE, start)
    if start < 0 or end < 0:
        raise ReportError(f"{path}: no report data in this file; run `judge report JOB` to "
                          "rewrite it")
    data: dict[str, Any] = orjson.loads(text[start + len(_OPEN):end])
    return data
