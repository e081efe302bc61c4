  // --- charts.js: spliced into report.js's closure (runner.report.html), so it shares el,
  // svg, plot, scale, axes and fmt. The unparsed-judge banner, the system ranking view, and
  // the position and length bias charts; each draws from data the page already holds.

  // A judge with most answers unparsed: the same rule and numbers as the lines `judge run`
  // prints (runner.report.headline.unparsed_judges), at the very top of the page.
  function banner() {
    const U = D.unparsed || [], F = D.no_spread || [];
    if (!U.length && !F.length) return;
    const b = el("div", { id: "banner", class: "banner", role: "alert" });
    // a judge giving one score to (nearly) all its answers: the terminal's line, word for word
    // (runner.report.standing.no_spread)
    for (const f of F) {
      b.append(el("div", { class: "banner-line no-spread" },
        `judge ${f.judge}: ${f.top} of ${f.scored} answers are "${f.score}" on ${f.dataset} / ${f.aspect} ` +
        (f.top === f.scored ? "(no spread): no correlation can be computed"
                            : "(almost no spread): its correlations rest on the few answers that differ")));
    }
    for (const u of U) {
      const parsed = u.answered - u.unparsed;
      b.append(el("div", { class: "banner-line" },
        `judge ${u.judge}: ${u.text}` +  // the terminal's words (unparsed, refusals)
        (parsed ? ` (its figures rest on the ${parsed} that parsed)` : " (no score at all)") + ": ",
        el("a", { href: "#failures", text: "see the failures" })));
    }
    main.prepend(b);
  }

  function legend(s, x, y, entries) {
    // entries: [shape ("dot" | "ring" | "bar"), color, text]; laid out left to right
    const g = put(s, svg("g", { class: "legend" }));
    for (const [shape, color, text] of entries) {
      if (shape === "bar") g.append(svg("line", { x1: x, y1: y, x2: x + 14, y2: y, stroke: color, "stroke-width": 2 }));
      else g.append(svg("circle", { cx: x + 7, cy: y, r: 4, fill: shape === "ring" ? "#fff" : color, stroke: color }));
      g.append(svg("text", { x: x + 18, y: y + 3.5 }, text));
      x += 34 + 6.2 * text.length;
    }
    return g;
  }
  function ranks(values) {
    // competition ranks, 1 = highest; tied values share the best rank
    return values.map(v => 1 + values.filter(w => w > v).length);
  }
  function spread(values) {
    const m = values.reduce((a, c) => a + c, 0) / values.length;
    return Math.sqrt(values.reduce((a, c) => a + (c - m) ** 2, 0) / Math.max(values.length - 1, 1));
  }

  // The system ranking: systems sorted by human mean, the two ranks beside each, and human and
  // judge means each on its own axis in the data's units, so a judge whose system means span
  // 1.99-2.01 reads as flat (its axis says so) rather than as spread out as the humans.
  function span(dist) {
    // the width of a score scale as the scores used it (its histogram's edges); null if none
    const e = (dist || {}).edges || [];
    return e.length > 1 && e[e.length - 1] > e[0] ? e[e.length - 1] - e[0] : null;
  }
  function shared(h, j, sh, sj) {
    // Two axis ranges, each in its own units, drawn to the same share of its own score scale:
    // system means spanning 35% of the humans' 1-5 and 1% of the judge's scale fill 35% and 1%
    // of their panels alike (what z-scoring each side hid). Without a scale: its own range.
    const frac = Math.max((h[1] - h[0]) / (sh || h[1] - h[0] || 1), (j[1] - j[0]) / (sj || j[1] - j[0] || 1)) || 1;
    const fit = (r, sc) => {
      const w = Math.max(sc ? frac * sc : r[1] - r[0], r[1] - r[0]) * 1.16 || 1, mid = (r[0] + r[1]) / 2;
      return [mid - w / 2, mid + w / 2];
    };
    return [fit(h, sh), fit(j, sj)];
  }
  function ranking(name, sys, hdist, jdist) {
    const rows = sys.rows.slice().sort((a, b) => b.human - a.human || a.system.localeCompare(b.system));
    if (!rows.length) return null;
    const rh = ranks(rows.map(r => r.human)), rj = ranks(rows.map(r => r.judge));
    const half = rows.map(r => r.n > 1 ? 1.96 * r.judge_sd / Math.sqrt(r.n) : 0);
    const rowH = 18, top = 28, W = 660, panel = [[245, 425], [465, 645]];
    const H = top + rowH * rows.length + 92;
    const acc = sys.pairwise_accuracy === null ? "n/a" : fmt(sys.pairwise_accuracy);
    const [box, s] = plot(`${name}: pairwise accuracy ${acc} over ${sys.pairs} system pairs`, W, H);
    box.classList.add("ranking");
    const hs = rows.map(r => r.human), js = rows.map(r => r.judge);
    const [hr, jr] = shared([Math.min(...hs), Math.max(...hs)],
                            [Math.min(...js), Math.max(...js)],
                            span(hdist), span(jdist));
    const xh = scale(hr[0], hr[1], ...panel[0]), xj = scale(jr[0], jr[1], ...panel[1]);
    const bottom = top + rowH * rows.length - 6;
    s.append(svg("text", { x: 148, y: 12, "text-anchor": "middle" }, "human #"));
    s.append(svg("text", { x: 202, y: 12, "text-anchor": "middle" }, "judge #"));
    s.append(svg("text", { x: (panel[0][0] + panel[0][1]) / 2, y: 12, "text-anchor": "middle" }, "human mean"));
    s.append(svg("text", { x: (panel[1][0] + panel[1][1]) / 2, y: 12, "text-anchor": "middle" }, "judge mean, 95% CI"));
    axes(s, xh, null, hr, null, [panel[0][0], top - 8, panel[0][1], bottom], null, null, 4);
    axes(s, xj, null, jr, null, [panel[1][0], top - 8, panel[1][1], bottom], null, null, 4);
    rows.forEach((r, i) => {
      const y = top + i * rowH, off = Math.abs(rj[i] - rh[i]);
      const tied = (rk, k) => rows.filter((_, m) => rk[m] === rk[k]).length > 1 ? "=" : "";
      s.append(svg("text", { x: 122, y: y + 4, "text-anchor": "end" }, r.system.length > 20 ? r.system.slice(0, 19) + "…" : r.system));
      s.append(svg("text", { x: 148, y: y + 4, "text-anchor": "middle", class: "rank-human" }, tied(rh, i) + rh[i]));
      s.append(svg("text", { x: 202, y: y + 4, "text-anchor": "middle", class: "rank-judge",
                             fill: off === 0 ? "#1b7a2d" : off === 1 ? "#c76d00" : "#b3261e" }, tied(rj, i) + rj[i]));
      put(s, svg("circle", { cx: xh(r.human), cy: y, r: 4, fill: "#2ca02c", class: "point" }))
        .append(svg("title", {}, `${r.system}: human mean ${fmt(r.human)} (rank ${rh[i]})`));
      // a CI wider than the panel is cut at its edges
      const clip = v => Math.min(Math.max(xj(v), panel[1][0]), panel[1][1]);
      if (half[i]) s.append(svg("line", { x1: clip(r.judge - half[i]), y1: y, x2: clip(r.judge + half[i]), y2: y,
                                          stroke: "#d62728", "stroke-width": 1.5, class: "ci-bar" }));
      put(s, svg("circle", { cx: xj(r.judge), cy: y, r: 4, fill: "#d62728", class: "point" }))
        .append(svg("title", {}, `${r.system}: judge mean ${fmt(r.judge)} ± ${fmt(half[i])} (sd ${fmt(r.judge_sd)}, n ${r.n}; rank ${rj[i]})`));
    });
    const sh = spread(hs), sj = spread(js);
    const notes = ["Each in its own units, each axis the same share of its score scale:",
                   `human system means ${fmt(Math.min(...hs))} to ${fmt(Math.max(...hs))} (sd ${fmt(sh)}); ` +
                   `judge ${fmt(Math.min(...js))} to ${fmt(Math.max(...js))} (sd ${fmt(sj)})`];
    const meanHalf = half.reduce((a, c) => a + c, 0) / half.length;
    if (Math.max(...js) === Math.min(...js)) notes.push("the judge gives every system the same mean: no ranking");
    else if (sj < meanHalf) notes.push("the judge's system means differ by less than their 95% CIs: its ranking is mostly noise");
    notes.forEach((t, k) => s.append(svg("text", { x: 8, y: bottom + 32 + 14 * k, class: k > 1 ? "spread warn" : "spread own-scale" }, t)));
    legend(s, 8, H - 12, [["dot", "#2ca02c", "human mean"], ["dot", "#d62728", "judge mean"],
                          ["bar", "#d62728", "95% CI (1.96 sd/√n)"], ["dot", "#1b7a2d", "judge # = human #"],
                          ["dot", "#c76d00", "1 off"], ["dot", "#b3261e", "2+ off"]]);
    return box;
  }
  function rankingTable(sys) {
    const rows = sys.rows.slice().sort((a, b) => b.human - a.human || a.system.localeCompare(b.system));
    const rh = ranks(rows.map(r => r.human)), rj = ranks(rows.map(r => r.judge));
    return table(["system", "human rank", "judge rank", "n", "human", "judge", "judge_sd"],
                 rows.map((r, i) => [r.system, rh[i], rj[i], r.n, r.human, r.judge, r.judge_sd]));
  }

  // Horizontal dots on a fixed range with a reference line: length-score correlations (0 =
  // no length bias) and first-position win rates (0.5 = no position bias).
  function dots(caption, items, lo, hi, ref, cls) {
    const rowH = 18, left = 170, W = 460, H = 40 + rowH * items.length;
    const [box, s] = plot(caption, W, H);
    box.classList.add(cls);
    const x = scale(lo, hi, left, W - 15);
    axes(s, x, null, [lo, hi], null, [left, 8, W - 15, H - 28]);
    s.append(svg("line", { x1: x(ref), y1: 8, x2: x(ref), y2: H - 28, stroke: "#aaa", "stroke-dasharray": "3 3" }));
    items.forEach((it, i) => {
      const y = 18 + i * rowH;
      s.append(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, it.label.length > 28 ? it.label.slice(0, 27) + "…" : it.label));
      s.append(svg("line", { x1: x(ref), y1: y, x2: x(it.value), y2: y, stroke: it.color, "stroke-width": 3, "stroke-opacity": 0.35 }));
      put(s, svg("circle", { cx: x(it.value), cy: y, r: 4, fill: it.color, class: "point" })).append(svg("title", {}, it.title));
    });
    return box;
  }
  function positionCharts(rows) {
    const out = [];
    const means = rows.filter(r => r.statistic === "mean_score" && r.value !== null);
    if (means.length) {
      const judges = [...new Set(means.map(r => r.a))];
      const pos = r => +String(r.b).replace(/\D+/g, "");
      const ps = [...new Set(means.map(pos))].sort((a, b) => a - b), vs = means.map(r => r.value);
      const W = 360, H = 200 + 16 * Math.ceil(judges.length / 2), b = [46, 10, W - 14, 158];
      const ns = [...new Set(means.map(r => r.n))];  // scores behind each point
      const [box, s] = plot("Mean score by position (flat = no position bias; " +
                            (ns.length === 1 ? `n=${ns[0]} a point)` : "n in each point's tooltip)"), W, H);
      box.classList.add("position-chart");
      const pad = (Math.max(...vs) - Math.min(...vs)) * 0.1 || 0.5;
      const yr = [Math.min(...vs) - pad, Math.max(...vs) + pad], xr = [ps[0] - 0.5, ps[ps.length - 1] + 0.5];
      const x = scale(xr[0], xr[1], b[0], b[2]), y = scale(yr[0], yr[1], b[3], b[1]);
      axes(s, x, y, null, yr, b, "position in the prompt", "mean score");
      for (const p of ps) s.append(svg("text", { x: x(p), y: b[3] + 15, "text-anchor": "middle" }, String(p)));
      judges.forEach((j, k) => {
        const mine = means.filter(r => r.a === j).sort((r, q) => pos(r) - pos(q)), c = COLORS[k % COLORS.length];
        s.append(svg("polyline", { points: mine.map(r => `${x(pos(r))},${y(r.value)}`).join(" "), fill: "none", stroke: c, "stroke-width": 1.5 }));
        for (const r of mine) put(s, svg("circle", { cx: x(pos(r)), cy: y(r.value), r: 4, fill: c, class: "point" }))
          .append(svg("title", {}, `${j}, ${r.b}: mean ${fmt(r.value)} (n=${r.n})`));
        const [lx, ly] = [8 + (k % 2) * (W / 2), H - 12 - 16 * (Math.ceil(judges.length / 2) - 1 - Math.floor(k / 2))];
        legend(s, lx, ly, [["dot", c, j.length > 26 ? j.slice(0, 25) + "…" : j]]);
      });
      out.push(box);
    }
    const wins = rows.filter(r => r.statistic === "first_position_win_rate" && r.value !== null);
    if (wins.length) out.push(dots("First-position win rate (0.5 = no position bias)", wins.map(r => ({
      label: r.a, value: r.value, color: "#1f77b4",
      title: `${r.a}: ${fmt(r.value)} of ${r.n} decisive pairs` + (r.p_value === null ? "" : `, p=${r.p_value.toPrecision(3)}`) })),
      0, 1, 0.5, "position-wins"));
    return out;
  }
  function lengthCharts(rows) {
    const out = [];
    const bias = rows.filter(r => r.b === "length (chars)" && r.statistic === "spearman" && r.value !== null);
    if (bias.length) out.push(dots("Spearman of score with answer length (chars); 0 = no length bias", bias.map(r => ({
      label: r.a, value: r.value, color: r.a === "human" ? "#2ca02c" : "#d62728",
      title: `${r.a}: ${fmt(r.value)} (n=${r.n})` })), -1, 1, 0, "length-chart"));
    const judges = [...new Set(rows.filter(r => r.b === "human").map(r => r.a))];
    const pairs = judges.map(j => [j, rows.find(r => r.a === j && r.b === "human" && r.statistic === "spearman"),
                                   rows.find(r => r.a === j && r.statistic === "partial_spearman")])
      .filter(([, a, b]) => a && b && a.value !== null && b.value !== null);
    if (pairs.length) {
      const rowH = 18, left = 170, W = 460, H = 58 + rowH * pairs.length;
      const [box, s] = plot("Judge-human Spearman, before and after controlling for length", W, H);
      box.classList.add("length-partial");
      const x = scale(-1, 1, left, W - 15), bottom = 16 + rowH * pairs.length;
      axes(s, x, null, [-1, 1], null, [left, 8, W - 15, bottom]);
      pairs.forEach(([j, a, b], i) => {
        const y = 18 + i * rowH;
        s.append(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, j.length > 28 ? j.slice(0, 27) + "…" : j));
        s.append(svg("line", { x1: x(a.value), y1: y, x2: x(b.value), y2: y, stroke: "#999" }));
        put(s, svg("circle", { cx: x(a.value), cy: y, r: 4, fill: "#fff", stroke: "#1f3a5f", class: "point" })).append(svg("title", {}, `${j}: ${fmt(a.value)} before`));
        put(s, svg("circle", { cx: x(b.value), cy: y, r: 4, fill: "#1f3a5f", class: "point" })).append(svg("title", {}, `${j}: ${fmt(b.value)} controlling for length`));
      });
      legend(s, 8, H - 10, [["ring", "#1f3a5f", "judge-human Spearman"], ["dot", "#1f3a5f", "controlling for length"]]);
      out.push(box);
    }
    return out;
  }
