"""The desk's pages as HTML text: every value escaped, the report's own style sheet.

Pages are built on the server from the runs' files (no JavaScript build step); the only script
is the item browser's few lines that fetch one judgment's request and answer on a click. Every
figure is formatted by the function the CLI prints it with (runner.report.diff.number), so a
served page shows the CLI's digits.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from runner.report.diff import RunDiff, number
from runner.report.kept import RUN_COLUMNS, run_row
from runner.serve.desk import RunInfo

__all__ = ["cell", "diff_page", "index_page", "layout", "link", "run_page", "table"]

NUMERIC = frozenset({"tasks", "calls", "cost", "disk"})
"""The columns of `judge runs` right-aligned on the page."""
_STYLE = """
.runs td input { margin: 0 4px; } .pair { display: flex; gap: 10px; }
.pair iframe, .report { width: 100%; height: 80vh; border: 1px solid #d6d9de; }
.pair > div { flex: 1; min-width: 0; } .live { background: #fff7e0; padding: 4px 8px; }
.fields pre { max-height: 260px; } form.rate fieldset { margin: 8px 0; }
form.rate label { margin-right: 10px; white-space: nowrap; }
.controls input[type=checkbox] { width: auto; } .controls input[name=disagree] { width: 4em; }
"""

# A run in progress: its line (p.live) is asked again every few seconds.
_LIVE_JS = """
setInterval(() => document.querySelectorAll('p.live').forEach(p =>
  fetch('/live/' + encodeURIComponent(p.dataset.job)).then(r => r.json()).then(j => {
    p.textContent = j.running ? j.line : 'finished: reload the page for its report';
  })), 3000);
"""


def layout(title: str, body: str) -> bytes:
    """A whole page: header with the desk's links, then `body` (HTML already escaped).

    Args:
        title, body: the page's title (plain text) and HTML.

    Returns:
        The page as UTF-8 bytes.
    """
    css = resources.files("runner.report").joinpath("templates", "report.css").read_text("utf-8")
    nav = " ".join(link(text, path) for text, path in
                   (("Runs", "/"), ("Items", "/items"), ("Rate", "/rate")))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            # no favicon request (a 404 in the console)
            f"<link rel=icon href='data:,'><title>{html.escape(title)}</title>"
            f"<style>{css}{_STYLE}</style></head><body>"
            f"<header><h1>{html.escape(title)}</h1><nav>{nav}</nav></header>"
            f"<main>{body}</main><script>{_LIVE_JS}</script></body></html>").encode()


def link(text: str, path: str, query: Mapping[str, str] | None = None) -> str:
    """An escaped link to `path?query`.

    Args:
        text, path, query: the link's text, the desk's path and its query parameters.

    Returns:
        The `<a>` element.
    """
    href = path + (f"?{urlencode(query)}" if query else "")
    return f"<a href='{html.escape(href)}'>{html.escape(text)}</a>"


def cell(value: Any, *, num: bool = False) -> str:
    """A table cell holding `value` as text.

    Args:
        value: the cell's content, escaped.
        num: right-aligned, for a number.

    Returns:
        The `<td>` element.
    """
    return f"<td{' class=num' if num else ''}>{html.escape(str(value))}</td>"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *, css: str = "",
          attrs: Sequence[Mapping[str, str]] = (), id: str = "") -> str:
    """A table of rows of cells already made (`cell`).

    Args:
        header, rows: the column titles and each row's cells.
        css, id: the table's class and id.
        attrs: each row's attributes, in row order.

    Returns:
        The `<table>` element.
    """
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr" + "".join(f" {k}='{html.escape(v)}'" for k, v in
                        (attrs[i] if i < len(attrs) else {}).items()) + f">{''.join(r)}</tr>"
        for i, r in enumerate(rows))
    return (f"<table class='{css}'" + (f" id='{id}'" if id else "")
            + f"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def index_page(jobs: Mapping[str, list[RunInfo]], live: Mapping[str, str]) -> str:
    """Every job with its kept runs, two of which can be picked to open side by side.

    Args:
        jobs: each job's kept runs, oldest first.
        live: each job with a run in progress, and its lease holder.

    Returns:
        The page's HTML body.
    """
    parts = []
    for job, runs in jobs.items():
        rows = []
        for i, r in enumerate(runs):
            shown = run_row(r.path)  # judge runs' own row
            rows.append([
                f"<td><input type=radio name=a value='{html.escape(r.id)}'"
                f"{' checked' if i == len(runs) - 2 else ''}>"
                f"<input type=radio name=b value='{html.escape(r.id)}'"
                f"{' checked' if i == len(runs) - 1 else ''}></td>",
                f"<td>{link(r.id, f'/run/{job}/{r.id}')}</td>",
                *(cell(v, num=k in NUMERIC) for k, v in zip(RUN_COLUMNS[1:], shown[1:],
                                                             strict=True)),
                cell(r.manifest.get("started", ""))])
        hidden = f"<input type=hidden name=job value='{html.escape(job)}'>"
        status = _live(job, live.get(job))
        parts.append(
            f"<section class=job><h2>{html.escape(job)}</h2>{status}"
            f"<form method=get action='/diff'>{hidden}"
            + table(["A / B", *RUN_COLUMNS, "started"], rows, css="runs")
            + "<button type=submit>Open A and B side by side</button> "
            + link("browse items", "/items", {"job": job})
            + (" " + link("rate items", f"/rate/{job}")) + "</form></section>")
    return "".join(parts) or "<p>No kept runs here yet: `judge run JOB` makes one.</p>"


def _correlation_rows(rows: Iterable[Mapping[str, str]]) -> list[list[str]]:
    """correlations.csv's rows over all items as cells: the figure with its CI and n."""
    out = []
    for r in rows:
        if r.get("subset") != "all":
            continue
        value = _float(r.get("value"))
        n = r.get("n_groups") if r.get("level") == "sample" else r.get(
            "n_systems" if r.get("level") == "system" else "n_items")
        out.append([cell(r["dataset"]), cell(r["aspect"]), cell(r["judge"]), cell(r["level"]),
                    cell(r["method"]), f"<td class='num figure'>{number(value)}</td>",
                    cell(f"[{number(_float(r.get('ci_low')))}, "
                         f"{number(_float(r.get('ci_high')))}]", num=True),
                    cell(n or "", num=True)])
    return out


def run_page(job: str, run: RunInfo, correlations: Sequence[Mapping[str, str]],
             live: str | None) -> str:
    """One run: its correlations (from its correlations.csv), its files, its report.html.

    Args:
        job, run, correlations: the job's name, the run shown and its correlations.csv rows.
        live: the lease holder of a run of the job in progress, or None.

    Returns:
        The page's HTML body.
    """
    files = " ".join(link(name, f"/run/{job}/{run.id}/{name}")
                     for name in sorted(p.name for p in run.path.iterdir()))
    status = _live(job, live)
    return (f"{status}<p>{html.escape(job)} · {html.escape(run.id)} · "
            f"{html.escape(str(run.manifest.get('command', '')))} · "
            f"{link('browse its items', '/items', {'job': job, 'run': run.id})}</p>"
            f"<p>Files: {files}</p>"
            + table(["dataset", "aspect", "judge", "level", "method", "value", "95% CI", "n"],
                    _correlation_rows(correlations), css="corr")
            + f"<iframe class=report title=report "
              f"src='{html.escape(f'/run/{job}/{run.id}/report.html')}'>"
              "</iframe>")


def diff_page(job: str, a: str, b: str, compared: RunDiff) -> str:
    """Two runs side by side: `judge diff`'s lines, its table, and both reports.

    Args:
        job, a, b: the job's name and the two runs' ids.
        compared: `judge diff`'s comparison of the two.

    Returns:
        The page's HTML body.
    """
    rows = [[cell(r["dataset"]), cell(r["aspect"]), cell(f"{r['judge_a']} -> {r['judge_b']}"),
             cell(r["level"]), cell(r["method"]), cell(number(r["value_a"]), num=True),
             cell(number(r["value_b"]), num=True), cell(number(r["change"], sign=True), num=True),
             cell(f"[{number(r['ci_low'])}, {number(r['ci_high'])}]", num=True),
             cell(number(r["p_value"]), num=True), cell(r["n_groups"], num=True)]
            for r in compared.rows]
    frames = "".join(
        f"<div><h3>{label}: {link(run, f'/run/{job}/{run}')}</h3><iframe title='{label}' "
        f"src='{html.escape(f'/run/{job}/{run}/report.html')}'></iframe></div>"
        for label, run in (("A", a), ("B", b)))
    lines = "\n".join(compared.lines) or "no data set and aspect with a judge in both runs"
    return (f"<p>{html.escape(a)} -&gt; {html.escape(b)} ({html.escape(compared.method)}; "
            "change = B - A, 95% CI, paired bootstrap; n = groups both runs scored):</p>"
            f"<pre id=diff-lines>{html.escape(lines)}</pre>"
            + table(["dataset", "aspect", "judges", "level", "method", "A", "B", "change",
                     "95% CI", "p", "n"], rows, css="diff")
            + f"<div class=pair>{frames}</div>")


def _live(job: str, line: str | None) -> str:
    """The line on a run in progress, which the page's script keeps up to date."""
    return (f"<p class=live data-job='{html.escape(job)}'>{html.escape(line)}</p>"
            if line else "")


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
