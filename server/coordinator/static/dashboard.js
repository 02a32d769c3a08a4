// fedveil dashboard: self-contained (no libraries), reads the public API every 3 s.
"use strict";

const COLORS = { blue: "#2563eb", green: "#16a34a", red: "#dc2626", amber: "#d97706", violet: "#7c3aed", grey: "#9ca3af" };
const state = { selected: null };

async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function fmtTime(t) {
  return t ? new Date(t * 1000).toLocaleString() : "—";
}

// -- charts ------------------------------------------------------------------
// series: [{name, color, points: [[x, y], ...], kind: "line" | "bar" | "hline"}]
function drawChart(canvas, series, opts) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 48, R = 12, T = 22, B = 28;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "11px system-ui, sans-serif";
  const pts = series.flatMap((s) => s.points.filter((p) => Number.isFinite(p[1])));
  canvas.dataset.points = String(series.filter((s) => s.kind !== "hline").reduce((n, s) => n + s.points.length, 0));
  if (!pts.length) {
    ctx.fillStyle = COLORS.grey;
    ctx.fillText(opts.empty || "no data yet", L, H / 2);
    return;
  }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = opts.yMin ?? Math.min(...pts.map((p) => p[1])), y1 = opts.yMax ?? Math.max(...pts.map((p) => p[1]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const pad = (y1 - y0) * 0.08; if (opts.yMin === undefined) y0 -= pad; if (opts.yMax === undefined) y1 += pad;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  // axes and grid
  ctx.strokeStyle = "#e5e7eb"; ctx.fillStyle = "#6b7280"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    ctx.beginPath(); ctx.moveTo(L, Y(y)); ctx.lineTo(W - R, Y(y)); ctx.stroke();
    ctx.fillText(Math.abs(y) >= 100 ? y.toFixed(0) : y.toPrecision(3), 4, Y(y) + 4);
  }
  const step = Math.max(1, Math.ceil((x1 - x0) / 8));
  for (let x = Math.ceil(x0); x <= x1; x += step) ctx.fillText(String(x), X(x) - 3, H - 10);
  ctx.fillText(opts.xLabel || "round", W - R - 34, H - 10);
  // series
  let lx = L;
  for (const s of series) {
    ctx.strokeStyle = ctx.fillStyle = s.color; ctx.lineWidth = 2;
    const p = s.points.filter((q) => Number.isFinite(q[1]));
    if (s.kind === "hline" && p.length) {
      ctx.setLineDash([6, 4]); ctx.beginPath(); ctx.moveTo(L, Y(p[0][1])); ctx.lineTo(W - R, Y(p[0][1])); ctx.stroke(); ctx.setLineDash([]);
    } else if (s.kind === "bar") {
      const bw = Math.max(3, ((W - L - R) / Math.max(1, x1 - x0 + 1)) * 0.35);
      for (const [x, y] of p) ctx.fillRect(X(x) - bw / 2, Y(Math.max(y, y0)), bw, Y(y0) - Y(Math.max(y, y0)));
    } else {
      ctx.beginPath();
      p.forEach(([x, y], i) => (i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
      ctx.stroke();
      for (const [x, y] of p) { ctx.beginPath(); ctx.arc(X(x), Y(y), 2.5, 0, 7); ctx.fill(); }
    }
    ctx.fillRect(lx, 6, 10, 10); ctx.fillStyle = "#374151"; ctx.fillText(s.name, lx + 14, 15);
    lx += 24 + ctx.measureText(s.name).width;
  }
}

function seq(rounds, key) {
  return rounds.filter((r) => r[key] !== null && r[key] !== undefined).map((r) => [r.round, Number(r[key])]);
}

// -- views -------------------------------------------------------------------
function renderCluster(c) {
  const sl = document.getElementById("superlink");
  sl.textContent = `SuperLink ${c.superlink}`; sl.className = `pill ${c.superlink === "up" ? "ok" : "bad"}`;
  const n = c.clients_connected;
  document.getElementById("connected").textContent = `${n === null ? "?" : n} clients connected`;
  const sec = document.getElementById("security");
  sec.textContent = `${c.tls ? "TLS" : "no TLS"} · ${c.client_auth ? "client auth" : "no client auth"}`;
  sec.className = `pill ${c.tls && c.client_auth ? "ok" : "bad"}`;
}

function renderRuns(runs) {
  const body = document.querySelector("#runs tbody");
  body.replaceChildren();
  if (!runs.length) {
    body.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no runs yet: fedveil run submit run.toml")));
    return;
  }
  if (!state.selected || !runs.some((r) => r.id === state.selected)) {
    state.selected = (runs.find((r) => r.status === "running") || runs[0]).id;
  }
  for (const r of runs) {
    const pct = r.rounds ? Math.round((100 * r.rounds_completed) / r.rounds) : 0;
    const bar = el("div", { class: "progress" }, el("div", { style: `width:${pct}%` }));
    const tr = el(
      "tr",
      { class: r.id === state.selected ? "selected" : "", "data-run": r.id },
      el("td", { class: "mono" }, r.id),
      el("td", {}, r.name || "—"),
      el("td", {}, el("span", { class: `status ${r.status}` }, r.status + (r.phase ? ` · ${r.phase.replaceAll("_", " ")}` : ""))),
      el("td", {}, bar, ` ${r.rounds_completed}/${r.rounds}`),
      el("td", {}, r.model || "—"),
      el("td", {}, `${r.per_round ?? "?"} of ${r.num_clients ?? "?"}`),
      el("td", {}, fmtTime(r.created_at)),
    );
    tr.addEventListener("click", () => { state.selected = r.id; refresh(); });
    body.append(tr);
  }
}

async function renderDetail(runs) {
  const run = runs.find((r) => r.id === state.selected);
  if (!run) return;
  document.getElementById("run-title").textContent = run.id;
  const st = document.getElementById("run-status");
  st.textContent = run.status; st.className = `status ${run.status}`;
  const rounds = await getJSON(`/runs/${encodeURIComponent(run.id)}/rounds`);
  let privacy = null;
  try { privacy = await getJSON(`/runs/${encodeURIComponent(run.id)}/privacy`); } catch (e) { privacy = null; }
  const last = rounds[rounds.length - 1] || {};
  const dropped = rounds.reduce((n, r) => n + (r.dropped || 0), 0);
  const facts = document.getElementById("facts");
  facts.replaceChildren(
    el("span", {}, "rounds ", el("b", {}, `${run.rounds_completed}/${run.rounds}`)),
    el("span", {}, "test accuracy ", el("b", {}, last.test_accuracy != null ? last.test_accuracy.toFixed(4) : "—")),
    el("span", {}, "dropouts ", el("b", {}, String(dropped))),
    el("span", {}, "attempts ", el("b", {}, String((run.attempts || []).length))),
    el("span", {}, "traffic ", el("b", {}, `${((run.bytes_sent + run.bytes_received) / 1e6).toFixed(2)} MB`)),
    ...(run.error ? [el("span", { class: "error" }, run.error)] : []),
  );
  drawChart(document.getElementById("chart-accuracy"), [
    { name: "central", color: COLORS.blue, points: seq(rounds, "test_accuracy") },
    { name: "federated", color: COLORS.violet, points: seq(rounds, "federated_accuracy") },
  ], { yMin: 0, yMax: 1 });
  drawChart(document.getElementById("chart-loss"), [
    { name: "train", color: COLORS.amber, points: seq(rounds, "train_loss") },
    { name: "test", color: COLORS.blue, points: seq(rounds, "test_loss") },
  ], {});
  drawChart(document.getElementById("chart-clients"), [
    { name: "connected", color: COLORS.grey, points: seq(rounds, "clients_connected") },
    { name: "dropped", color: COLORS.red, points: seq(rounds, "dropped"), kind: "bar" },
    { name: "aggregated", color: COLORS.green, points: seq(rounds, "cohort_aggregated") },
  ], { yMin: 0 });
  const eps = seq(rounds, "epsilon");
  const budget = privacy && (privacy.budget_epsilon ?? privacy.budget);
  if (!eps.length && privacy && Number.isFinite(privacy.epsilon)) eps.push([run.rounds_completed, privacy.epsilon]);
  const privSeries = [{ name: "epsilon", color: COLORS.violet, points: eps }];
  if (Number.isFinite(budget)) privSeries.push({ name: "budget", color: COLORS.red, points: [[0, budget]], kind: "hline" });
  drawChart(document.getElementById("chart-privacy"), privSeries, { yMin: 0, empty: "no privacy report: DP is off for this run" });
}

async function refresh() {
  try {
    const [cluster, runs] = await Promise.all([getJSON("/cluster"), getJSON("/runs")]);
    renderCluster(cluster);
    renderRuns(runs);
    await renderDetail(runs);
    document.body.dataset.loaded = "1";
  } catch (e) {
    document.body.dataset.error = String(e);
  }
}

refresh();
setInterval(refresh, 3000);
