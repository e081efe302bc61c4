"""The desk's two pages with a form: the item browser's filters and the rating form."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from runner.report.diff import number
from runner.serve.items import FAILED, LIMIT, Filters
from runner.serve.pages import cell, table
from runner.serve.rate import SKIP, Next

__all__ = ["items_page", "rate_page"]

# The one script of the desk: a click on a row shows that judgment's request and answer, as
# text (textContent: nothing from a data set or an answer is ever parsed as HTML).
_DETAIL_JS = """
document.querySelectorAll('#items tbody tr').forEach(tr => tr.addEventListener('click', () => {
  const q = new URLSearchParams({job: tr.dataset.job, run: tr.dataset.run, key: tr.dataset.key});
  fetch('/judgment?' + q).then(r => r.json()).then(j => {
    document.getElementById('detail').hidden = false;
    for (const k of ['request', 'answer']) document.getElementById(k).textContent = j[k];
    document.getElementById('verdict').textContent =
      `${j.dataset} / ${j.item_id} / ${j.aspect}: score ${j.score} ` +
      (j.error ? `(${j.error.type}: ${j.error.message})` : '');
  });
}));
"""


def _select(name: str, value: str, options: Sequence[str]) -> str:
    opts = "".join(f"<option value='{html.escape(o)}'{' selected' if o == value else ''}>"
                   f"{html.escape(o or 'any')}</option>" for o in ["", *options])
    return f"<label>{name} <select name={name}>{opts}</select></label>"


def items_page(job: str, runs: Sequence[str], chosen: Sequence[str], filters: Filters,
               choices: Mapping[str, Sequence[str]], rows: Sequence[Mapping[str, Any]]) -> str:
    """The filter form over `runs` (the `chosen` ones read) and the matching rows.

    Args:
        job, runs, chosen: the job's name, its kept runs and the runs whose rows are shown.
        filters, choices: the filters the form was sent with, and each one's values.
        rows: the matching rows, as runner.serve.items.find gives them.

    Returns:
        The page's HTML body.
    """
    run_boxes = "".join(
        f"<label><input type=checkbox name=run value='{html.escape(r)}'"
        f"{' checked' if r in chosen else ''}>{html.escape(r)}</label> " for r in runs)
    form = (f"<form method=get action='/items' class=controls>"
            f"<input type=hidden name=job value='{html.escape(job)}'>{run_boxes}"
            + "".join(_select(k, getattr(filters, k), choices.get(k, ()))
                      for k in ("dataset", "aspect", "judge"))
            + _select("status", filters.status, ["ok", FAILED, "parse", "refusal", "api"])
            + "<label>|judge - human| &ge; <input name=disagree size=4 value='"
            + html.escape("" if filters.disagree is None else f"{filters.disagree:g}")
            + "'></label> <button type=submit>Filter</button></form>")
    body = [[cell(r["run"]), cell(r["dataset"]), cell(r["item"]), cell(r["system"]),
             cell(r["aspect"]), cell(r["judge"]), cell(_score(r["score"]), num=True),
             cell(_score(r["human"]), num=True), cell(number(r["diff"]), num=True),
             f"<td class='status-{html.escape(r['status'])}'>{html.escape(r['status'])}</td>"]
            for r in rows]
    rows_html = table(["run", "dataset", "item", "system", "aspect", "judge", "score", "human",
                       "|diff|", "status"], body, id="items",
                      attrs=[{"data-job": job, "data-run": r["run"], "data-key": r["key"]}
                             for r in rows])
    note = (f"<p class=note>{len(rows)} judgments shown (at most {LIMIT}, largest "
            "disagreement first). Click one for its request and answer.</p>")
    detail = ("<div id=detail hidden><p id=verdict></p><h4>Request</h4><pre id=request></pre>"
              "<h4>Answer</h4><pre id=answer></pre></div>")
    return (form + note + detail + rows_html
            + f"<script>{_DETAIL_JS}</script>")


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _scores(rows: Sequence[Mapping[str, Any]] | None) -> str:
    if rows is None:
        return ""
    body = [[cell(r["judge"]), cell(r["aspect"]), cell(_score(r["score"]), num=True),
             cell(r["status"])] for r in rows]
    return ("<div id=scores><h4>The judges' scores (latest run)</h4>"
            + (table(["judge", "aspect", "score", "status"], body) if rows else
               "<p class=note>No judgment of this item in the latest run.</p>") + "</div>")


def rate_page(job: str, annotator: str, next_item: Next | None, saved: int,
              scores: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The rating form for the next item: blind (no judge's score on the page) unless
    `scores`, the item's rows of the item browser (runner.serve.items.find) in its latest run.

    Args:
        job, annotator: the job's name and who rates.
        next_item: the item to rate, or None when every item is rated.
        saved: the ratings saved so far in this session.
        scores: the judges' rows for the item, shown only with --show-scores.

    Returns:
        The page's HTML body.
    """
    said = f"<p class=note>Saved {saved} ratings.</p>" if saved else ""
    if next_item is None:
        return said + (f"<p id=done>{html.escape(annotator)} has rated every item of "
                       f"{html.escape(job)}. Thank you.</p>")
    it = next_item.item
    fields = "".join(f"<h4>{html.escape(k)}</h4><pre>{html.escape(v)}</pre>"
                     for k, v in it.fields.items())
    sets = []
    for aspect, scale in next_item.scales.items():
        steps = scale.steps()
        name = html.escape(aspect)
        choices = "".join(f"<label><input type=radio name='{name}' value={s}>{s}</label>"
                          for s in steps) if steps else (
            f"<input type=number name='{name}' step=any min={scale.low:g} max={scale.high:g}>")
        sets.append(f"<fieldset><legend>{name} ({scale.low:g} to {scale.high:g})</legend>"
                    f"{choices}<label><input type=radio name='{name}' value={SKIP} checked>"
                    f"skip</label></fieldset>")
    return (said + f"<p>Rating as <b>{html.escape(annotator)}</b>: "
            f"{html.escape(next_item.dataset)}, item {next_item.done + 1} of "
            f"{next_item.total} (whole groups, in --sample's order).</p>"
            f"<p>Item <code id=item>{html.escape(it.item_id)}</code>"
            f"{' · system ' + html.escape(it.system) if it.system else ''}</p>"
            f"<div class=fields>{fields}</div>" + _scores(scores) +
            f"<form method=post class=rate action='/rate/{html.escape(job)}'>"
            f"<input type=hidden name=dataset value='{html.escape(next_item.dataset)}'>"
            f"<input type=hidden name=item value='{html.escape(it.item_id)}'>"
            + "".join(sets) + "<button type=submit id=save>Save and next</button></form>")
