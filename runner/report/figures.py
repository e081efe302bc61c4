"""Figures for a paper: the report's key plots as PNG (300 dpi) and SVG, drawn with matplotlib
on the Agg backend from the data embedded in report.html (so the page and the figures always
show the same numbers).

Per data set and aspect:
- table_*: the correlation table as an annotated heatmap (judges as rows; level, method and
  subset as columns; the best ranked judge per column boxed, as the terminal marks it), the
  layout of the papers' tables.
- forest_*: each judge's correlation, with its 95% CI where one is computed, one panel per
  level (first method).
- scatter_*: judge against human per judge (jittered points, or a 2-D histogram with the
  judge's score quantiles per human level as boxes), with the least-squares line.
- distribution_*: judge score histograms, with the human scores'.
- ranking_*: per battle judge, data set and aspect, the systems' Bradley-Terry strengths with
  their 95% CIs (ranking.csv), best on top.
- systems_*: judge and human system means, sorted by human mean, each centred and divided by
  the span of its own score scale (so a judge whose means barely move looks flat beside the
  humans, which z-scores hid), with the pairwise accuracy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from runner.report.html import read_page_data  # noqa: E402

__all__ = ["write_figures"]

WIDTH = 6.75  # inches: a two-column paper's text width
plt.rcParams.update({"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8,
                     "xtick.labelsize": 7, "ytick.labelsize": 7, "svg.fonttype": "none",
                     "figure.dpi": 100})


def write_figures(page: Path, out_dir: Path) -> list[Path]:
    """Draw every figure from `page` (a report.html) into `out_dir`; returns the files.

    Args:
        page: a report.html written by this version.
        out_dir: where the figures go (made if missing).

    Returns:
        The files written.

    Raises:
        ReportError: `page` cannot be read or holds no report data.
    """
    data = read_page_data(page)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    levels, method = data["levels"], data["methods"][0]
    for d in data["datasets"]:
        for a in d["aspects"]:
            stem = _slug(f"{d['name']}_{a['aspect']}")
            title = f"{d['name']}: {a['aspect']}"
            figures = {"table": _table(a["correlations"], title, a.get("best", [])),
                       "forest": _forest(a["correlations"], levels, method, title),
                       "scatter": _scatter(a["scatter"], a["aspect"], title),
                       "distribution": _distribution(a["distribution"], a["human"], title),
                       "systems": _systems(a, title)}
            written += _save(figures, stem, out_dir)
    ranked: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in data.get("ranking") or []:
        ranked.setdefault((r["judge"], r["dataset"], r["aspect"]), []).append(r)
    for (judge, dataset, aspect), rows in ranked.items():
        written += _save({"ranking": _ranking(rows, f"{judge} on {dataset}: {aspect}")},
                         _slug(f"{judge}_{dataset}_{aspect}"), out_dir)
    return written


def _save(figures: Mapping[str, Figure | None], stem: str, out_dir: Path) -> list[Path]:
    """Each figure as PNG and SVG, `KIND_STEM.EXT`; the figures closed."""
    written = []
    for kind, fig in figures.items():
        if fig is None:
            continue
        for ext in ("png", "svg"):
            path = out_dir / f"{kind}_{stem}.{ext}"
            fig.savefig(path, dpi=300, bbox_inches="tight")
            written.append(path)
        plt.close(fig)
    return written


def _ranking(rows: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """A battle's Bradley-Terry ranking: each system's strength with its 95% CI, best on top."""
    fig, ax = plt.subplots(figsize=(WIDTH / 2, 0.6 + 0.2 * len(rows)))
    _intervals(ax, rows, [float(r["strength"]) for r in rows],
               [f"{r['rank']}. {r['model']}" for r in rows], "Bradley-Terry strength")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "figure"


def _table(rows: Sequence[Mapping[str, Any]], title: str,
           best: Sequence[Sequence[str]]) -> Figure | None:
    """The correlation table as a heatmap; the page's best judge of each column boxed (its
    `best`: runner.report.standing's rule, as the terminal's `*`)."""
    columns = list(dict.fromkeys((r["level"], r["method"], r["subset"]) for r in rows))
    judges = list(dict.fromkeys(r["judge"] for r in rows))
    if not columns or not judges:
        return None
    cell = {(r["judge"], r["level"], r["method"], r["subset"]): r["value"] for r in rows}
    grid = np.array([[_num(cell.get((j, *c))) for c in columns] for j in judges])
    fig, ax = plt.subplots(figsize=(min(WIDTH, 1.2 + 0.62 * len(columns)),
                                    0.7 + 0.22 * len(judges)))
    ax.imshow(np.nan_to_num(grid, nan=0.0), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    for i, j in np.ndindex(grid.shape):
        if not math.isnan(grid[i, j]):
            ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=6.5)
    for level, subset, method, judge in best:
        if (level, method, subset) in columns and judge in judges:
            ax.add_patch(Rectangle((columns.index((level, method, subset)) - 0.5,
                                    judges.index(judge) - 0.5), 1, 1, fill=False, lw=1.4))
    ax.set_xticks(range(len(columns)),
                  [f"{lvl}\n{m}" + ("" if s == "all" else f"\n{s}") for lvl, m, s in columns])
    ax.set_yticks(range(len(judges)), judges)
    ax.xaxis.tick_top()
    ax.set_title(title, pad=28 if len(columns) else 6)
    return fig


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _forest(rows: Sequence[Mapping[str, Any]], levels: Sequence[str], method: str,
            title: str) -> Figure | None:
    panels = [[r for r in rows if r["level"] == lvl and r["method"] == method
               and r["subset"] == "all" and r["value"] is not None] for lvl in levels]
    shown = [(lvl, p) for lvl, p in zip(levels, panels, strict=True) if p]
    if not shown:
        return None
    n = max(len(p) for _, p in shown)
    fig, axes = plt.subplots(1, len(shown), figsize=(WIDTH, 0.6 + 0.2 * n), sharey=True,
                             squeeze=False)
    for ax, (lvl, p) in zip(axes[0], shown, strict=True):
        _intervals(ax, p, [r["value"] for r in p], [r["judge"] for r in p], method)
        ax.set_title(f"{lvl} level")
    return _titled(fig, title)


def _intervals(ax: Any, rows: Sequence[Mapping[str, Any]], values: Sequence[float],
               labels: Sequence[str], what: str) -> None:
    """A forest panel: each row's value (top to bottom) with its 95% CI where it has one."""
    y = np.arange(len(rows))[::-1]
    v = np.array(values)
    lo = np.array([_num(r["ci_low"]) for r in rows])
    hi = np.array([_num(r["ci_high"]) for r in rows])
    err = np.nan_to_num(np.vstack([v - lo, hi - v]), nan=0.0)
    ax.errorbar(v, y, xerr=err, fmt="o", ms=3, color="#b2182b", ecolor="#2b4a6f", elinewidth=1,
                capsize=2)
    ax.axvline(0, color="grey", lw=0.6, ls="--")
    ax.set_yticks(y, labels)
    ax.set_xlabel(f"{what} (95% CI)" if np.isfinite(lo).any() else f"{what} (no CI)")


