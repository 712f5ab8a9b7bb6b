// Lightning dashboard: a small dependency-free front end over the read-only JSON API (app.py).
// Every value from the store is inserted with textContent (never innerHTML): prompts and responses
// are arbitrary text.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token");
const STATUSES = ["succeeded", "failed", "timed_out", "cancelled", "running", "queued", "requeued"];
let info = null;
let timer = null;
const listState = { status: [], mode: "", reward_min: "", reward_max: "", model_version: "", role: "", q: "", offset: 0, limit: 50 };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

async function api(path) {
  const headers = TOKEN ? { Authorization: "Bearer " + TOKEN } : {};
  const res = await fetch(path, { headers });
  const body = await res.json().catch(() => ({ detail: res.statusText }));
  if (!res.ok) throw new Error(body.detail ? (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)) : res.statusText);
  return body;
}

const num = (x, d = 3) => (x === null || x === undefined ? "—" : Number(x).toFixed(d));
const when = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "—");
const statusBadge = (s) => el("span", { class: "badge s-" + s }, s);
const main = () => document.getElementById("main");

function showError(err) {
  main().replaceChildren(el("div", { class: "error", "data-testid": "error" }, String(err.message || err)));
}

function setTimer(fn) {
  if (timer) clearInterval(timer);
  timer = fn ? setInterval(fn, ((info && info.poll_s) || 2) * 1000) : null;
}

async function loadInfo() {
  info = await api("/api/info");
  document.getElementById("store").textContent = "store: " + info.store + (info.run_dir ? " · run: " + info.run_dir : "");
  const p = info.span_progress;
  document.getElementById("progress").textContent = !info.history_complete
    ? `reading older rollouts: ${p.known} so far`
    : p.indexed < p.known ? `spans read for ${p.indexed} of ${p.known} rollouts` : "";
}

// ---------------------------------------------------------------------------------------------
// Rollouts list
// ---------------------------------------------------------------------------------------------
function query() {
  const p = new URLSearchParams();
  for (const s of listState.status) p.append("status", s);
  for (const k of ["mode", "reward_min", "reward_max", "model_version", "role", "q"]) if (listState[k] !== "") p.set(k, listState[k]);
  p.set("limit", listState.limit);
  p.set("offset", listState.offset);
  return p.toString();
}

function filterForm() {
  const input = (name, label, type = "text", size = 8) =>
    el("label", {}, label, el("input", { name, type, size, value: listState[name], step: type === "number" ? "any" : null, "data-testid": "filter-" + name }));
  const form = el(
    "form",
    { class: "filters", "data-testid": "filters", onsubmit: (e) => { e.preventDefault(); readForm(form); listState.offset = 0; renderList(); } },
    el("fieldset", {}, el("legend", {}, "status"), STATUSES.map((s) =>
      el("label", { class: "chk" }, el("input", { type: "checkbox", name: "status", value: s, checked: listState.status.includes(s) }), s))),
    el("label", {}, "mode", el("select", { name: "mode", "data-testid": "filter-mode" },
      ["", "train", "val", "test"].map((m) => el("option", { value: m, selected: listState.mode === m }, m || "any")))),
    input("reward_min", "reward ≥", "number", 5),
    input("reward_max", "reward ≤", "number", 5),
    input("model_version", "model version", "number", 4),
    input("role", "role", "text", 8),
    input("q", "search", "search", 16),
    el("button", { type: "submit", "data-testid": "apply" }, "Apply"),
    el("button", { type: "button", onclick: () => { Object.assign(listState, { status: [], mode: "", reward_min: "", reward_max: "", model_version: "", role: "", q: "", offset: 0 }); renderList(); } }, "Clear"),
  );
  return form;
}

function readForm(form) {
  const data = new FormData(form);
  listState.status = data.getAll("status");
  for (const k of ["mode", "reward_min", "reward_max", "model_version", "role", "q"]) listState[k] = (data.get(k) || "").trim();
}

