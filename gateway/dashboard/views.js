// The dashboard's views: turns API answers into charts (charts.js) and the tables beside them.
// Owns what each view shows; not fetching, signing in or the date range (app.js).
// Table cells carry the API's figure unformatted in data-value, so what is shown can be checked.
"use strict";

(function () {
  const C = window.Charts;
  const f = C.fmt;

  // columns: [{key, label, format, num}]; rows: [{attrs, values}]; foot: {values} or null.
  function table(node, columns, rows, foot) {
    node.textContent = "";
    const head = node.createTHead().insertRow();
    for (const c of columns) {
      const th = document.createElement("th");
      th.textContent = c.label;
      if (c.num) th.className = "num";
      head.appendChild(th);
    }
    const body = node.createTBody();
    const fill = (tr, values) => {
      for (const c of columns) {
        const td = tr.insertCell();
        const v = values[c.key];
        td.dataset.field = c.key;
        td.dataset.value = v === null || v === undefined ? "" : String(v);
        td.textContent = c.format ? c.format(v) : v === null || v === undefined ? "–" : String(v);
        if (c.num) td.className = "num";
      }
    };
    for (const r of rows) {
      const tr = body.insertRow();
      for (const [k, v] of Object.entries(r.attrs || {})) tr.setAttribute(k, v);
      fill(tr, r.values);
    }
    if (!rows.length) {
      const td = body.insertRow().insertCell();
      td.colSpan = columns.length;
      td.className = "empty";
      td.textContent = "No data in this range";
    }
    if (foot) fill(node.createTFoot().insertRow(), foot);
  }

  function sum(rows, key) {
    return rows.reduce((s, r) => s + (r[key] || 0), 0);
  }

  const TOKENS = [
    { key: "requests", label: "Requests", format: f.int, num: true },
    { key: "input_tokens", label: "Input tokens", format: f.int, num: true },
    { key: "cached_input_tokens", label: "Cached input", format: f.int, num: true },
    { key: "output_tokens", label: "Output tokens", format: f.int, num: true },
    { key: "cost_usd", label: "Cost", format: f.usd, num: true },
    { key: "saved_usd", label: "Saved by cache", format: f.usd, num: true },
  ];

  function totals(rows, first) {
    const out = { [first]: "Total" };
    for (const c of TOKENS) out[c.key] = sum(rows, c.key);
    return out;
  }

  // byDay: spend rows grouped by tenant and day; byTenant: the same range grouped by tenant.
  function spend(days, byDay, byTenant, colorOf) {
    const tenants = byTenant.map((r) => r.tenant);
    const series = tenants.map((t) => {
      const cell = (i) => byDay.find((r) => r.tenant === t && r.day === days[i]);
      return {
        name: t === null ? "(no tenant)" : t,
        color: colorOf(t),
        values: days.map((_, i) => (cell(i) ? cell(i).cost_usd : 0)),
        attrs: (i) => ({ "data-tenant": t === null ? "" : t, "data-day": days[i], "data-cost": cell(i).cost_usd, "data-requests": cell(i).requests }),
        title: (i) => t + " · " + f.day(days[i]) + "\n" + f.usd(cell(i).cost_usd) + " · " + f.int(cell(i).requests) + " requests",
      };
    });
    C.legend(document.getElementById("spend-legend"), series);
    C.stackedBars(document.getElementById("spend-chart"), { categories: days, series: series, yLabel: "cost (USD)", xLabel: "day (UTC)" });
    table(
      document.getElementById("spend-table"),
      [{ key: "tenant", label: "Tenant" }, ...TOKENS],
      byTenant.map((r) => ({ attrs: { "data-tenant": r.tenant === null ? "" : r.tenant }, values: r })),
      byTenant.length ? totals(byTenant, "tenant") : null,
    );
  }

  function providers(rows) {
    C.hBars(document.getElementById("provider-chart"), {
      rows: rows.map((r, i) => ({
        label: r.provider || "(none)",
        value: r.cost_usd,
        color: C.color(i),
        attrs: { "data-provider": r.provider || "", "data-cost": r.cost_usd, "data-requests": r.requests },
        title: (r.provider || "(none)") + ": " + f.usd(r.cost_usd) + " over " + f.int(r.requests) + " requests",
      })),
      xLabel: "cost (USD)",
    });
    table(
      document.getElementById("provider-table"),
      [{ key: "provider", label: "Provider" }, ...TOKENS],
      rows.map((r) => ({ attrs: { "data-provider": r.provider || "" }, values: r })),
      rows.length ? totals(rows, "provider") : null,
    );
  }

  // byDay: goodput rows grouped by tenant and day; detail: grouped by tenant, deployment and SLO class.
  function goodput(days, byDay, detail, colorOf) {
    const tenants = [...new Set(byDay.map((r) => r.tenant))].sort();
    const series = tenants.map((t) => {
      const cell = (i) => byDay.find((r) => r.tenant === t && r.day === days[i]);
      return {
        name: t,
        color: colorOf(t),
        values: days.map((_, i) => (cell(i) ? cell(i).slo_met_share : null)),
        attrs: (i) => ({ "data-tenant": t, "data-day": days[i], "data-share": cell(i).slo_met_share, "data-requests": cell(i).requests }),
        title: (i) => t + " · " + f.day(days[i]) + "\n" + f.pct(cell(i).slo_met_share) + " met (" + cell(i).slo_met + " of " + cell(i).requests + ")",
      };
    });
    C.legend(document.getElementById("goodput-legend"), series);
    C.lines(document.getElementById("goodput-chart"), {
      categories: days, series: series, yMax: 1, yTick: (v) => Math.round(v * 100) + "%", yLabel: "SLO met", xLabel: "day (UTC)",
    });
    table(
      document.getElementById("goodput-table"),
      [
        { key: "tenant", label: "Tenant" },
        { key: "deployment", label: "Deployment" },
        { key: "slo_class", label: "SLO class" },
        { key: "requests", label: "Requests", format: f.int, num: true },
        { key: "slo_met", label: "SLO met", format: f.int, num: true },
        { key: "slo_met_share", label: "Share", format: f.pct, num: true },
        { key: "goodput_rps", label: "Goodput (req/s)", format: (v) => v.toPrecision(3), num: true },
        { key: "cost_per_slo_met_usd", label: "Cost per SLO-met", format: f.usd, num: true },
        { key: "ttft_p95_ms", label: "TTFT p95", format: f.ms, num: true },
        { key: "tpot_p95_ms", label: "TPOT p95", format: f.ms, num: true },
      ],
      detail.map((r) => ({ attrs: { "data-key": [r.tenant, r.deployment, r.slo_class].join("|") }, values: r })),
      null,
    );
  }

  const QUANTILES = [["p50", "#4e79a7", false], ["p95", "#f28e2b", false], ["p99", "#e15759", true]];

  function latencyChart(id, legendId, days, byDay, metric) {
    const series = QUANTILES.map(([q, color, dash]) => {
      const key = metric + "_" + q + "_ms";
      const cell = (i) => byDay.find((r) => r.day === days[i]);
      return {
        name: metric.toUpperCase() + " " + q,
        color: color,
        dash: dash,
        values: days.map((_, i) => (cell(i) ? cell(i)[key] : null)),
        attrs: (i) => ({ "data-series": key, "data-day": days[i], "data-value": cell(i)[key] }),
        title: (i) => metric.toUpperCase() + " " + q + " · " + f.day(days[i]) + ": " + f.ms(cell(i)[key]),
      };
    });
    C.legend(document.getElementById(legendId), series);
    C.lines(document.getElementById(id), {
      categories: days, series: series, yTick: (v) => v + " ms", yLabel: "milliseconds", xLabel: "day (UTC)",
      emptyText: "No streamed requests in this range",
    });
  }

  function latency(days, byDay) {
    latencyChart("ttft-chart", "ttft-legend", days, byDay, "ttft");
    latencyChart("tpot-chart", "tpot-legend", days, byDay, "tpot");
    const cols = [{ key: "day", label: "Day" }, { key: "requests", label: "Requests", format: f.int, num: true }];
    for (const m of ["ttft", "tpot"]) {
      for (const [q] of QUANTILES) cols.push({ key: m + "_" + q + "_ms", label: m.toUpperCase() + " " + q, format: f.ms, num: true });
    }
    table(document.getElementById("latency-table"), cols, byDay.map((r) => ({ attrs: { "data-day": r.day }, values: r })), null);
  }

  function budgetLabel(r) {
    return r.key_id ? r.tenant + " · key " + r.key_id : r.tenant;
  }

  function budgetState(r) {
    if (r.hard_limit_usd !== null && r.spent_usd >= r.hard_limit_usd) return "hard limit reached";
    if (r.soft_limit_usd !== null && r.spent_usd >= r.soft_limit_usd) return "over soft limit";
    return "ok";
  }

  function budgets(rows) {
    C.legend(document.getElementById("budget-legend"), [
      { name: "spent", color: "#4e79a7" }, { name: "reserved in flight", color: "#a0cbe8" },
      { name: "soft limit", color: "#edc948", dash: true }, { name: "hard limit", color: "#e15759" },
    ]);
    C.budgetBars(document.getElementById("budget-chart"), rows.map((r) => ({
      label: budgetLabel(r), spent: r.spent_usd, reserved: r.reserved_usd, soft: r.soft_limit_usd, hard: r.hard_limit_usd,
      attrs: { "data-tenant": r.tenant, "data-key-id": r.key_id || "", "data-spent": r.spent_usd, "data-reserved": r.reserved_usd,
        "data-soft": r.soft_limit_usd === null ? "" : r.soft_limit_usd, "data-hard": r.hard_limit_usd === null ? "" : r.hard_limit_usd },
    })));
    table(
      document.getElementById("budget-table"),
      [
        { key: "scope", label: "Tenant / key" },
        { key: "period", label: "Month" },
        { key: "spent_usd", label: "Spent", format: f.usd, num: true },
        { key: "reserved_usd", label: "Reserved", format: f.usd, num: true },
        { key: "soft_limit_usd", label: "Soft limit", format: f.usd, num: true },
        { key: "hard_limit_usd", label: "Hard limit", format: f.usd, num: true },
        { key: "state", label: "Status" },
      ],
      rows.map((r) => ({
        attrs: { "data-tenant": r.tenant, "data-key-id": r.key_id || "" },
        values: Object.assign({ scope: budgetLabel(r), state: budgetState(r) }, r),
      })),
      null,
    );
  }

  function policy(serving, info) {
    document.getElementById("policy-name").textContent = serving.name;
    document.getElementById("policy-version").textContent = String(info.version);
    document.getElementById("policy-saved").textContent = info.created_at.replace("T", " ").slice(0, 19) + " UTC by " + info.author;
    document.getElementById("policy-comment").textContent = info.comment || "–";
    yaml(document.getElementById("policy-body"), info.body);
  }

  // The policy text with keys and comments marked for colour; its textContent stays the text itself.
  function yaml(pre, body) {
    pre.textContent = "";
    const span = (cls, content) => {
      const node = document.createElement("span");
      node.className = cls;
      node.textContent = content;
      return node;
    };
    body.split("\n").forEach((line, i) => {
      if (i) pre.appendChild(document.createTextNode("\n"));
      const key = /^(\s*(?:- )?)([\w.-]+)(:)(?=\s|$)/.exec(line);
      if (/^\s*#/.test(line)) pre.appendChild(span("y-comment", line));
      else if (key) pre.append(key[1], span("y-key", key[2]), key[3] + line.slice(key[0].length));
      else pre.appendChild(document.createTextNode(line));
    });
  }

  window.Views = { spend, providers, goodput, latency, budgets, policy, table };
})();