def _titled(fig: Figure, title: str) -> Figure:
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def _grid(n: int) -> tuple[Figure, list[Any]]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH, 2.1 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _scatter(scatter: Mapping[str, Any], aspect: str, title: str) -> Figure | None:
    if not scatter:
        return None
    fig, axes = _grid(len(scatter))
    rng = np.random.default_rng(0)
    for ax, (name, sc) in zip(axes, scatter.items(), strict=True):
        if "points" in sc:
            pts = np.array(sc["points"], dtype=float).reshape(-1, 2)
            jitter = rng.uniform(-0.12, 0.12, size=pts.shape)
            ax.scatter(pts[:, 0] + jitter[:, 0], pts[:, 1] + jitter[:, 1], s=5, alpha=0.45,
                       color="#1f77b4", lw=0)
            xs = pts[:, 0]
        else:
            h = sc["hist"]
            grid = np.zeros((len(h["y"]) - 1, len(h["x"]) - 1))
            for i, j, c in h["cells"]:
                grid[j, i] = c
            ax.pcolormesh(h["x"], h["y"], grid, cmap="Blues")
            xs = np.array([h["x"][0], h["x"][-1]])
            if "levels" in sc:
                _quantile_boxes(ax, h["y"], sc["levels"])
        if sc["fit"] is not None and len(xs):
            line = np.linspace(float(np.min(xs)), float(np.max(xs)), 2)
            ax.plot(line, sc["fit"][0] * line + sc["fit"][1], color="#d62728", lw=1)
        ax.set_title(f"{name} (n={sc['n']})")
        ax.set_xlabel("judge score")
        ax.set_ylabel(f"human {aspect}")
    return _titled(fig, title)