function rolloutsTable(page) {
  const head = el("tr", {}, ["rollout", "status", "mode", "reward", "calls", "tool calls", "roles", "model v", "group", "ended"].map((h) => el("th", {}, h)));
  const rows = page.rows.map((r) =>
    el("tr", { class: "clickable", "data-testid": "rollout-row", "data-id": r.id, onclick: () => { location.hash = "#/rollout/" + encodeURIComponent(r.id); } },
      el("td", {}, el("a", { href: "#/rollout/" + encodeURIComponent(r.id) }, r.id)),
      el("td", {}, statusBadge(r.status)),
      el("td", {}, r.mode),
      el("td", { class: "num", "data-testid": "row-reward" }, num(r.reward)),
      el("td", { class: "num" }, r.n_calls ?? "…"),
      el("td", { class: "num" }, r.n_tool_calls ?? "…"),
      el("td", {}, r.roles ? (r.roles.join(", ") || "—") : "…"),
      el("td", {}, r.model_versions ? (r.model_versions.join(", ") || "—") : "…"),
      el("td", { class: "muted" }, r.group_id || "—"),
      el("td", { class: "muted" }, when(r.ended_at)),
    ));
  return el("table", { class: "grid", "data-testid": "rollouts" }, el("thead", {}, head), el("tbody", {}, rows));
}

async function renderList() {
  setTimer(null);
  const box = el("div", { class: "list" });
  main().replaceChildren(el("h1", {}, "Rollouts"), filterForm(), box);
  const draw = async () => {
    const page = await api("/api/rollouts?" + query());
    const first = page.total ? page.offset + 1 : 0;
    const last = page.offset + page.rows.length;
    const pager = el("div", { class: "pager" },
      el("button", { disabled: page.offset === 0, "data-testid": "prev", onclick: () => { listState.offset = Math.max(0, listState.offset - listState.limit); draw().catch(showError); } }, "← newer"),
      el("span", { "data-testid": "page-info" }, `${first}–${last} of ${page.total} matching`),
      el("button", { disabled: last >= page.total, "data-testid": "next", onclick: () => { listState.offset += listState.limit; draw().catch(showError); } }, "older →"),
      el("span", { class: "muted" }, ` page served in ${page.took_ms.toFixed(1)} ms`),
      page.history_complete ? null : el("span", { class: "muted", "data-testid": "history-loading" }, " · older rollouts are still being read: totals grow until done"),
      page.span_progress.indexed < page.span_progress.known
        ? el("span", { class: "muted" }, ` · role / model-version / response-text filters see the ${page.span_progress.indexed} of ${page.span_progress.known} rollouts whose spans are read so far`)
        : null,
    );
    box.replaceChildren(pager, page.rows.length ? rolloutsTable(page) : el("p", { class: "muted", "data-testid": "empty" }, "No rollout matches."));
  };
  await draw();
  setTimer(() => { loadInfo().catch(() => {}); draw().catch(showError); });
}

