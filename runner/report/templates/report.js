// judge-runner report: draws the embedded JSON as tables and inline SVG.
// Every value from the data goes into the page through textContent or an SVG attribute,
// never through innerHTML, so a judge answer such as "<script>" is shown as text.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
                  "#17becf", "#7f7f7f", "#bcbd22"];
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const c of children) if (c != null) e.append(c);
    return e;
  }
  function put(parent, child) { parent.append(child); return child; }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text != null) e.textContent = text;
    return e;
  }
  function fmt(v, d) {
    if (v === null || v === undefined || (typeof v === "number" && isNaN(v))) return "";
    return typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(d ?? 3)) : String(v);
  }
  function section(id, title) {
    const s = el("section", { id: id });
    s.append(el("h2", { text: title }));
    main.append(s);
    nav.append(el("a", { href: "#" + id, text: title }));
    return s;
  }
  function table(columns, rows, numeric) {
    const t = el("table");
    const head = el("tr");
    for (const c of columns) head.append(el("th", { text: c }));
    t.append(el("thead", {}, head));
    const body = el("tbody");
    for (const r of rows) {
      const tr = el("tr");
      columns.forEach((c, i) => {
        const v = Array.isArray(r) ? r[i] : r[c];
        tr.append(el("td", { class: typeof v === "number" || (numeric && numeric.has(c)) ? "num" : "",
                             text: fmt(v) }));
      });
      body.append(tr);
    }
    t.append(body);
    return t;
  }
  function plot(caption, width, height) {
    const box = el("div", { class: "plot" });
    box.append(el("div", { class: "caption", text: caption }));
    const s = svg("svg", { width: width, height: height, viewBox: `0 0 ${width} ${height}`,
                           role: "img" });
    s.append(svg("title", {}, caption));
    box.append(s);
    return [box, s];
  }
  function scale(lo, hi, a, b) {
    if (hi === lo) { lo -= 0.5; hi += 0.5; }
    return v => a + (v - lo) / (hi - lo) * (b - a);
  }
  function ticks(lo, hi, n) {
    const step = Math.pow(10, Math.floor(Math.log10(Math.max(hi - lo, 1e-9) / n)));
    const err = (hi - lo) / n / step;
    const s = step * (err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1);
    const out = [];
    for (let t = Math.ceil(lo / s) * s; t <= hi + 1e-9; t += s) out.push(+t.toFixed(10));
    return out;
  }
  function axes(s, x, y, xr, yr, box, xlabel, ylabel, nticks) {
    const [l, t, r, b] = box;
    s.append(svg("line", { x1: l, y1: b, x2: r, y2: b, stroke: "#555" }));
    s.append(svg("line", { x1: l, y1: t, x2: l, y2: b, stroke: "#555" }));
    if (xr) for (const v of ticks(xr[0], xr[1], nticks || 5)) {
      s.append(svg("line", { x1: x(v), y1: b, x2: x(v), y2: b + 4, stroke: "#555" }));
      s.append(svg("text", { x: x(v), y: b + 15, "text-anchor": "middle" }, fmt(v, 2)));
    }
    if (yr) for (const v of ticks(yr[0], yr[1], 5)) {
      s.append(svg("line", { x1: l - 4, y1: y(v), x2: l, y2: y(v), stroke: "#555" }));
      s.append(svg("text", { x: l - 6, y: y(v) + 3, "text-anchor": "end" }, fmt(v, 2)));
    }
    if (xlabel) s.append(svg("text", { x: (l + r) / 2, y: b + 30, "text-anchor": "middle" }, xlabel));
    if (ylabel) s.append(svg("text", { x: 12, y: (t + b) / 2, "text-anchor": "middle",
                                       transform: `rotate(-90 12 ${(t + b) / 2})` }, ylabel));
  }

  function scroller(t) {
    // a wide table scrolls inside its own box, its first (judge) column fixed
    t.classList.add("sticky");
    return el("div", { class: "scroll" }, t);
  }
