// Small SVG charts for the Crossway dashboard: stacked bars, lines, horizontal bars and budget bars.
// Owns drawing (axes, ticks, labels, hover titles) and number formatting; knows nothing of the API.
// Every mark carries data-* attributes with the exact figure it draws, so a test can read them back.
"use strict";

(function () {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  const W = 760;
  const M = { top: 14, right: 18, bottom: 40, left: 70 };

  function el(tag, attrs, parent) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attrs) {
    const node = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    node.textContent = content;
    return node;
  }

  function tip(node, content) {
    el("title", {}, node).textContent = content;
    return node;
  }

  // A step of 1, 2 or 5 times a power of ten, so ticks read as round numbers.
  function niceTicks(max, count) {
    const top = max > 0 ? max : 1;
    const raw = top / (count || 5);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
    const ticks = [];
    for (let i = 0; i * step <= top + step * 1e-9; i++) ticks.push(i * step);
    if (ticks[ticks.length - 1] < top) ticks.push(ticks.length * step);
    return { ticks: ticks, top: ticks[ticks.length - 1], step: step };
  }

  const fmt = {
    usd(v) {
      if (v === null || v === undefined) return "–";
      const a = Math.abs(v);
      if (a === 0) return "$0";
      if (a >= 1000) return "$" + v.toLocaleString("en-US", { maximumFractionDigits: 0 });
      if (a >= 1) return "$" + v.toFixed(2);
      if (a >= 0.001) return "$" + v.toFixed(4);
      return "$" + v.toPrecision(3);
    },
    usdTick(v, step) {
      const decimals = Math.max(0, -Math.floor(Math.log10(step)));
      return "$" + v.toFixed(Math.min(decimals, 8));
    },
    int(v) {
      return v === null || v === undefined ? "–" : Math.round(v).toLocaleString("en-US");
    },
    pct(v) {
      return v === null || v === undefined ? "–" : (v * 100).toFixed(v === 1 || v === 0 ? 0 : 1) + "%";
    },
    ms(v) {
      if (v === null || v === undefined) return "–";
      return v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(v >= 100 ? 0 : 1) + " ms";
    },
    day(iso) {
      const [, m, d] = iso.split("-");
      return MONTHS[Number(m) - 1] + " " + Number(d);
    },
  };

  function color(index) {
    return PALETTE[index % PALETTE.length];
  }

  // The plot area inside an <svg>: clears it, sets its viewBox, draws the y axis and its grid.
  function frame(svg, height, yTicks, yFormat, yLabel) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", "0 0 " + W + " " + height);
    svg.setAttribute("role", "img");
    const w = W - M.left - M.right;
    const h = height - M.top - M.bottom;
    const g = el("g", { transform: "translate(" + M.left + "," + M.top + ")" }, svg);
    const y = (v) => h - (v / yTicks.top) * h;
    const axis = el("g", { class: "axis y" }, g);
    for (const t of yTicks.ticks) {
      el("line", { x1: 0, x2: w, y1: y(t), y2: y(t), class: t === 0 ? "baseline" : "grid" }, axis);
      text(axis, -8, y(t) + 4, yFormat(t, yTicks.step), { "text-anchor": "end" });
    }
    if (yLabel) text(axis, -M.left + 14, h / 2, yLabel, { class: "axis-label", transform: "rotate(-90 " + (-M.left + 14) + " " + h / 2 + ")", "text-anchor": "middle" });
    return { g: g, w: w, h: h, y: y };
  }

  // Day labels under a band axis, thinned so they never overlap.
  function xLabels(f, categories, center, label) {
    const axis = el("g", { class: "axis x" }, f.g);
    const every = Math.max(1, Math.ceil(categories.length / 12));
    categories.forEach((c, i) => {
      if (i % every === 0) text(axis, center(i), f.h + 16, fmt.day(c), { "text-anchor": "middle" });
    });
    if (label) text(axis, f.w / 2, f.h + 34, label, { class: "axis-label", "text-anchor": "middle" });
  }

  function empty(f, message) {
    text(f.g, f.w / 2, f.h / 2, message || "No data in this range", { class: "empty", "text-anchor": "middle" });
  }

  // series: [{name, color, values: [number per category], attrs: (i) => {...}, title: (i) => "..."}]
  function stackedBars(svg, opts) {
    const cats = opts.categories;
    const totals = cats.map((_, i) => opts.series.reduce((s, ser) => s + (ser.values[i] || 0), 0));
    const ticks = niceTicks(Math.max(0, ...totals));
    const f = frame(svg, opts.height || 300, ticks, opts.yTick || fmt.usdTick, opts.yLabel);
    const band = f.w / Math.max(cats.length, 1);
    const bar = Math.max(2, Math.min(band * 0.7, 56));
    const center = (i) => band * i + band / 2;
    const marks = el("g", { class: "marks" }, f.g);
    cats.forEach((_, i) => {
      let base = 0;
      for (const ser of opts.series) {
        const v = ser.values[i] || 0;
        if (v <= 0) continue;
        const rect = el("rect", Object.assign({ x: center(i) - bar / 2, y: f.y(base + v), width: bar, height: Math.max(f.y(base) - f.y(base + v), 0.5), fill: ser.color, class: "bar" }, ser.attrs(i)), marks);
        tip(rect, ser.title(i));
        base += v;
      }
    });
    xLabels(f, cats, center, opts.xLabel);
    if (totals.every((t) => t === 0)) empty(f);
  }

  // series: [{name, color, dash, values: [number|null per category], attrs: (i) => {...}, title: (i) => "..."}]
  function lines(svg, opts) {
    const cats = opts.categories;
    const all = opts.series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
    const ticks = opts.yMax ? niceTicks(opts.yMax, 5) : niceTicks(Math.max(0, ...all));
    const f = frame(svg, opts.height || 280, ticks, opts.yTick, opts.yLabel);
    const band = f.w / Math.max(cats.length, 1);
    const center = (i) => band * i + band / 2;
    const marks = el("g", { class: "marks" }, f.g);
    for (const ser of opts.series) {
      let d = "";
      let pen = "M";
      ser.values.forEach((v, i) => {
        if (v === null || v === undefined) {
          pen = "M";
          return;
        }
        d += pen + center(i).toFixed(1) + " " + f.y(v).toFixed(1) + " ";
        pen = "L";
      });
      if (d) el("path", { d: d, stroke: ser.color, class: "line" + (ser.dash ? " dashed" : ""), fill: "none" }, marks);
      ser.values.forEach((v, i) => {
        if (v === null || v === undefined) return;
        tip(el("circle", Object.assign({ cx: center(i), cy: f.y(v), r: 4, fill: ser.color, class: "point" }, ser.attrs(i)), marks), ser.title(i));
      });
    }
    xLabels(f, cats, center, opts.xLabel);
    if (!all.length) empty(f, opts.emptyText);
  }

  // rows: [{label, value, color, attrs, title}], one horizontal bar each, value labels at their ends.
  // The frame both horizontal charts share: one row per item, rows labelled on the left, a value axis below.
  function hFrame(svg, count, rowH, top, rightPad, xTick, xLabel) {
    const height = M.top + M.bottom + Math.max(count, 1) * rowH;
    const ticks = niceTicks(top);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", "0 0 " + W + " " + height);
    svg.setAttribute("role", "img");
    const left = 150;
    const w = W - left - rightPad;
    const h = height - M.top - M.bottom;
    const g = el("g", { transform: "translate(" + left + "," + M.top + ")" }, svg);
    const x = (v) => (v / ticks.top) * w;
    const axis = el("g", { class: "axis x" }, g);
    for (const t of ticks.ticks) {
      el("line", { x1: x(t), x2: x(t), y1: 0, y2: h, class: t === 0 ? "baseline" : "grid" }, axis);
      text(axis, x(t), h + 16, xTick(t, ticks.step), { "text-anchor": "middle" });
    }
    if (xLabel) text(axis, w / 2, h + 34, xLabel, { class: "axis-label", "text-anchor": "middle" });
    return { g, x, w, h };
  }

  function hBars(svg, opts) {
    const rows = opts.rows;
    const rowH = 34;
    const top = Math.max(0, ...rows.map((r) => r.value));
    const { g, x, w, h } = hFrame(svg, rows.length, rowH, top, 90, opts.xTick || fmt.usdTick, opts.xLabel);
    const marks = el("g", { class: "marks" }, g);
    rows.forEach((r, i) => {
      const top = i * rowH + 6;
      text(marks, -10, top + 15, r.label, { "text-anchor": "end", class: "row-label" });
      tip(el("rect", Object.assign({ x: 0, y: top, width: Math.max(x(r.value), 1), height: rowH - 12, fill: r.color, class: "bar" }, r.attrs), marks), r.title);
      text(marks, x(r.value) + 6, top + 15, (opts.format || fmt.usd)(r.value), { class: "value-label" });
    });
    if (!rows.length) text(g, w / 2, h / 2, opts.emptyText || "No data in this range", { class: "empty", "text-anchor": "middle" });
  }

  // rows: [{label, spent, reserved, soft, hard, attrs}]: spend and reservations against soft and hard marks.
  function budgetBars(svg, rows) {
    const rowH = 60;
    const top = Math.max(0, ...rows.map((r) => Math.max(r.spent + r.reserved, r.soft || 0, r.hard || 0)));
    const { g, x, w, h } = hFrame(svg, rows.length, rowH, top * 1.05, 40, fmt.usdTick, "this month's spend (USD)");
    rows.forEach((r, i) => {
      const y0 = i * rowH + 8;
      const bh = 26;
      const row = el("g", Object.assign({ class: "budget" }, r.attrs), g);
      text(row, -10, y0 + bh / 2 + 4, r.label, { "text-anchor": "end", class: "row-label" });
      el("rect", { x: 0, y: y0, width: w, height: bh, class: "track" }, row);
      const over = r.hard !== null && r.spent >= r.hard ? " over-hard" : r.soft !== null && r.spent >= r.soft ? " over-soft" : "";
      tip(el("rect", { x: 0, y: y0, width: Math.max(x(r.spent), 1), height: bh, class: "spent" + over }, row), r.label + ": spent " + fmt.usd(r.spent));
      if (r.reserved > 0) tip(el("rect", { x: x(r.spent), y: y0, width: x(r.reserved), height: bh, class: "reserved" }, row), "reserved in flight " + fmt.usd(r.reserved));
      const notes = ["spent " + fmt.usd(r.spent)];
      if (r.soft !== null && r.soft !== undefined) notes.push("soft " + fmt.usd(r.soft));
      if (r.hard !== null && r.hard !== undefined) notes.push("hard " + fmt.usd(r.hard));
      text(row, 4, y0 + bh + 16, notes.join(" · "), { class: "budget-note" });
      for (const [kind, limit] of [["soft", r.soft], ["hard", r.hard]]) {
        if (limit === null || limit === undefined) continue;
        const mark = el("g", { class: "limit " + kind }, row);
        el("line", { x1: x(limit), x2: x(limit), y1: y0 - 5, y2: y0 + bh + 5 }, mark);
        tip(el("rect", { x: x(limit) - 5, y: y0 - 5, width: 10, height: bh + 10, class: "hit" }, mark), kind + " limit " + fmt.usd(limit));
      }
    });
    if (!rows.length) text(g, w / 2, h / 2, "No budgets configured", { class: "empty", "text-anchor": "middle" });
  }

  // An HTML legend: [{name, color, dash}].
  function legend(container, items) {
    container.textContent = "";
    for (const item of items) {
      const entry = document.createElement("span");
      entry.className = "legend-item";
      entry.dataset.series = item.name;
      const swatch = document.createElement("span");
      swatch.className = "swatch" + (item.dash ? " dashed" : "");
      swatch.style.setProperty("--swatch", item.color);
      entry.append(swatch, document.createTextNode(item.name));
      container.appendChild(entry);
    }
  }

  window.Charts = { stackedBars, lines, hBars, budgetBars, legend, color, fmt, niceTicks };
})();
