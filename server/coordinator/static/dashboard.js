// fedveil dashboard: self-contained (no libraries, no CDN), reads the public API every 3 s.
// The page is served with style-src 'self': no inline style attributes; set styles via the CSSOM.
"use strict";

const COLORS = { blue: "#2563eb", green: "#16a34a", red: "#dc2626", amber: "#d97706", violet: "#7c3aed", grey: "#9ca3af" };
// A run's own URL: /dashboard/runs/<id> selects it (the page is the same).
const RUN_PATH = "/dashboard/runs/";
const state = {
  selected: location.pathname.startsWith(RUN_PATH)
    ? decodeURIComponent(location.pathname.slice(RUN_PATH.length)) : null,
};

async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// A run's rounds, held between polls: each poll asks only for the rounds after the last
// one held (GET /runs/{id}/rounds?since=&limit=, a page at most), so it costs what is new,
// not the run's length. A new attempt (a resume rewrites the rounds) starts over.
const ROUNDS_PAGE = 1000;
async function runRounds(run) {
  const key = `${run.id}#${(run.attempts || []).length}`;
  if (!state.rounds || state.rounds.key !== key) state.rounds = { key, list: [] };
  const held = state.rounds;
  const lastHeld = () => (held.list.length ? held.list[held.list.length - 1].round : 0);
  for (;;) {
    const since = lastHeld();
    const page = await getJSON(`/runs/${encodeURIComponent(run.id)}/rounds?since=${since}&limit=${ROUNDS_PAGE}`);
    const last = lastHeld(); // another poll may have added rounds meanwhile
    const fresh = page.filter((r) => r.round > last);
    held.list.push(...fresh);
    if (page.length < ROUNDS_PAGE || fresh.length === 0) break;
  }
  return held.list.slice();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// A local time is ambiguous without its zone: show the UTC offset ("UTC+02:00").
function fmtTime(t) {
  if (!t) return "—";
  const d = new Date(t * 1000);
  const off = -d.getTimezoneOffset(), a = Math.abs(off);
  const zone = `UTC${off < 0 ? "-" : "+"}${String(Math.floor(a / 60)).padStart(2, "0")}:${String(a % 60).padStart(2, "0")}`;
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zone}`;
}

// A round applied an update: "applied" (plain runs) or status "applied" (all runs, DP included).
function roundApplied(r) {
  return r.applied === true || r.status === "applied";
}

// A run diverged when its registered model is at chance level (the registry's warning).
function diverged(run) {
  return typeof run.model_version_warning === "string" && run.model_version_warning.includes("learned nothing");
}

// The status badge: a completed run that applied no update, diverged, or lost rounds
// is not a plain success.
function runBadge(run) {
  if (run.status === "completed" && run.rounds_applied === 0) {
    return { cls: "completed-empty", text: "completed, nothing applied" };
  }
  if (run.status === "completed" && diverged(run)) {
    return { cls: "completed-warn", text: "completed, diverged" };
  }
  if (run.status === "completed" && run.rounds_aborted > 0) {
    return { cls: "completed-warn", text: `completed, ${run.rounds_aborted} aborted` };
  }
  return { cls: run.status, text: run.status + (run.phase ? ` · ${run.phase.replaceAll("_", " ")}` : "") };
}

// -- charts ------------------------------------------------------------------
// series: [{name, color, points: [[x, y], ...], kind: "line" | "bar" | "hline"}]
// opts: {yMin, yMax, integer (counts: whole-number ticks), xLabel, empty}

// Round numbers for an axis: about `n` ticks on whole multiples of 1, 2 or 5 x 10^k
// (of 1 at least when `integer`), with the range widened to the outer ticks.
function niceAxis(lo, hi, integer, n) {
  if (hi <= lo) { const d = integer ? 1 : Math.max(Math.abs(lo) * 0.1, 0.1); lo -= d; hi += d; }
  let step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
  for (const m of [1, 2, 5, 10]) { if ((hi - lo) / (step * m) <= n) { step *= m; break; } }
  if (integer) step = Math.max(1, Math.round(step));
  const a = Math.floor(lo / step + 1e-9) * step, b = Math.ceil(hi / step - 1e-9) * step;
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const ticks = [];
  for (let i = 0; a + i * step <= b + step * 1e-6; i++) ticks.push(a + i * step);
  return { lo: a, hi: b, ticks, label: (v) => v.toFixed(decimals) };
}

// Lines that coincide must both stay visible: each line series gets its own dash.
const DASHES = [[], [7, 4], [2, 3], [10, 3, 2, 3]];

function drawChart(canvas, series, opts) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 52, R = 14, T = 24, B = 38;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "11px system-ui, sans-serif";
  ctx.setLineDash([]);
  const finite = (s) => s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
  const data = series.filter((s) => s.kind !== "hline");
  canvas.dataset.points = String(data.reduce((n, s) => n + s.points.length, 0));
  const xs = data.flatMap((s) => finite(s).map((p) => p[0]));
  const ys = series.flatMap((s) => finite(s).map((p) => p[1]));
  // The legend names only what is drawn: a series with no finite point (federated
  // evaluation off) would be a swatch for nothing. Threshold lines (budget) stay.
  const shown = series.filter((s) => s.kind === "hline" || finite(s).length);
  canvas.dataset.legend = shown.map((s) => s.name).join(",");
  if (!xs.length) {
    ctx.fillStyle = COLORS.grey;
    ctx.textAlign = "center";  // in the middle of the empty plot, not at its left edge
    ctx.fillText(opts.empty || "no data yet", W / 2, H / 2);
    ctx.textAlign = "start";
    return;
  }
  // x: whole rounds, half a round of margin each side so bars and end points stay inside
  const xr = niceAxis(Math.min(...xs), Math.max(...xs), true, 8);
  const x0 = Math.min(...xs) - 0.5, x1 = Math.max(...xs) + 0.5;
  // y: never below 0 when every value is >= 0 (losses, counts, epsilon)
  // and a little headroom so a line at the extreme is not drawn on the plot's edge
  let lo = opts.yMin ?? Math.min(...ys), hi = opts.yMax ?? Math.max(...ys);
  const margin = (hi - lo) * 0.05;
  if (opts.yMax === undefined) hi += margin;
  if (opts.yMin === undefined) lo = Math.min(...ys) >= 0 ? Math.max(0, lo - margin) : lo - margin;
  const yr = niceAxis(lo, hi, !!opts.integer, 5);
  const y0 = opts.yMin ?? yr.lo, y1 = opts.yMax ?? yr.hi;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  // grid, y ticks (right-aligned against the plot), x ticks, axis label centred below them
  ctx.strokeStyle = "#e5e7eb"; ctx.fillStyle = "#6b7280"; ctx.lineWidth = 1;
  ctx.textAlign = "right";
  for (const v of yr.ticks.filter((v) => v >= y0 - 1e-9 && v <= y1 + 1e-9)) {
    ctx.beginPath(); ctx.moveTo(L, Y(v)); ctx.lineTo(W - R, Y(v)); ctx.stroke();
    ctx.fillText(yr.label(v), L - 6, Y(v) + 4);
  }
  ctx.strokeStyle = "#9ca3af";
  ctx.beginPath(); ctx.moveTo(L, T); ctx.lineTo(L, H - B); ctx.lineTo(W - R, H - B); ctx.stroke();
  ctx.textAlign = "center";
  for (const x of xr.ticks.filter((x) => x >= x0 && x <= x1)) ctx.fillText(String(x), X(x), H - B + 14);
  ctx.fillText(opts.xLabel || "round", L + (W - L - R) / 2, H - 6);
  ctx.textAlign = "left";
  // series, clipped to the plot area
  ctx.save();
  ctx.beginPath(); ctx.rect(L, T, W - L - R, H - T - B); ctx.clip();
  let lines = 0;
  const styles = series.map((s) => (s.kind === "hline" ? [6, 4] : s.kind === "bar" ? null : DASHES[lines++ % DASHES.length]));
  series.forEach((s, i) => {
    ctx.strokeStyle = ctx.fillStyle = s.color; ctx.lineWidth = 2;
    const p = finite(s);
    if (s.kind === "hline" && p.length) {
      ctx.setLineDash(styles[i]); ctx.beginPath(); ctx.moveTo(L, Y(p[0][1])); ctx.lineTo(W - R, Y(p[0][1])); ctx.stroke();
    } else if (s.kind === "bar") {
      const bw = Math.max(3, ((W - L - R) / (x1 - x0)) * 0.35);
      const base = Y(Math.max(0, y0));
      for (const [x, y] of p) ctx.fillRect(X(x) - bw / 2, Y(y), bw, base - Y(y));
    } else {
      ctx.setLineDash(styles[i]);
      ctx.beginPath();
      p.forEach(([x, y], j) => (j ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
      ctx.stroke();
      ctx.setLineDash([]);
      for (const [x, y] of p) { ctx.beginPath(); ctx.arc(X(x), Y(y), 2.5, 0, 7); ctx.fill(); }
    }
    ctx.setLineDash([]);
  });
  ctx.restore();
  // legend: a swatch in each series' colour and dash
  let lx = L;
  series.forEach((s, i) => {
    if (!shown.includes(s)) return;  // its colour and dash (styles[i]) stay the series' own
    ctx.strokeStyle = ctx.fillStyle = s.color; ctx.lineWidth = 2;
    if (s.kind === "bar") ctx.fillRect(lx, 7, 12, 10);
    else { ctx.setLineDash(styles[i]); ctx.beginPath(); ctx.moveTo(lx, 12); ctx.lineTo(lx + 18, 12); ctx.stroke(); ctx.setLineDash([]); }
    const w = s.kind === "bar" ? 12 : 18;
    ctx.fillStyle = "#374151"; ctx.fillText(s.name, lx + w + 4, 16);
    lx += w + 16 + ctx.measureText(s.name).width;
  });
}

function seq(rounds, key) {
  return rounds.filter((r) => r[key] !== null && r[key] !== undefined).map((r) => [r.round, Number(r[key])]);
}

// Asynchronous runs (server.mode async/ssp): each record is an applied model version and
// lists the staleness of its updates. Under DP these keys are private: nothing is shown.
function asyncFacts(rounds) {
  const taus = rounds.flatMap((r) => (Array.isArray(r.staleness) ? r.staleness.map(Number) : []));
  const isAsync = rounds.some((r) => Array.isArray(r.staleness) || r.in_flight != null);
  if (!isAsync) return null;
  const facts = [el("span", {}, "mode ", el("b", {}, rounds.find((r) => r.mode)?.mode || "async"))];
  if (taus.length) {
    const mean = taus.reduce((a, b) => a + b, 0) / taus.length;
    facts.push(el("span", {}, "staleness ", el("b", {}, `mean ${mean.toFixed(2)}, max ${Math.max(...taus)}`)));
  }
  const stale = rounds.reduce((n, r) => n + (r.stale_dropped || 0), 0);
  facts.push(el("span", {}, "stale dropped ", el("b", {}, String(stale))));
  const last = [...rounds].reverse().find((r) => r.in_flight != null);
  if (last) facts.push(el("span", {}, "in flight ", el("b", {}, String(last.in_flight))));
  return facts;
}

// -- views -------------------------------------------------------------------
// Clients dropped per failed check, summed over the rounds, with the rounds each one hit.
function dropsByReason(rounds) {
  const byReason = new Map();
  for (const r of rounds) {
    for (const [reason, n] of Object.entries(r.drops_by_reason || {})) {
      const row = byReason.get(reason) || { reason, clients: 0, rounds: [] };
      row.clients += Number(n) || 0;
      if (n > 0) row.rounds.push(r.round);
      byReason.set(reason, row);
    }
  }
  return [...byReason.values()].sort((a, b) => b.clients - a.clients || a.reason.localeCompare(b.reason));
}

function roundList(rounds) {
  const shown = rounds.slice(0, 12).join(", ");
  return rounds.length > 12 ? `${shown}, … (${rounds.length} rounds)` : shown;
}

// Under DP the public rounds carry no drop counts or reasons: they reveal who took part
// (README "Trust model"). The page has no admin token, so it says where operators look.
function renderDrops(run, rounds, dp) {
  const box = document.getElementById("drops");
  box.dataset.view = dp ? "withheld" : "public";
  if (dp) {
    box.replaceChildren(el("p", { class: "muted" },
      "Drop reasons are withheld under DP: who dropped, and how many, reveals who took part. Operators: ",
      el("span", { class: "mono" }, `GET /runs/${run.id}/rounds/private`), " with the admin token."));
    return;
  }
  const rows = dropsByReason(rounds);
  const total = rows.reduce((n, r) => n + r.clients, 0);
  if (!rows.length) {
    const dropped = rounds.reduce((n, r) => n + (r.dropped || 0), 0);
    box.replaceChildren(el("p", { class: "muted" }, dropped
      ? `${dropped} client(s) dropped; these rounds record no reasons.`
      : "No client dropped in the rounds so far."));
    return;
  }
  const body = el("tbody", {});
  for (const r of rows) {
    const pct = Math.round((100 * r.clients) / total);
    const fill = el("div", {}); fill.style.width = `${pct}%`;  // CSSOM: allowed by the CSP
    body.append(el("tr", { "data-reason": r.reason },
      el("td", { class: "mono" }, r.reason),
      el("td", { class: "num" }, String(r.clients)),
      el("td", {}, el("div", { class: "share" }, fill), ` ${pct}%`),
      el("td", {}, roundList(r.rounds))));
  }
  box.replaceChildren(el("table", { class: "drops" },
    el("thead", {}, el("tr", {}, el("th", {}, "Failed check"), el("th", { class: "num" }, "Clients dropped"),
      el("th", {}, "Share"), el("th", {}, "Rounds"))),
    body));
}

function renderCluster(c) {
  const sl = document.getElementById("superlink");
  sl.textContent = `SuperLink ${c.superlink}`; sl.className = `pill ${c.superlink === "up" ? "ok" : "bad"}`;
  const n = c.clients_connected;
  const conn = document.getElementById("connected");
  conn.textContent = `${n === null ? "?" : n} clients connected`;
  // Online nodes that map to no enrolled client (refused, revoked, or registered behind
  // the coordinator's back) are not clients: shown apart, as a warning.
  const unknown = c.nodes_unmapped || 0;
  conn.title = unknown ? `${unknown} online node(s) map to no enrolled client` : "";
  conn.className = `pill${unknown ? " bad" : ""}`;
  if (unknown) conn.textContent += ` · ${unknown} unknown node${unknown === 1 ? "" : "s"}`;
  const sec = document.getElementById("security");
  sec.textContent = `${c.tls ? "TLS" : "no TLS"} · ${c.client_auth ? "client auth" : "no client auth"}`;
  sec.className = `pill ${c.tls && c.client_auth ? "ok" : "bad"}`;
}

// Drift ([drift] in server.toml): evaluations of the promoted version on the devices and
// the retraining runs they started; hidden when the coordinator has drift off. A DP
// version's evaluation shows only what it released: the noised accuracy, its epsilon and
// the version's budget spent and left, and the most-charged device's epsilon across every
// version (never a count of devices).
const fmtEps = (x) => Number(x || 0).toFixed(2);

function driftPrivacy(h) {
  if (!h.dp) return el("span", { class: "muted" }, "no DP: not accounted");
  if (h.charge === "refunded") return `ε 0 (nothing unmasked: refunded)`;
  return el("span", { "data-epsilon": fmtEps(h.epsilon) },
    "ε ", el("b", {}, fmtEps(h.epsilon)),
    ` · spent ${fmtEps(h.epsilon_spent)} of ${fmtEps(h.budget)}, ${fmtEps(h.budget_left)} left`);
}

function driftBudgetFacts(d) {
  if (!d.dp) return [];
  const facts = [el("span", {}, "DP versions ", el("b", {}, `ε ${fmtEps(d.dp.epsilon)} per evaluation`),
    ` (δ ${Number(d.dp.delta).toExponential()}), budget `, el("b", {}, fmtEps(d.dp.budget)), " per version")];
  const last = (d.history || []).filter((h) => h.dp).slice(-1)[0];
  if (last) {
    facts.push(el("span", { id: "drift-budget" }, `${last.version}: spent `,
      el("b", {}, fmtEps(last.epsilon_spent)), ", left ", el("b", {}, fmtEps(last.budget_left))));
  }
  // Every version's evaluations composed for the most-charged enrolled device (the cap
  // drift.device_budget): a new version, or the same model registered again, adds to it.
  const dev = d.devices;
  if (dev) {
    facts.push(el("span", { id: "drift-device-budget", "data-epsilon": fmtEps(dev.epsilon_spent_max) },
      "per device, all versions: spent ", el("b", {}, fmtEps(dev.epsilon_spent_max)),
      ` of ${fmtEps(dev.budget)} (${dev.evaluations_max} evaluations), left `,
      el("b", {}, fmtEps(dev.budget_left))));
  }
  return facts;
}

function driftOutcome(h) {
  if (h.error) return el("span", { class: "error" }, h.error);
  if (h.retrain_run) return `below the threshold: retraining run ${h.retrain_run}${h.retrain_status ? ` (${h.retrain_status})` : ""}`;
  if (h.retrain_skipped) return `below the threshold: ${h.retrain_skipped}`;
  if (h.retrain_error) return el("span", { class: "error" }, `below the threshold; retraining not submitted: ${h.retrain_error}`);
  return "at or above the threshold";
}

function renderDrift(d) {
  const section = document.getElementById("drift");
  section.hidden = !(d && d.enabled);
  if (section.hidden) return;
  const p = d.pending;
  document.getElementById("drift-facts").replaceChildren(
    el("span", {}, "model ", el("b", {}, d.model)),
    el("span", {}, "threshold ", el("b", {}, Number(d.threshold).toFixed(3))),
    el("span", {}, "every ", el("b", {}, `${d.interval_s} s`)),
    el("span", {}, "last evaluation ", el("b", {}, fmtTime(d.last_evaluation_at))),
    el("span", {}, "in flight ", el("b", {}, p ? `${p.kind} of ${p.version}: run ${p.run_id}` : "none")),
    ...driftBudgetFacts(d),
    ...(d.refused ? [el("span", { class: "error", id: "drift-refused" }, d.refused)] : []),
  );
  const body = document.querySelector("#drift-history tbody");
  body.replaceChildren();
  const history = (d.history || []).slice(-10).reverse();
  if (!history.length) body.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no evaluation yet")));
  for (const h of history) {
    body.append(el(
      "tr",
      { class: h.below_threshold ? "below" : "", "data-drift": h.run_id },
      el("td", {}, fmtTime(h.at)),
      el("td", { class: "mono" }, h.version),
      el("td", { class: "num" }, h.accuracy != null ? `${Number(h.accuracy).toFixed(4)}${h.dp ? " (noised)" : ""}` : "—"),
      el("td", {}, driftPrivacy(h)),
      el("td", { class: "mono" }, h.run_id),
      el("td", {}, driftOutcome(h)),
    ));
  }
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
    const badge = runBadge(r);
    const pct = r.rounds ? Math.round((100 * r.rounds_completed) / r.rounds) : 0;
    // Under the page's CSP (style-src 'self') an inline style attribute is ignored;
    // a width set through the CSSOM is not.
    const fill = el("div", { "data-pct": String(pct) });
    fill.style.width = `${pct}%`;
    const bar = el("div", { class: "progress" }, fill);
    const tr = el(
      "tr",
      { class: r.id === state.selected ? "selected" : "", "data-run": r.id },
      el("td", { class: "mono" }, r.id),
      el("td", {}, r.name || "—"),
      el("td", {}, el("span", { class: `status ${badge.cls}` }, badge.text)),
      el("td", {}, bar, ` ${r.rounds_completed}/${r.rounds}`),
      el("td", {}, r.model || "—"),
      el("td", {}, `${r.per_round ?? "?"} of ${r.num_clients ?? "?"}`),
      el("td", {}, fmtTime(r.created_at)),
    );
    tr.addEventListener("click", () => {
      state.selected = r.id;
      history.replaceState(null, "", RUN_PATH + encodeURIComponent(r.id));
      refresh();
    });
    body.append(tr);
  }
}

async function renderDetail(runs) {
  const run = runs.find((r) => r.id === state.selected);
  if (!run) return;
  document.getElementById("run-title").textContent = run.id;
  const st = document.getElementById("run-status");
  const rounds = await runRounds(run);
  const badge = runBadge({ ...run, rounds_applied: run.rounds_applied ?? rounds.filter(roundApplied).length });
  st.textContent = badge.text; st.className = `status ${badge.cls}`;
  let privacy = null;
  try { privacy = await getJSON(`/runs/${encodeURIComponent(run.id)}/privacy`); } catch (e) { privacy = null; }
  const last = rounds[rounds.length - 1] || {};
  // Under DP the public rounds hold no drop counts: say "—", not a reassuring 0.
  const dropped = rounds.some((r) => r.dropped != null) ? String(rounds.reduce((n, r) => n + (r.dropped || 0), 0)) : "—";
  const asyncView = asyncFacts(rounds);
  const xLabel = asyncView ? "model version" : "round";
  // DP from the run's config (public), before any release; then from what was released.
  const dpOn = (run.dp && run.dp !== "none") || (privacy && privacy.epsilon != null)
    || rounds.some((r) => r.epsilon != null);
  const aborted = run.rounds_aborted ?? rounds.filter((r) => r.status === "aborted").length;
  const links = el("span", { class: "links" }, el("a", { href: RUN_PATH + encodeURIComponent(run.id) }, "link to this run"));
  if (dpOn) {
    links.append(" · ", el("a", { href: `/runs/${encodeURIComponent(run.id)}/privacy?format=html`, "data-link": "privacy-report" }, "privacy report"));
  }
  const facts = document.getElementById("facts");
  facts.replaceChildren(
    links,
    el("span", {}, "rounds ", el("b", {}, `${run.rounds_completed}/${run.rounds}`)),
    el("span", {}, "applied ", el("b", {}, String(rounds.filter(roundApplied).length))),
    el("span", aborted > 0 ? { class: "warn", "data-fact": "aborted" } : { "data-fact": "aborted" }, "aborted ", el("b", {}, String(aborted))),
    el("span", {}, "test accuracy ", el("b", {}, last.test_accuracy != null ? last.test_accuracy.toFixed(4) : "—")),
    el("span", {}, "dropouts ", el("b", {}, dropped)),
    el("span", {}, "attempts ", el("b", {}, String((run.attempts || []).length))),
    el("span", {}, "traffic ", el("b", {}, `${((run.bytes_sent + run.bytes_received) / 1e6).toFixed(2)} MB`)),
    ...(asyncView || []),
    ...(run.error ? [el("span", { class: "error" }, run.error)] : []),
    ...(diverged(run) ? [el("span", { class: "error", "data-fact": "diverged" }, `${run.model_version || "model"}: ${run.model_version_warning}`)] : []),
  );
  // DP: a privacy report or epsilon per round; or rounds that carry no drop count at all.
  const dp = dpOn || (rounds.length > 0 && !rounds.some((r) => r.dropped != null));
  renderDrops(run, rounds, dp);
  drawChart(document.getElementById("chart-accuracy"), [
    { name: "central", color: COLORS.blue, points: seq(rounds, "test_accuracy") },
    { name: "federated", color: COLORS.violet, points: seq(rounds, "federated_accuracy") },
  ], { yMin: 0, yMax: 1, xLabel });
  drawChart(document.getElementById("chart-loss"), [
    { name: "train", color: COLORS.amber, points: seq(rounds, "train_loss") },
    { name: "test", color: COLORS.blue, points: seq(rounds, "test_loss") },
  ], { xLabel });
  drawChart(document.getElementById("chart-clients"), [
    { name: "connected", color: COLORS.grey, points: seq(rounds, "clients_connected") },
    { name: "dropped", color: COLORS.red, points: seq(rounds, "dropped"), kind: "bar" },
    { name: "aggregated", color: COLORS.green, points: seq(rounds, "cohort_aggregated") },
    ...(asyncView ? [{ name: "in flight", color: COLORS.violet, points: seq(rounds, "in_flight") }] : []),
  ], { yMin: 0, integer: true, xLabel });
  const eps = seq(rounds, "epsilon");
  const budget = privacy && (privacy.budget_epsilon ?? privacy.budget);
  if (!eps.length && privacy && Number.isFinite(privacy.epsilon)) eps.push([run.rounds_completed, privacy.epsilon]);
  const privSeries = [{ name: "epsilon", color: COLORS.violet, points: eps }];
  if (Number.isFinite(budget)) privSeries.push({ name: "budget", color: COLORS.red, points: [[0, budget]], kind: "hline" });
  const noRelease = dpOn
    ? `DP is on (${run.dp || "on"}): no release yet; epsilon appears after the first round`
    : "no privacy report: DP is off for this run";
  drawChart(document.getElementById("chart-privacy"), privSeries, { yMin: 0, empty: noRelease });
  document.getElementById("chart-privacy").dataset.empty = eps.length ? "" : noRelease;
}

async function refresh() {
  try {
    const [cluster, runs] = await Promise.all([getJSON("/cluster"), getJSON("/runs")]);
    renderCluster(cluster);
    renderRuns(runs);
    await renderDetail(runs);
    let drift = null;
    try { drift = await getJSON("/drift"); } catch (e) { drift = null; }  // an older coordinator
    renderDrift(drift);
    document.body.dataset.loaded = "1";
  } catch (e) {
    document.body.dataset.error = String(e);
  }
}

refresh();
setInterval(refresh, 3000);
