// The dashboard's shell: signing in with a key, the date range, the tabs, and fetching from the API.
// Owns the key (kept in sessionStorage, sent as a Bearer token) and the load cycle; views.js draws.
// body[data-state] is "signed-out", "loading", "ready" or "error", so a test can wait for a load.
"use strict";

(function () {
  const KEY = "crossway.dashboard.key";
  const DAY_MS = 86400000;
  const $ = (id) => document.getElementById(id);
  let generation = 0; // a newer load makes an older one's answers stale

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, params) {
    const query = params ? "?" + new URLSearchParams(params).toString() : "";
    const response = await fetch(path + query, {
      headers: { Authorization: "Bearer " + sessionStorage.getItem(KEY), Accept: "application/json" },
      cache: "no-store",
    });
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const message = body && body.error && body.error.message ? body.error.message : "HTTP " + response.status;
      throw new ApiError(response.status, message);
    }
    return body;
  }

  function isoDay(date) {
    return date.toISOString().slice(0, 10);
  }

  function addDays(day, n) {
    return isoDay(new Date(Date.parse(day + "T00:00:00Z") + n * DAY_MS));
  }

  function daysOf(start, end) {
    const out = [];
    for (let d = start; d <= end && out.length < 400; d = addDays(d, 1)) out.push(d);
    return out;
  }

  function setPreset(preset) {
    const today = isoDay(new Date());
    $("range-end").value = today;
    $("range-start").value = preset === "month" ? today.slice(0, 8) + "01" : addDays(today, 1 - Number(preset));
  }

  function setState(state) {
    document.body.dataset.state = state;
  }

  function showError(node, message) {
    node.textContent = message;
    node.hidden = !message;
  }

  function signedOut(message) {
    sessionStorage.removeItem(KEY);
    generation++;
    $("app").hidden = true;
    $("session").hidden = true;
    $("login-panel").hidden = false;
    showError($("login-error"), message || "");
    $("key-input").value = "";
    $("key-input").focus();
    setState("signed-out");
  }

  async function signIn(key) {
    sessionStorage.setItem(KEY, key);
    setState("loading");
    try {
      const who = await api("/admin/whoami");
      $("role").textContent = who.role === "admin" ? "admin" : "finance · read-only";
      $("role").dataset.role = who.role;
    } catch (err) {
      signedOut(err.status === 401 || err.status === 403 ? "Key refused: " + err.message : "Cannot reach the gateway: " + err.message);
      return;
    }
    $("login-panel").hidden = true;
    $("app").hidden = false;
    $("session").hidden = false;
    showError($("login-error"), "");
    await load();
  }

  function colorsFor(names) {
    const sorted = [...new Set(names)].sort();
    return (name) => window.Charts.color(sorted.indexOf(name));
  }

  async function load() {
    const start = $("range-start").value;
    const end = $("range-end").value;
    if (!start || !end || start > end) {
      showError($("app-error"), "Pick a start date on or before the end date.");
      setState("error");
      return;
    }
    const mine = ++generation;
    setState("loading");
    showError($("app-error"), "");
    // The page's end date is inclusive; the API's end is exclusive, so it asks up to the next midnight (UTC).
    const range = { start: start + "T00:00:00+00:00", end: addDays(end, 1) + "T00:00:00+00:00" };
    try {
      const [byTenantDay, byTenant, byProvider, goodDay, goodDetail, latency, budgets, policies] = await Promise.all([
        api("/admin/finance/spend", Object.assign({ group_by: "tenant,day" }, range)),
        api("/admin/finance/spend", Object.assign({ group_by: "tenant" }, range)),
        api("/admin/finance/spend", Object.assign({ group_by: "provider" }, range)),
        api("/admin/finance/goodput", Object.assign({ group_by: "tenant,day" }, range)),
        api("/admin/finance/goodput", range),
        api("/admin/finance/goodput", Object.assign({ group_by: "day" }, range)),
        api("/admin/finance/budgets"),
        api("/admin/policies"),
      ]);
      const serving = policies.serving;
      const policy = await api("/admin/policies/" + encodeURIComponent(serving.name), { version: serving.version });
      if (mine !== generation) return;
      const days = daysOf(start, end);
      const colorOf = colorsFor(byTenant.data.map((r) => r.tenant).concat(goodDay.data.map((r) => r.tenant)));
      summary(byTenant.data, goodDetail.data);
      window.Views.spend(days, byTenantDay.data, byTenant.data, colorOf);
      window.Views.providers(byProvider.data);
      window.Views.goodput(days, goodDay.data, goodDetail.data, colorOf);
      window.Views.latency(days, latency.data);
      window.Views.budgets(budgets.data);
      window.Views.policy(serving, policy);
      $("range-note").textContent = days.length + (days.length === 1 ? " day" : " days") + ", UTC";
      document.body.dataset.range = start + "/" + end;
      setState("ready");
    } catch (err) {
      if (mine !== generation) return;
      if (err.status === 401) {
        signedOut("Key refused: " + err.message);
        return;
      }
      showError($("app-error"), "Could not load: " + err.message);
      setState("error");
    }
  }

  function summary(byTenant, goodDetail) {
    const total = (rows, key) => rows.reduce((s, r) => s + (r[key] || 0), 0);
    const f = window.Charts.fmt;
    const stat = (id, value, shown) => {
      $(id).dataset.value = String(value);
      $(id).textContent = shown;
    };
    const cost = total(byTenant, "cost_usd");
    stat("sum-cost", cost, f.usd(cost));
    stat("sum-requests", total(byTenant, "requests"), f.int(total(byTenant, "requests")));
    const tokensIn = total(byTenant, "input_tokens");
    const tokensOut = total(byTenant, "output_tokens");
    stat("sum-tokens", tokensIn + "/" + tokensOut, f.int(tokensIn) + " / " + f.int(tokensOut));
    const served = total(goodDetail, "requests");
    const share = served ? total(goodDetail, "slo_met") / served : null;
    stat("sum-slo", share === null ? "" : share, f.pct(share));
  }

  function showView(name) {
    for (const tab of document.querySelectorAll("[data-view]")) {
      const on = tab.dataset.view === name;
      tab.setAttribute("aria-selected", String(on));
      $("view-" + tab.dataset.view).hidden = !on;
    }
  }

  function init() {
    setPreset("7");
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (key) signIn(key);
    });
    $("sign-out").addEventListener("click", () => signedOut(""));
    $("range-form").addEventListener("submit", (event) => {
      event.preventDefault();
      load();
    });
    for (const button of document.querySelectorAll("[data-preset]")) {
      button.addEventListener("click", () => {
        setPreset(button.dataset.preset);
        load();
      });
    }
    for (const tab of document.querySelectorAll("[data-view]")) {
      tab.addEventListener("click", () => showView(tab.dataset.view));
    }
    const saved = sessionStorage.getItem(KEY);
    if (saved) signIn(saved);
    else signedOut("");
  }

  document.addEventListener("DOMContentLoaded", init);
})();