// ---------------------------------------------------------------------------------------------
// One rollout
// ---------------------------------------------------------------------------------------------
function kv(pairs) {
  return el("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function timeline(spans) {
  const end = Math.max(1, ...spans.map((s) => s.start_ms + s.duration_ms));
  const rows = spans.map((s) => {
    const left = (100 * s.start_ms) / end;
    const width = Math.max(0.4, (100 * s.duration_ms) / end);
    return el("div", { class: "tl-row", "data-testid": "span", "data-name": s.name, title: JSON.stringify(s.attributes, null, 1) },
      el("div", { class: "tl-name", style: `padding-left:${s.depth * 14}px` }, s.name, s.role ? el("span", { class: "role" }, s.role) : null,
        s.status === "error" ? el("span", { class: "badge s-failed" }, "error") : null),
      el("div", { class: "tl-track" }, el("div", { class: "tl-bar n-" + s.name.replace(/[^a-z]/gi, "-"), style: `left:${left}%;width:${width}%` })),
      el("div", { class: "tl-time muted" }, `+${s.start_ms.toFixed(0)} ms · ${s.duration_ms.toFixed(0)} ms`));
  });
  return el("div", { class: "timeline", "data-testid": "timeline" }, rows);
}

function callCard(c, i) {
  return el("div", { class: "card call", "data-testid": "call" },
    el("div", { class: "card-head" }, el("b", {}, `call ${i}`), c.role ? el("span", { class: "role" }, c.role) : el("span", { class: "muted" }, "no role"),
      el("span", { class: "muted" }, ` model v${c.model_version ?? "?"}${c.adapter ? ` · adapter ${c.adapter} v${c.adapter_version ?? "?"}` : ""} · prompt ${c.prompt_tokens ?? "?"} tok · response ${c.response_tokens ?? "?"} tok · `),
      c.exact_tokens ? el("span", { class: "ok" }, "exact tokens") : el("span", { class: "warn" }, "inexact tokens (from text)"),
      c.finish_reasons.length ? el("span", { class: "muted" }, " · finish " + c.finish_reasons.join(",")) : null),
    el("details", {}, el("summary", {}, `prompt (${c.prompt.length} messages)`),
      c.prompt.map((m) => el("div", { class: "msg" }, el("span", { class: "msg-role" }, m.role), el("pre", {}, m.content)))),
    el("div", { class: "msg" }, el("span", { class: "msg-role" }, "response"), el("pre", { "data-testid": "response" }, c.response_text || "(empty)")),
    c.tool_calls.length ? el("div", { class: "tools" }, c.tool_calls.map((t) => el("div", { class: "toolcall" }, `→ ${t.name}(${typeof t.arguments === "string" ? t.arguments : JSON.stringify(t.arguments)})`, el("span", { class: "muted" }, ` id ${t.id}`)))) : null,
    c.tool_call_parse_error ? el("div", { class: "warn" }, "tool call could not be parsed: " + c.tool_call_parse_error) : null,
  );
}

function transitionCard(t) {
  if (!t) return el("div", { class: "card transition muted" }, "no transition");
  return el("div", { class: "card transition " + (t.trainable ? "trainable" : "frozen"), "data-testid": t.trainable ? "transition" : "frozen-call", "data-span": t.span_id },
    el("div", { class: "card-head" }, el("b", {}, t.trainable ? `transition ${t.step_index}` : "not trained"),
      t.trainable ? el("span", { class: "ok" }, " trainable") : el("span", { class: "muted" }, " role frozen: dropped by the adapter")),
    kv([
      ["role", t.role || "—"],
      ["AIR reward", el("span", { "data-testid": "air" }, num(t.air_reward))],
      ["return", el("span", { "data-testid": "return" }, num(t.return))],
      ["advantage", el("span", { "data-testid": "advantage", class: t.advantage > 0 ? "pos" : t.advantage < 0 ? "neg" : "" }, num(t.advantage))],
      ["in update", t.in_update ? "yes" : "no"],
      ["tokens", `${t.prompt_tokens} prompt / ${t.response_tokens} response` + (t.truncated ? " · truncated" : "")],
    ]));
}

function attemptSection(view, credit, isLast) {
  const a = view.attempt;
  const byspan = Object.fromEntries((isLast ? credit.rows : []).map((r) => [r.span_id, r]));
  const pairs = view.calls.map((c, i) => el("div", { class: "pair" }, callCard(c, i), isLast ? transitionCard(byspan[c.span_id]) : el("div", { class: "card muted" }, "earlier attempt: not used for training")));
  return el("section", { class: "attempt", "data-testid": "attempt" },
    el("h2", {}, `Attempt ${a.number} `, statusBadge(a.status), el("span", { class: "muted" }, ` worker ${a.worker_id} · ${a.id}`)),
    a.error ? el("div", { class: "error" }, a.error) : null,
    el("h3", {}, "Spans"), view.spans.length ? timeline(view.spans) : el("p", { class: "muted" }, "no spans"),
    el("h3", {}, isLast ? "Model calls and the transitions built from them" : "Model calls"),
    pairs.length ? el("div", { class: "pairs" }, pairs) : el("p", { class: "muted" }, "no model calls"),
    view.tools.length ? [el("h3", {}, "Tools"), el("table", { class: "grid" }, el("tr", {}, ["tool", "call id", "role", "status", "error"].map((h) => el("th", {}, h))),
      view.tools.map((t) => el("tr", { "data-testid": "tool" }, el("td", {}, t.tool || "?"), el("td", {}, t.tool_call_id || "—"), el("td", {}, t.role || "—"), el("td", {}, statusBadge(t.status === "error" ? "failed" : "succeeded")), el("td", {}, t.error || ""))))] : null,
    view.signals.length ? [el("h3", {}, "Signals (AIR inputs)"), el("table", { class: "grid" }, el("tr", {}, ["signal", "value", "tool call id", "role", "at"].map((h) => el("th", {}, h))),
      view.signals.map((s) => el("tr", { "data-testid": "signal" }, el("td", {}, s.name), el("td", { class: "num" }, num(s.value)), el("td", {}, s.tool_call_id || "—"), el("td", {}, s.role || "—"), el("td", { class: "muted" }, `+${s.start_ms.toFixed(0)} ms`))))] : null,
    view.rewards.length ? [el("h3", {}, "Emitted rewards"), el("ul", {}, view.rewards.map((r) => el("li", {}, `${num(r.value)} at +${r.start_ms.toFixed(0)} ms`)))] : null,
  );
}

function creditSummary(credit) {
  const s = credit.settings;
  const air = Object.keys(s.air).length ? Object.entries(s.air).map(([k, v]) => `${k}: ${v}`).join(", ") : "none";
  const group = credit.group;
  return el("div", { class: "card credit", "data-testid": "credit" },
    el("div", {}, el("b", {}, "Credit: "), `${s.credit}${s.credit === "discounted" ? ` (γ=${s.gamma})` : ""} · ${s.estimator} · AIR ${air}`,
      el("span", { class: "muted" }, ` · settings from ${s.source}`)),
    s.unreadable_air.length ? el("div", { class: "warn" }, `AIR entries given as functions cannot be replayed: ${s.unreadable_air.join(", ")}`) : null,
    credit.note ? el("div", { class: "warn", "data-testid": "credit-note" }, credit.note) : null,
    group ? el("div", {}, `group ${group.id}: rewards `, group.rollouts.map((g, i) => el("span", { class: "grp" }, (i ? ", " : "") + num(g.reward, 2))),
      ` → this rollout's advantage `, el("b", { "data-testid": "rollout-advantage" }, num(group.rollout_advantage))) : null,
    credit.unattached_signals && credit.unattached_signals.length ? el("div", { class: "warn" }, `signals attached to no call: ${credit.unattached_signals.map((x) => x.name).join(", ")}`) : null,
  );
}

async function renderRollout(id) {
  setTimer(null);
  main().replaceChildren(el("p", { class: "muted" }, "loading…"));
  const d = await api("/api/rollouts/" + encodeURIComponent(id));
  const r = d.rollout;
  const attempts = d.attempts.map((v, i) => attemptSection(v, d.credit, i === d.attempts.length - 1));
  main().replaceChildren(
    el("p", {}, el("a", { href: "#/" }, "← rollouts")),
    el("h1", { "data-testid": "rollout-title" }, r.id, " ", statusBadge(r.status)),
    kv([
      ["final reward", el("b", { "data-testid": "final-reward" }, num(d.reward))],
      ["mode", r.mode],
      ["task", `${r.task.id || "—"}`],
      ["group", r.group_id || "—"],
      ["resources version", r.resources_version ?? "—"],
      ["attempts", String(r.attempt_count)],
      ["created / ended", `${when(r.created_at)} / ${when(r.ended_at)}`],
      ["error", r.error || "—"],
    ]),
    el("details", { open: true }, el("summary", {}, "task input"), el("pre", {}, JSON.stringify(r.task.input, null, 2))),
    creditSummary(d.credit),
    ...(attempts.length ? attempts : [el("p", { class: "muted" }, "No attempt yet (queued).")]),
  );
  if (!["succeeded", "failed", "timed_out", "cancelled"].includes(r.status)) setTimer(() => renderRollout(id).catch(showError));
}

// ---------------------------------------------------------------------------------------------
// Training curves
// ---------------------------------------------------------------------------------------------
function chart(series) {
  const W = 420, H = 180, P = 52;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": series.title });
  const pts = series.points;
  if (!pts.length) {
    const t = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "muted" });
    t.textContent = "no data yet";
    svg.appendChild(t);
    return svg;
  }
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => P + ((x - x0) / (x1 - x0)) * (W - P - 10);
  const sy = (y) => H - 22 - ((y - y0) / (y1 - y0)) * (H - 34);
  svg.appendChild(svgEl("line", { x1: P, y1: H - 22, x2: W - 10, y2: H - 22, class: "axis" }));
  svg.appendChild(svgEl("line", { x1: P, y1: 12, x2: P, y2: H - 22, class: "axis" }));
  for (const [v, y] of [[y1, sy(y1)], [y0, sy(y0)]]) {
    const t = svgEl("text", { x: P - 4, y: y + 4, "text-anchor": "end", class: "tick" });
    t.textContent = Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? Number(v).toExponential(2) : Number(v).toPrecision(3);
    svg.appendChild(t);
  }
  for (const [v, x, anchor] of [[x0, sx(x0), "start"], [x1, sx(x1), "end"]]) {
    const t = svgEl("text", { x, y: H - 6, "text-anchor": anchor, class: "tick" });
    t.textContent = "step " + v;
    svg.appendChild(t);
  }
  svg.appendChild(svgEl("polyline", { points: pts.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "), class: "line" }));
  if (pts.length <= 40) for (const p of pts) svg.appendChild(svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, class: "dot" }));
  return svg;
}