/*CHARTS*/

  // --- summary -------------------------------------------------------------------------
  function summary() {
    const m = D.manifest || {};
    const s = section("summary", "Summary");
    const counts = m.counts || {};
    const models = (m.models || []).map(x => `${x.name} (${x.spec})`).join(", ");
    const prompts = D.prompts.map(p => `${p.name} [${p.parser}: ${p.aspects.join(", ")}]`).join("; ");
    const rows = [["job", m.job || D.job], ["job file", m.job_file], ["command", m.command],
                  ["started", m.started], ["ended", m.ended], ["models", models],
                  ["prompts", prompts], ["data sets", D.datasets.map(d => d.name).join(", ")],
                  ["tasks", counts.total], ["cache hits", counts.cache_hits],
                  ["API calls", counts.api_calls], ["failed", counts.failures],
                  ["not run", counts.missing],
                  ["tokens", ((m.usage || {}).prompt_tokens || 0) + ((m.usage || {}).completion_tokens || 0)],
                  ["estimated cost (USD)", m.estimated_cost_usd === null && m.unpriced_calls ?
                   `unknown (${m.unpriced_calls} calls of models without a price)` : m.estimated_cost_usd],
                  ["bill of the answers used", billText((m.provenance || {}).bill)],
                  ["correlations", `levels ${D.levels.join(", ")}; methods ${D.methods.join(", ")}; ` +
                                   `95% bootstrap CIs over ${D.bootstrap} resamples`]];
    const t = table(["field", "value"], rows.filter(r => r[1] !== undefined && r[1] !== null));
    t.classList.add("kv");
    t.querySelector("thead").remove();
    s.append(t);
  }

  // The bill as paid (runner.job.bill.Bill): tokens and USD by kind, and what caching and
  // batching saved against list price; null USD: a model without a price (unknown, never $0).
  function billText(b) {
    if (!b) return undefined;
    const usd = v => v === null ? "unknown" : `$${v.toFixed(4)}`;
    const kinds = [["input", "input"], ["cached_input", "cached input"],
                   ["cache_write", "cache write"], ["output", "output"]];
    const parts = kinds.filter(([k]) => b.tokens[k]).map(([k, name]) =>
      `${name} ${b.tokens[k]} tokens ${usd(b.cost_usd[k])}`);
    return `${usd(b.cost_usd.total)} (${parts.join(", ") || "no tokens"}); saved against ` +
           `list ${usd(b.list_usd)}: caching ${usd(b.saved_usd.caching)}, batching ` +
           `${usd(b.saved_usd.batching)} (prices as read ${b.prices_read})`;
  }

  // --- correlations --------------------------------------------------------------------
  function corrTable(rows, bestOf) {
    const cols = [], seen = new Set();
    for (const r of rows) {
      const k = `${r.level}|${r.subset}|${r.method}`;
      if (!seen.has(k)) { seen.add(k); cols.push([r.level, r.subset, r.method, k]); }
    }
    const judges = [...new Set(rows.map(r => r.judge))];
    const cell = new Map(rows.map(r => [`${r.judge}|${r.level}|${r.subset}|${r.method}`, r]));
    // the best judge of each column, chosen in Python (runner.report.standing) by the rule
    // the terminal's `*` and `judge runs` use: only judges with enough parsed answers and n
    const best = new Set((bestOf || []).map(([level, subset, method, judge]) =>
      `${judge}|${level}|${subset}|${method}`));
    const t = el("table", { class: "corr" });
    const h = el("tr", {}, el("th", { text: "judge" }));
    for (const c of cols) h.append(el("th", { text: `${c[0]} ${c[2]}` + (c[1] === "all" ? "" : ` (${c[1]})`) }));
    h.append(el("th", { text: "n" }));
    t.append(el("thead", {}, h));
    const body = el("tbody");
    for (const j of judges) {
      const tr = el("tr", {}, el("td", { text: j }));
      let n = "";
      for (const c of cols) {
        const r = cell.get(`${j}|${c[3]}`);
        const td = el("td", { class: "num" });
        if (r && r.value !== null) {
          td.append(fmt(r.value));
          if (r.ci_low !== null) {
            // a value near 1 can lie above its percentile CI: marked, and said in the system note
            if (r.value < r.ci_low || r.value > r.ci_high) td.append(el("span", { class: "outside", title: "outside its CI: see the system-level note", text: "^" }));
            td.append(el("div", { class: "ci", text: `[${fmt(r.ci_low)}, ${fmt(r.ci_high)}]` }));
          }
          if (best.has(`${j}|${c[3]}`)) td.classList.add("best");
          if (c[0] === "dataset" && c[1] === "all") n = r.n_items;
        }
        tr.append(td);
      }
      tr.append(el("td", { class: "num", text: fmt(n) }));
      body.append(tr);
    }
    t.append(body);
    return t;
  }
  function forest(rows, level, method) {
    const data = rows.filter(r => r.level === level && r.method === method && r.subset === "all" && r.value !== null);
    if (!data.length) return null;
    const rowH = 20, left = 170, W = 460, H = 40 + rowH * data.length;
    const withCI = data.some(r => r.ci_low !== null && r.ci_low !== undefined);
    const n = level === "system" ? data.find(r => r.n_systems != null) : null;
    const [box, s] = plot(`${level} level, ${method}` + (n ? `, ${n.n_systems} systems` : "") +
                          (withCI ? " (95% CI)" : " (no CI at this level: estimates only)"), W, H);
    box.classList.add("forest");
    const lo = Math.min(0, ...data.map(r => r.ci_low ?? r.value)), hi = Math.max(0, ...data.map(r => r.ci_high ?? r.value));
    const x = scale(lo, hi, left, W - 15);
    axes(s, x, null, [lo, hi], null, [left, 8, W - 15, H - 28]);
    s.append(svg("line", { x1: x(0), y1: 8, x2: x(0), y2: H - 28, stroke: "#aaa", "stroke-dasharray": "3 3" }));
    data.forEach((r, i) => {
      const y = 18 + i * rowH;
      s.append(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, r.judge.length > 28 ? r.judge.slice(0, 27) + "…" : r.judge));
      if (r.ci_low != null) s.append(svg("line", { x1: x(r.ci_low), y1: y, x2: x(r.ci_high), y2: y, stroke: "#1f3a5f", "stroke-width": 2, class: "ci-bar" }));
      put(s, svg("circle", { cx: x(r.value), cy: y, r: 4, fill: r.judge === "iaa" ? "#999" : "#d62728", class: "point" })).append(svg("title", {}, `${r.judge}: ${fmt(r.value)} [${fmt(r.ci_low)}, ${fmt(r.ci_high)}]`));
    });
    return box;
  }

  // --- judge vs human, distributions, systems ------------------------------------------
  function scatter(name, sc, aspect) {
    const W = 300, H = 260, box0 = [46, 10, W - 10, H - 38];
    const [box, s] = plot(`${name} (n=${sc.n})`, W, H);
    let xr, yr;
    if (sc.points) {
      if (!sc.points.length) return box;
      xr = [Math.min(...sc.points.map(p => p[0])), Math.max(...sc.points.map(p => p[0]))];
      yr = [Math.min(...sc.points.map(p => p[1])), Math.max(...sc.points.map(p => p[1]))];
    } else {
      xr = [sc.hist.x[0], sc.hist.x[sc.hist.x.length - 1]];
      yr = [sc.hist.y[0], sc.hist.y[sc.hist.y.length - 1]];
    }
    const pad = (r) => { const d = (r[1] - r[0]) * 0.06 || 0.5; return [r[0] - d, r[1] + d]; };
    xr = pad(xr); yr = pad(yr);
    const x = scale(xr[0], xr[1], box0[0], box0[2]), y = scale(yr[0], yr[1], box0[3], box0[1]);
    axes(s, x, y, xr, yr, box0, "judge score", `human ${aspect}`);
    if (sc.points) {
      // Deterministic jitter: integer scales would otherwise stack every point.
      let seed = 7;
      const jit = () => { seed = (seed * 16807) % 2147483647; return (seed / 2147483647 - 0.5) * 8; };
      for (const [px, py] of sc.points)
        s.append(svg("circle", { cx: x(px) + jit(), cy: y(py) + jit(), r: 2.6, fill: "#1f77b4", "fill-opacity": 0.45, class: "point" }));
    } else {
      const max = Math.max(...sc.hist.cells.map(c => c[2]));
      for (const [i, j, c] of sc.hist.cells) {
        const x0 = x(sc.hist.x[i]), x1 = x(sc.hist.x[i + 1]), y0 = y(sc.hist.y[j + 1]), y1 = y(sc.hist.y[j]);
        put(s, svg("rect", { x: x0, y: y0, width: Math.max(x1 - x0, 1), height: Math.max(y1 - y0, 1),
                               fill: "#1f77b4", "fill-opacity": 0.1 + 0.9 * c / max, class: "cell" }))
          .append(svg("title", {}, `${c} judgments`));
      }
      if (sc.levels) quantileBoxes(s, x, y, sc.hist.y, sc.levels);
    }
    if (sc.fit) {
      const [a, b] = sc.fit;
      s.append(svg("line", { x1: x(xr[0]), y1: y(a * xr[0] + b), x2: x(xr[1]), y2: y(a * xr[1] + b),
                             stroke: "#d62728", "stroke-width": 1.5, class: "fit" }));
    }
    return box;
  }
  // The judge's score quantiles per human score level, over a 2-D histogram: per level a
  // whisker from the 5th to the 95th percentile, a box from the 25th to the 75th, a tick at
  // the median (horizontal: the judge score is the x axis).
  function quantileBoxes(s, x, y, edges, levels) {
    levels.q.forEach((q, k) => {
      if (!q) return;
      const mid = y((edges[k] + edges[k + 1]) / 2), half = Math.min(Math.abs(y(edges[k]) - y(edges[k + 1])) / 4, 6);
      const g = put(s, svg("g", { class: "quantile" }));
      g.append(svg("title", {}, `human ${fmt(edges[k], 2)}–${fmt(edges[k + 1], 2)}: ${levels.n[k]} judgments; judge score median ${fmt(q[2])}, ` +
                               `middle half ${fmt(q[1])}–${fmt(q[3])}, 90% in ${fmt(q[0])}–${fmt(q[4])}`));
      g.append(svg("line", { x1: x(q[0]), y1: mid, x2: x(q[4]), y2: mid, stroke: "#222", "stroke-width": 1 }));
      g.append(svg("rect", { x: x(q[1]), y: mid - half, width: Math.max(x(q[3]) - x(q[1]), 1), height: 2 * half,
                             fill: "#fff", "fill-opacity": 0.6, stroke: "#222" }));
      g.append(svg("line", { x1: x(q[2]), y1: mid - half, x2: x(q[2]), y2: mid + half, stroke: "#d62728", "stroke-width": 2 }));
    });
  }
  function histogram(name, h, color) {
    const W = 240, H = 150, b = [40, 8, W - 8, H - 30];
    const [box, s] = plot(`${name}` + (h.missing ? ` (${h.missing} unscored)` : ""), W, H);
    if (h.quantiles) box.append(el("div", { class: "quantiles note", text:
      `mean ${fmt(h.mean)}, median ${fmt(h.quantiles[2])}, middle half ${fmt(h.quantiles[1])}–${fmt(h.quantiles[3])}, 90% in ${fmt(h.quantiles[0])}–${fmt(h.quantiles[4])}` }));
    if (!h.counts.length) return box;
    const lo = h.edges[0], hi = h.edges[h.edges.length - 1], max = Math.max(...h.counts);
    const x = scale(lo, hi, b[0], b[2]), y = scale(0, max, b[3], b[1]);
    axes(s, x, y, [lo, hi], [0, max], b);
    h.counts.forEach((c, i) => {
      const x0 = x(h.edges[i]), x1 = x(h.edges[i + 1]);
      put(s, svg("rect", { x: x0 + 1, y: y(c), width: Math.max(x1 - x0 - 2, 1), height: b[3] - y(c), fill: color, class: "bar" }))
        .append(svg("title", {}, `${fmt(h.edges[i], 2)}–${fmt(h.edges[i + 1], 2)}: ${c}`));
    });
    return box;
  }
  function dataset(d, i) {
    const s = section(`ds-${i}`, `Data set: ${d.name}`);
    if (!d.aspects.length) s.append(el("p", { class: "note", text: "No human ratings in this data set, so no correlations: see the failures, battles, leaderboard and item browser below." }));
    for (const a of d.aspects) {
      s.append(el("h3", { text: `${d.name}: ${a.aspect}` }));
      s.append(el("h4", { text: `Correlation with human ratings (best judge per column in bold, among judges with at least ${Math.round(100 * D.ranked_if.parsed_share)}% of their answers parsed and n >= ${D.ranked_if.min_points}; iaa = annotator 2 vs annotator 1)` }));
      s.append(scroller(corrTable(a.correlations, a.best)));
      if (a.system_note) s.append(el("p", { class: "note", text: a.system_note }));
      const forests = el("div", { class: "plots" });
      for (const lvl of D.levels) for (const m of D.methods.slice(0, 1)) {
        const f = forest(a.correlations, lvl, m);
        if (f) forests.append(f);
      }
      s.append(el("h4", { text: "Forest plot: each judge's correlation per level, with its 95% CI where one is computed" }), forests);
      const names = Object.keys(a.scatter);
      if (!names.length) continue;
      const sc = el("div", { class: "plots" });
      for (const n of names) sc.append(scatter(n, a.scatter[n], a.aspect));
      s.append(el("h4", { text: "Judge vs human (jittered points; for large jobs a 2-D histogram with the judge's score quantiles per human level: whiskers 5–95%, box 25–75%, median in red; red line: least squares)" }), sc);
      const dist = el("div", { class: "plots" });
      names.forEach((n, k) => dist.append(histogram(n, a.distribution[n], COLORS[k % COLORS.length])));
      dist.append(histogram("human", a.human, "#2ca02c"));
      s.append(el("h4", { text: "Score distributions per judge (and the human scores)" }), dist);
      const sy = el("div", { class: "plots" });
      for (const n of names) { const p = ranking(n, a.systems[n], a.human, a.distribution[n]); if (p) sy.append(p); }
      if (sy.childNodes.length) {
        s.append(el("h4", { text: "System ranking: systems sorted by human mean (# 1 = highest), the judge's rank beside it; human and judge means each in its own units, each axis the same share of its score scale (a judge whose system means barely differ looks flat), their spread below; pairwise accuracy = share of system pairs the judge orders as the humans do" }), sy);
        for (const n of names) {
          if (a.systems[n].rows.length) s.append(el("div", { class: "note", text: n }), scroller(rankingTable(a.systems[n])));
        }
      }
      const many = Math.max(0, ...names.map(n => a.systems[n].systems || 0));  // rows only up to a bound
      if (!sy.childNodes.length && many) s.append(el("p", { class: "note system-count", text: `${many} systems: too many to draw a row each here; the system-level correlations are in the table above.` }));
    }
  }

  // --- reliability (reliability.csv's rows, pivoted: judges as rows) -----------------------
  const REL = [["agreement", "Agreement: Krippendorff's alpha and quadratic-weighted kappa of each judge with each annotator, the human mean and the other judges; 'annotators' = the annotators' own agreement",
                r => `${r.b}: ${r.statistic}`],
               ["self_consistency", "Self-consistency: alpha across a judge's samples of the same item",
                r => `${r.statistic} (${r.b})`],
               ["position", "Position bias: verdict flip rate when the order is swapped, first-position win rate (p: binomial test against 1/2), mean score by position",
                r => r.b ? `${r.statistic} (${r.b})` : r.statistic],
               ["length", "Length bias: Spearman of score with answer length; judge-human correlation before and after controlling for length",
                r => `${r.statistic} vs ${r.b}`]];
  function relTable(rows, colOf) {
    const cols = [...new Set(rows.map(colOf))], judges = [...new Set(rows.map(r => r.a))];
    const cell = new Map(rows.map(r => [`${r.a}\u0000${colOf(r)}`, r]));
    const t = el("table", { class: "rel" });  // wrapped by scroller: judges stay in view
    t.append(el("thead", {}, el("tr", {}, el("th", { text: "judge" }), ...cols.map(c => el("th", { text: c })))));
    const body = el("tbody");
    for (const j of judges) {
      const tr = el("tr", {}, el("td", { text: j }));
      for (const c of cols) {
        const r = cell.get(`${j}\u0000${c}`), td = el("td", { class: "num" });
        if (r) {
          td.setAttribute("data-key", [r.dataset, r.aspect, r.figure, r.a, r.b, r.statistic].join("\u0000"));
          td.setAttribute("data-n", r.n);
          td.append(el("span", { class: "v", text: fmt(r.value) }));
          td.append(el("div", { class: "ci", text: `n=${r.n}` + (r.p_value === null ? "" : `, p=${r.p_value.toPrecision(3)}`) }));
        }
        tr.append(td);
      }
      body.append(tr);
    }
    t.append(body);
    return t;
  }
  function reliability() {
    const R = D.reliability || [];
    if (!R.length) return;
    const s = section("reliability", "Reliability");
    s.append(el("p", { class: "note", text: "The rows of reliability.csv, per data set and aspect (n: units, pairs or items each figure is computed from)." }));
    for (const d of R) {
      const h = put(s, el("h3", { text: `Reliability: ${d.dataset}` }));
      h.setAttribute("data-dataset", d.dataset);
      for (const n of d.notes) s.append(el("p", { class: "note rel-note", text: n }));
      for (const aspect of [...new Set(d.rows.map(r => r.aspect))]) {
        for (const [figure, caption, colOf] of REL) {
          const rows = d.rows.filter(r => r.aspect === aspect && r.figure === figure);
          if (!rows.length) continue;
          s.append(el("h4", { text: `${aspect}: ${caption}` }), scroller(relTable(rows, colOf)));
          const charts = figure === "position" ? positionCharts(rows) : figure === "length" ? lengthCharts(rows) : [];
          if (charts.length) s.append(el("div", { class: "plots" }, ...charts));
        }
      }
    }
  }

  // --- failures, battles, leaderboard ---------------------------------------------------
  function failures() {
    const s = section("failures", "Failures");
    s.append(el("p", { class: "note", text: "Parse failures (the answer had no score the parser could read), refusals, and API failures (no cached answer), per prompt, aspect and model." }));
    s.append(table(["dataset", "prompt", "aspect", "model", "n", "scored", "mean", "std",
                    "parse_failures", "refusals", "api_failures"], D.summary));
    if (!D.failures.length) { s.append(el("p", { text: "No failures." })); return; }
    s.append(el("h4", { text: "Example raw answers" }));
    for (const f of D.failures) {
      s.append(el("div", { class: "note", text: `${f.dataset} / ${f.prompt} / ${f.aspect} / ${f.model}: ${f.type}` }));
      for (const e of f.examples) s.append(el("pre", { class: "example", text: e }));
    }
  }
  function battles() {
    if (!D.battles.length) return;
    const s = section("battles", "Battles");
    s.append(el("p", { class: "note", text: "Pairwise verdicts asked in both orders: inconsistent = the verdict changed when the two outputs swapped places (position bias)." }));
    s.append(table(Object.keys(D.battles[0]), D.battles));
    if (!(D.ranking || []).length) return;
    s.append(el("h4", { text: "Ranking: Bradley-Terry strength (log odds against the average system) with its 95% CI, from the battles" }));
    const by = new Map();
    for (const r of D.ranking) {
      const k = `${r.judge} on ${r.dataset} / ${r.aspect}`;
      if (!by.has(k)) by.set(k, []);
      by.get(k).push(r);
    }
    for (const [k, rows] of by) s.append(strengths(k, rows));
    s.append(table(Object.keys(D.ranking[0]), D.ranking));
  }
  // The ranking as a forest plot: each system's strength (rank order, best on top) with its CI,
  // drawn as forest() draws the correlations
  function strengths(caption, rows) {
    const rowH = 20, left = 170, W = 460, H = 40 + rowH * rows.length;
    const [box, s] = plot(`${caption}: Bradley-Terry strength (95% CI)`, W, H);
    box.classList.add("forest", "strengths");
    const lo = Math.min(0, ...rows.map(r => r.ci_low ?? r.strength)), hi = Math.max(0, ...rows.map(r => r.ci_high ?? r.strength));
    const x = scale(lo, hi, left, W - 15);
    axes(s, x, null, [lo, hi], null, [left, 8, W - 15, H - 28]);
    s.append(svg("line", { x1: x(0), y1: 8, x2: x(0), y2: H - 28, stroke: "#aaa", "stroke-dasharray": "3 3" }));
    rows.forEach((r, i) => {
      const y = 18 + i * rowH, name = `${r.rank}. ${r.model}`;
      s.append(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, name.length > 28 ? name.slice(0, 27) + "…" : name));
      if (r.ci_low != null) s.append(svg("line", { x1: x(r.ci_low), y1: y, x2: x(r.ci_high), y2: y, stroke: "#1f3a5f", "stroke-width": 2, class: "ci-bar" }));
      put(s, svg("circle", { cx: x(r.strength), cy: y, r: 4, fill: "#d62728", class: "point" })).append(svg("title", {}, `${r.model}: ${fmt(r.strength)} [${fmt(r.ci_low)}, ${fmt(r.ci_high)}]`));
    });
    return box;
  }
  function leaderboard() {
    if (!D.leaderboard) return;
    const s = section("leaderboard", "Leaderboard");
    s.append(scroller(table(D.leaderboard.columns, D.leaderboard.rows)));
  }

  // --- item browser ----------------------------------------------------------------------
  function items() {
    const I = D.items, s = section("items", "Item browser");
    const cols = I.columns, idx = Object.fromEntries(cols.map((c, i) => [c, i]));
    const num = v => Number(v).toLocaleString("en-US");
    // no human score on any row (a battle, a set without ratings): no human or |diff| column,
    // and no claim to sort by a disagreement there is none of
    const human = I.rows.some(r => r[idx.human] !== null);
    // A large study: the rows are a sample, and the page says how it was drawn (runner.report.browser)
    s.append(el("p", { id: "item-sample", class: "note", text: I.capped
      ? `A sample: ${num(I.sample)} of ${num(I.seen)} judgments, drawn uniformly at random (seed ${I.seed}); ` +
        (I.disagreements ? `with the ${num(I.disagreements)} largest judge-human disagreements` : "") +
        (I.failed ? `${I.disagreements ? " and " : "with "}${num(I.failures)} of the ${num(I.failed)} failures, drawn at random` : "") +
        `: ${num(I.rows.length)} rows (a row can be both). Choose "random sample" to see the sample alone; judgments.jsonl has every judgment. Click a row for the prompt sent and the raw answer.`
      : `All ${num(I.rows.length)} judgments, ` + (human ? "largest judge-human disagreement first" :
        "failures first (no human scores here: no judge-human disagreement to sort by)") +
        ". Click a row for the prompt sent and the raw answer." }));
    const search = el("input", { id: "item-search", type: "search", placeholder: "search item, system, judge, answer…" });
    const selects = {};
    const controls = el("div", { class: "controls" }, search);
    if (I.capped) {  // which pool kept a row (I.why)
      const sel = el("select", { id: "item-filter-kept" }, el("option", { value: "", text: "every kept row" }));
      for (const [v, t] of [["random", "random sample"], ...(I.disagreements ? [["disagreement", "largest disagreements"]] : []), ["failure", "failures"]])
        sel.append(el("option", { value: v, text: t }));
      selects.kept = sel; controls.append(sel);
    }
    for (const c of ["dataset", "aspect", "judge", "status"]) {
      const sel = el("select", { id: `item-filter-${c}` }, el("option", { value: "", text: `all ${c === "status" ? "statuses" : c + "s"}` }));
      for (const v of [...new Set(I.rows.map(r => r[idx[c]]))].sort()) sel.append(el("option", { value: v, text: v }));
      selects[c] = sel; controls.append(sel);
    }
    const count = el("span", { id: "item-count", class: "note" });
    controls.append(count);
    s.append(controls);
    // a sample column only when a prompt asks more than once (the page data has it then)
    const shown = ["dataset", "item", "system", "aspect", "judge", ...("sample" in idx ? ["sample"] : []),
                   "score", ...(human ? ["human", "diff"] : []), "status"];
    const t = el("table", { id: "items-table" });
    t.append(el("thead", {}, el("tr", {}, ...shown.map(c => el("th", { text: c === "diff" ? "|diff|" : c })))));
    const body = el("tbody");
    t.append(body);
    const more = el("button", { id: "item-more", text: "show more" });
    const detail = el("div", { id: "item-detail", hidden: "" });
    s.append(detail, t, more);
    let matched = [], limit = 200;
    function open(r, tr) {
      body.querySelectorAll("tr.open").forEach(x => x.classList.remove("open"));
      tr.classList.add("open");
      detail.replaceChildren(...[
        el("h4", { text: `${r[idx.dataset]} / ${r[idx.item]} / ${r[idx.aspect]} / ${r[idx.judge]}: judge ${fmt(r[idx.score])}` + (human ? `, human ${fmt(r[idx.human])}` : "") + `, ${r[idx.status]}` }),
        r[idx.message] ? el("div", { class: "note", text: r[idx.message] }) : null,
        el("h4", { text: "Raw answer" }), el("pre", { class: "raw", text: r[idx.raw] || "(none)" }),
        el("h4", { text: "Prompt sent" }), el("pre", { class: "prompt", text: I.prompts[r[idx.prompt]] || "(not available)" })]
        .filter(x => x !== null));
      detail.hidden = false;
    }
    function draw() {
      body.replaceChildren();
      for (const r of matched.slice(0, limit)) {
        const tr = el("tr");
        for (const c of shown) {
          const v = r[idx[c]];
          tr.append(el("td", { class: (typeof v === "number" ? "num " : "") + (c === "status" ? `status-${v}` : ""), text: fmt(v) }));
        }
        tr.addEventListener("click", () => open(r, tr));
        body.append(tr);
      }
      more.hidden = matched.length <= limit;
      count.textContent = `${matched.length} of ${I.rows.length} rows match` + (matched.length > limit ? `; showing ${limit}` : "");
    }
    function filter() {
      const q = search.value.toLowerCase();
      // I.why[i]: why row i was kept ("random", "disagreement", "failure", space-separated)
      const has = (c, v) => c === "kept" ? (r, i) => I.why[i].split(" ").includes(v) : r => r[idx[c]] === v;
      const tests = Object.entries(selects).filter(([, sel]) => sel.value).map(([c, sel]) => has(c, sel.value));
      matched = I.rows.filter((r, i) => tests.every(t => t(r, i))
        && (!q || [r[idx.item], r[idx.system], r[idx.judge], r[idx.raw], r[idx.message]].some(v => String(v).toLowerCase().includes(q))));
      limit = 200;
      draw();
    }
    search.addEventListener("input", filter);
    Object.values(selects).forEach(sel => sel.addEventListener("change", filter));
    more.addEventListener("click", () => { limit += 500; draw(); });
    filter();
  }

  document.getElementById("title").textContent = `${D.job}: judge report`;
  document.getElementById("loading").remove();
  summary();
  banner();
  D.datasets.forEach(dataset);
  reliability();
  failures();
  battles();
  leaderboard();
  items();
  document.body.dataset.rendered = "true";
})();