def _quantile_boxes(ax: Any, edges: Sequence[float], levels: Mapping[str, Any]) -> None:
    """The judge's score quantiles per human level, as the page draws them: whiskers 5-95%,
    box 25-75%, the median in red, at each level's middle."""
    for k, q in enumerate(levels["q"]):
        if q is None:
            continue
        mid, half = (edges[k] + edges[k + 1]) / 2, (edges[k + 1] - edges[k]) / 4
        ax.plot([q[0], q[4]], [mid, mid], color="#222", lw=0.7)
        ax.add_patch(Rectangle((q[1], mid - half), q[3] - q[1], 2 * half, facecolor="white",
                               alpha=0.6, edgecolor="#222", lw=0.7))
        ax.plot([q[2], q[2]], [mid - half, mid + half], color="#d62728", lw=1.2)


def _distribution(dist: Mapping[str, Any], human: Mapping[str, Any],
                  title: str) -> Figure | None:
    series = {**dist, "human": human}
    series = {k: v for k, v in series.items() if v["counts"]}
    if not series:
        return None
    fig, axes = _grid(len(series))
    for ax, (name, h) in zip(axes, series.items(), strict=True):
        edges = np.array(h["edges"])
        ax.bar(edges[:-1], h["counts"], width=np.diff(edges) * 0.9, align="edge",
               color="#2ca02c" if name == "human" else "#1f77b4")
        ax.set_title(name)
        ax.set_xlabel("score")
        ax.set_ylabel("count")
    return _titled(fig, title)


def _systems(aspect: Mapping[str, Any], title: str) -> Figure | None:
    """One panel per judge: its system means and the humans', each as a share of its own
    score scale (the span of the scores in the distribution plots)."""
    shown = {k: v for k, v in aspect["systems"].items() if v["rows"]}
    if not shown:
        return None
    fig, axes = _grid(len(shown))
    for ax, (name, s) in zip(axes, shown.items(), strict=True):
        rows = sorted(s["rows"], key=lambda r: (-r["human"], r["system"]))
        human = _share([r["human"] for r in rows], aspect["human"])
        judge = _share([r["judge"] for r in rows], aspect["distribution"].get(name))
        y = np.arange(len(rows))[::-1]
        ax.hlines(y, np.minimum(judge, human), np.maximum(judge, human), color="#cccccc")
        ax.plot(human, y, "o", ms=3.5, color="#2ca02c", label="human")
        ax.plot(judge, y, "o", ms=3.5, color="#d62728", label="judge")
        ax.set_yticks(y, [r["system"] for r in rows])
        acc = s["pairwise_accuracy"]
        ax.set_title(f"{name}: pairwise acc. " + ("n/a" if acc is None else f"{acc:.3f}"))
        ax.set_xlabel("system mean - average, as a share of its score scale")
    axes[0].legend(fontsize=6, loc="best")
    return _titled(fig, title)


def _share(values: Sequence[float], dist: Mapping[str, Any] | None) -> Any:
    """Values centred on their mean, divided by the span of the score scale `dist` (a page
    histogram: its edges) shows; by their own range where there is none."""
    v = np.array(values, dtype=float)
    edges = (dist or {}).get("edges") or []
    span = edges[-1] - edges[0] if len(edges) > 1 else 0.0
    return (v - v.mean()) / (span if span > 0 else (np.ptp(v) or 1.0))