async function renderCurves() {
  setTimer(null);
  const draw = async () => {
    const c = await api("/api/curves");
    const body = c.run_dir === null
      ? el("p", { class: "muted", "data-testid": "no-run" }, "No run folder: start the dashboard on a SQLite store inside a run folder, or pass --run DIR.")
      : el("div", { class: "charts" }, c.series.map((s) => el("figure", { class: "card", "data-testid": "chart", "data-key": s.key }, el("figcaption", {}, s.title, el("span", { class: "muted" }, ` (${s.points.length} points)`)), chart(s))));
    main().replaceChildren(el("h1", {}, "Training curves"), el("p", { class: "muted" }, `${c.rows} rows of ${c.run_dir || "—"}/metrics.jsonl · refreshed every ${(info && info.poll_s) || 2} s while training runs`), body);
  };
  await draw();
  setTimer(() => draw().catch(showError));
}

// ---------------------------------------------------------------------------------------------
async function route() {
  const hash = location.hash || "#/";
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", hash === "#/curves" ? a.dataset.nav === "curves" : hash === "#/" && a.dataset.nav === "rollouts");
  try {
    if (!info) await loadInfo();
    if (hash.startsWith("#/rollout/")) await renderRollout(decodeURIComponent(hash.slice("#/rollout/".length)));
    else if (hash === "#/curves") await renderCurves();
    else await renderList();
  } catch (err) {
    setTimer(null);
    showError(err);
  }
}

window.addEventListener("hashchange", route);
route();
