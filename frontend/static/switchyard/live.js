// Cluster live view: HTTP snapshot first, then websocket messages (snapshot | event | config |
// decisions).
// Reconnects with exponential backoff and shows "stale" while disconnected. Needs uPlot
// (loaded as a classic script before this module) and nothing else.

const MAX_POINTS = 1200; // 5 minutes at 4 Hz
const STALE_AFTER_S = 3; // connected but no snapshot for this long → "no data"
const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 10000];
const LATENCY_SAMPLES = 5000;
const MAX_DECISIONS = 40; // rows of the decision table
const TOP_CANDIDATES = 4; // candidates shown per decision (plus the chosen one)

const cfg = JSON.parse(document.getElementById("live-config").textContent);
const $ = (selector) => document.querySelector(selector);

const state = {
  snapshot: null,
  sortKey: "name",
  sortDir: 1,
  annotations: [],
  confirmed: new Map(), // prefix_class → hotspot payload, from events and snapshots
  lastSnapshotAt: 0,
  socket: null,
  attempts: 0,
  decisions: [], // sampled routing decisions, newest first (at most MAX_DECISIONS)
};

// Exposed for tests and the latency benchmark: receive-time minus router timestamp.
window.switchyardLive = { latencies: [], deliveries: [], messages: 0, state };

// ---------------------------------------------------------------- formatting
const fmt = {
  ms: (s) => (s == null ? "–" : s >= 10 ? `${s.toFixed(1)} s` : s * 1000 >= 100 ? `${(s * 1000).toFixed(0)} ms` : `${(s * 1000).toFixed(1)} ms`),
  pct: (r) => (r == null ? "–" : `${(r * 100).toFixed(1)}%`),
  num: (v) => (v == null ? "–" : v.toLocaleString(undefined, { maximumFractionDigits: 1 })),
  num2: (v) => (v == null ? "–" : v.toFixed(2)),
  int: (v) => (v == null ? "–" : Math.round(v).toLocaleString()),
  bytes: (v) => {
    if (v == null) return "–";
    const units = ["B", "KB", "MB", "GB", "TB", "PB"];
    let k = 0;
    while (v >= 1000 && k < units.length - 1) { v /= 1000; k += 1; }
    return `${v.toFixed(k ? 1 : 0)} ${units[k]}`;
  },
};
const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumSignificantDigits: 3 });
fmt.score = (v) => (v == null ? "filtered" : compact.format(v));
const esc = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const clock = (ts) => new Date(ts * 1000).toLocaleTimeString();

// ---------------------------------------------------------------- connection state
function setConn(kind, text) {
  const el = $("#conn");
  el.className = `conn ${kind}`;
  el.dataset.state = kind;
  el.textContent = text;
  document.body.classList.toggle("is-stale", kind === "stale");
}

function tickAge() {
  const snap = state.snapshot;
  if (cfg.history || !snap) return;
  const age = snap.ts ? Date.now() / 1000 - snap.ts : null;
  $("#age").textContent = age == null ? "no router is reporting" : `data ${age.toFixed(1)} s old`;
  const open = state.socket && state.socket.readyState === WebSocket.OPEN;
  if (open && Date.now() / 1000 - state.lastSnapshotAt > STALE_AFTER_S) setConn("stale", "stale: no data");
  else if (open) setConn("live", "live");
}

// ---------------------------------------------------------------- header and routers
function renderMetrics(window_) {
  for (const el of document.querySelectorAll("[data-metric]")) {
    el.textContent = fmt[el.dataset.format](window_?.[el.dataset.metric]);
  }
}

// Global KV tier: shown only when some engine of the cluster reports one (snapshot.tier).
function renderTier(tier) {
  for (const el of document.querySelectorAll("[data-tier]")) el.classList.toggle("hidden", !tier);
  for (const el of document.querySelectorAll("[data-tier-metric]")) {
    el.textContent = fmt[el.dataset.format](tier?.[el.dataset.tierMetric]);
  }
}

// Disaggregation: the pools and the decider, shown only for a disaggregated cluster
// (snapshot.disaggregation is null otherwise).
const disaggShown = () => Boolean(state.snapshot?.disaggregation);

function poolRow(name, p) {
  const reads = name === "decode";
  const cell = (field, text) => `<td class="num" data-field="${field}">${text}</td>`;
  return `<tr data-pool="${name}"><td>${name}</td>
    ${cell("instances", `${fmt.int(p.up)} / ${fmt.int(p.instances)}`)}
    ${cell("pending_prefill_tokens", fmt.int(p.pending_prefill_tokens))}${cell("hit_ratio", fmt.pct(p.hit_ratio))}
    ${cell("batch_size", fmt.int(p.batch_size))}${cell("kv_usage", fmt.pct(p.kv_usage))}
    ${cell("kv_transfers_in_flight", reads ? fmt.int(p.kv_transfers_in_flight) : "")}
    ${cell("kv_bytes_per_s", reads ? fmt.bytes(p.kv_bytes_per_s) + (p.kv_bytes_per_s == null ? "" : "/s") : "")}
    ${cell("kv_failed_transfers", reads ? fmt.int(p.kv_failed_transfers) : "")}</tr>`;
}

function renderDisaggregation(disagg) {
  for (const el of document.querySelectorAll("[data-disagg]")) el.classList.toggle("hidden", !disagg);
  $("#disagg-live").classList.toggle("hidden", !disagg);
  if (!disagg) return;
  for (const el of document.querySelectorAll("[data-disagg-metric]")) {
    el.textContent = fmt[el.dataset.format](disagg[el.dataset.disaggMetric]);
  }
  $("#pool-live tbody").innerHTML = ["prefill", "decode"].map((name) => poolRow(name, disagg.pools[name])).join("");
}

function renderRouters(routers) {
  $("#routers").innerHTML = routers.length
    ? routers.map((r) => `<span class="badge" data-router="${esc(r.router)}">${esc(r.router)} · ${esc(r.policy)} · v${esc(r.config_version ?? "?")}</span>`).join(" ")
    : '<span class="badge bad">no router reporting</span>';
}

// ---------------------------------------------------------------- instances
const HEALTH_RANK = { healthy: 0, draining: 1, down: 2 };

function sortedInstances(instances) {
  const key = state.sortKey;
  const value = (i) => (key === "health" ? HEALTH_RANK[i.health] : i[key] ?? -Infinity);
  return [...instances].sort((a, b) => {
    const [x, y] = [value(a), value(b)];
    return (x < y ? -1 : x > y ? 1 : a.name.localeCompare(b.name)) * state.sortDir;
  });
}

const tierShown = () => Boolean(state.snapshot?.tier);

function renderInstances(instances) {
  $("#instances tbody").innerHTML = sortedInstances(instances).map((i) => `
    <tr data-instance="${esc(i.name)}" class="${i.hotspot ? "hot" : ""} ${esc(i.health)}">
      <td>${esc(i.name)}</td><td>${esc(i.arm ?? "")}</td>
      <td><span class="badge ${i.health === "healthy" ? "ok" : i.health === "down" ? "bad" : "warn"}">${esc(i.health)}</span></td>
      <td class="num" data-field="pending_prefill_tokens">${fmt.int(i.pending_prefill_tokens)}</td>
      <td class="num" data-field="pending_prefill_tokens_max">${fmt.int(i.pending_prefill_tokens_max)}</td>
      <td class="num" data-field="batch_size">${fmt.int(i.batch_size)}</td>
      <td class="num" data-field="batch_size_max">${fmt.int(i.batch_size_max)}</td>
      <td class="num" data-field="in_flight">${fmt.int(i.in_flight)}</td>
      <td class="num">${fmt.pct(i.kv_usage)}</td><td class="num">${fmt.pct(i.hit_ratio)}${i.silent_fallback ? ' <span class="badge warn" data-field="silent_fallback" title="the routers predict prefix hits here that the engine does not confirm">unconfirmed</span>' : ""}</td>
      <td class="num" data-field="preemptions">${fmt.int(i.preemptions)}</td>
      <td class="num${tierShown() ? "" : " hidden"}" data-tier data-field="tier_hit_tokens">${fmt.int(i.tier_hit_tokens)}</td>
      <td class="num${tierShown() ? "" : " hidden"}" data-tier data-field="tier_bytes_read">${fmt.bytes(i.tier_bytes_read)}</td>
      <td class="${disaggShown() ? "" : "hidden"}" data-disagg data-field="role">${esc(i.role ?? "")}</td>
      <td class="num${disaggShown() ? "" : " hidden"}" data-disagg data-field="kv_transfers_in_flight">${fmt.int(i.kv_transfers_in_flight)}</td>
      <td class="num${disaggShown() ? "" : " hidden"}" data-disagg data-field="kv_bytes_per_s">${fmt.bytes(i.kv_bytes_per_s)}</td>
      <td class="num${disaggShown() ? "" : " hidden"}" data-disagg data-field="kv_failed_transfers">${fmt.int(i.kv_failed_transfers)}</td>
      <td class="num" data-field="grey_excess">${fmt.num2(i.grey_excess)}${greyBadge(i.grey_level)}</td>
      <td>${i.hotspot ? '<span class="badge bad" data-testid="hotspot-badge">hotspot</span>' : ""}</td>
    </tr>`).join("");
  renderHeat(instances);
  renderFallback(instances);
}

// The silent-fallback alarm (router_worker/hit_audit.py): routers predict prefix hits that
// the engines' own prefix-cache counters do not confirm.
function renderFallback(instances) {
  const names = instances.filter((i) => i.silent_fallback).map((i) => i.name);
  const banner = $("#fallback-banner");
  banner.classList.toggle("hidden", names.length === 0);
  banner.innerHTML = names.length ? `<div><strong>Prefix hits not confirmed</strong> on
    ${esc(names.join(", "))}: the routers predict cache hits that these engines' prefix-cache
    counters do not show. The routers' tokenizer or chat template (router.tokenizer_path,
    router.chat_template) likely differs from the engines': KV-aware routing is falling back
    to load balancing.</div>` : "";
}

// ---------------------------------------------------------------- tenants (flow control)
function renderTenants(tenants) {
  const rows = Object.entries(tenants ?? {});
  $("#tenant-lanes tbody").innerHTML = rows.length
    ? rows.map(([name, t]) => `
    <tr data-tenant="${esc(name)}">
      <td>${esc(name)}</td><td><span class="badge${t.priority === "critical" ? " ok" : t.priority === "sheddable" ? " warn" : ""}">${esc(t.priority)}</span></td>
      <td class="num" data-field="admitted">${fmt.int(t.admitted)}</td>
      <td class="num" data-field="queued">${fmt.int(t.queued)}</td>
      <td class="num" data-field="refused">${fmt.int(t.refused)}</td>
      <td class="num" data-field="shed">${fmt.int(t.shed)}</td>
      <td class="num" data-field="share">${fmt.pct(t.share)}</td>
      <td class="num" data-field="weight_share">${fmt.pct(t.weight_share)}</td>
      <td class="num" data-field="ttft_p50_s">${byClass(t, "ttft_p50_s")}</td>
      <td class="num" data-field="tpot_p50_s">${byClass(t, "tpot_p50_s")}</td>
    </tr>`).join("")
    : '<tr><td colspan="10" class="muted">No request in the last window.</td></tr>';
}

// A tenant's figure, per class when its requests came in more than one (a request may
// lower its class).
function byClass(t, field) {
  const classes = Object.entries(t.classes ?? {});
  if (classes.length <= 1) return fmt.ms(t[field]);
  return classes.map(([name, c]) =>
    `<span class="small" data-class="${esc(name)}">${esc(name)} ${fmt.ms(c[field])}</span>`).join("<br>");
}

// Grey-failure states (router_worker/routing/grey.py), by the level the snapshot carries.
const GREY_STATES = [null, ["suspect", "warn"], ["degraded", "warn"], ["drained", "bad"]];

function greyBadge(level) {
  const shown = GREY_STATES[level ?? 0];
  return shown ? ` <span class="badge ${shown[1]}" data-testid="grey-badge">${shown[0]}</span>` : "";
}

function renderHeat(instances) {
  const peak = Math.max(1, ...instances.map((i) => i.pending_prefill_tokens_max));
  $("#heat").innerHTML = instances.map((i) => {
    const level = i.pending_prefill_tokens_max / peak;
    const color = `hsl(${Math.round(120 - 120 * level)} 70% ${i.health === "down" ? 25 : 45}%)`;
    return `<div class="cell ${i.hotspot ? "hot" : ""}" style="background:${color}"
      title="${esc(i.name)}: P-token max ${fmt.int(i.pending_prefill_tokens_max)}, batch ${fmt.int(i.batch_size)}">${esc(i.name)}</div>`;
  }).join("");
}

function bindSorting() {
  for (const th of document.querySelectorAll("#instances th[data-sort]")) {
    th.addEventListener("click", () => {
      state.sortDir = state.sortKey === th.dataset.sort ? -state.sortDir : 1;
      state.sortKey = th.dataset.sort;
      for (const other of document.querySelectorAll("#instances th")) other.classList.remove("asc", "desc");
      th.classList.add(state.sortDir > 0 ? "asc" : "desc");
      if (state.snapshot) renderInstances(state.snapshot.instances);
    });
  }
}

// ---------------------------------------------------------------- charts (uPlot)
const PALETTE = ["#4e9af1", "#f1a34e", "#59c26b", "#d15ad1", "#e05a5a", "#9a9a9a"];

function annotationPlugin() {
  return {
    hooks: {
      draw: [(u) => {
        const { ctx, bbox } = u;
        ctx.save();
        ctx.setLineDash([5, 4]);
        ctx.lineWidth = 1.5 * devicePixelRatio;
        for (const a of state.annotations) {
          const x = u.valToPos(a.at, "x", true);
          if (x < bbox.left || x > bbox.left + bbox.width) continue;
          ctx.strokeStyle = a.kind === "hotspot" ? "#e05a5a" : "#c9c94e";
          ctx.beginPath();
          ctx.moveTo(x, bbox.top);
          ctx.lineTo(x, bbox.top + bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

class Chart {
  constructor(el, format, yRange) {
    this.el = el;
    this.format = format;
    this.yRange = yRange; // uPlot range function, or undefined for auto
    this.labels = [];
    this.data = [[]];
    this.plot = null;
  }

  ensure(labels) {
    if (this.plot && labels.every((l) => this.labels.includes(l))) return;
    const merged = [...this.labels, ...labels.filter((l) => !this.labels.includes(l))];
    const column = (label) => {
      const index = this.labels.indexOf(label);
      return index >= 0 ? this.data[index + 1] : this.data[0].map(() => null);
    };
    this.data = [this.data[0], ...merged.map(column)];
    this.labels = merged;
    this.plot?.destroy();
    this.plot = new uPlot({
      width: this.el.clientWidth || 480, height: 200, plugins: [annotationPlugin()],
      scales: { x: { time: true }, y: this.yRange ? { range: this.yRange } : {} },
      axes: [{ stroke: "#aaa", grid: { stroke: "#333" } }, { stroke: "#aaa", grid: { stroke: "#333" }, size: 72, values: (u, vals) => vals.map(this.format) }],
      series: [{}, ...merged.map((label, i) => ({
        label, stroke: PALETTE[Math.floor(i / 2) % PALETTE.length], width: 1.5,
        dash: label.endsWith("p99") ? [4, 3] : undefined, spanGaps: true, value: (u, v) => this.format(v),
      }))],
    }, this.data, this.el);
  }

  push(at, values) {
    const times = this.data[0];
    if (times.length && at <= times[times.length - 1]) return; // uPlot needs increasing x
    this.ensure(Object.keys(values));
    this.data[0].push(at);
    this.labels.forEach((label, i) => this.data[i + 1].push(values[label] ?? null));
    if (this.data[0].length > MAX_POINTS) for (const column of this.data) column.shift();
  }

  redraw() {
    this.plot?.setData(this.data);
  }
}

const charts = {
  ttft: new Chart($("#chart-ttft"), fmt.ms, (u, min, max) => [0, Math.max(0.001, max)]),
  tpot: new Chart($("#chart-tpot"), fmt.ms, (u, min, max) => [0, Math.max(0.001, max)]),
  cv: new Chart($("#chart-cv"), fmt.num2, (u, min, max) => [0, Math.max(0.5, max)]),
  hit: new Chart($("#chart-hit"), fmt.pct, () => [0, 1]),
};

function armStats(snapshot) {
  const arms = Object.entries(snapshot.arms ?? {});
  return arms.length ? arms : [["all", snapshot.window]];
}

function pushSeries(at, arms, cv, hit) {
  const by = (metric) => Object.fromEntries(arms.flatMap(([arm, s]) => [
    [`${arm} p50`, s[`${metric}_p50_s`]], [`${arm} p99`, s[`${metric}_p99_s`]]]));
  charts.ttft.push(at, by("ttft"));
  charts.tpot.push(at, by("tpot"));
  if (cv !== undefined) charts.cv.push(at, { "load CV": cv });
  if (hit !== undefined) charts.hit.push(at, { "hit ratio": hit });
}

function pushHistory(rows) {
  const byMinute = new Map();
  for (const row of rows) byMinute.set(row.at, [...(byMinute.get(row.at) ?? []), [row.arm, row]]);
  for (const [at, arms] of byMinute) pushSeries(at, arms);
}

// Charts take new points with every snapshot but redraw at most once a second: redrawing
// four uPlot charts per message is what costs a dashboard most CPU.
const CHART_REDRAW_MS = 1000;
let lastRedraw = 0;
let redrawTimer = null;

function redrawCharts(now = false) {
  clearTimeout(redrawTimer);
  const wait = lastRedraw + CHART_REDRAW_MS - Date.now();
  if (!now && wait > 0) {
    redrawTimer = setTimeout(() => redrawCharts(true), wait);
    return;
  }
  lastRedraw = Date.now();
  for (const chart of Object.values(charts)) chart.redraw();
}

// ---------------------------------------------------------------- events, annotations, banner
function addEvent(at, kind, text) {
  const li = document.createElement("li");
  li.className = `event ${kind}`;
  li.innerHTML = `<time>${clock(at)}</time> <span class="badge ${kind === "hotspot" ? "bad" : "canary"}">${esc(kind)}</span> ${esc(text)}`;
  $("#events").prepend(li);
  while ($("#events").children.length > 100) $("#events").lastChild.remove();
}

function annotate(at, kind, label, detail = "") {
  state.annotations.push({ at, kind, label });
  addEvent(at, kind, detail ? `${label} — ${detail}` : label);
}

function hotspotText(h) {
  const x = (v) => (typeof v === "number" ? +v.toFixed(3) : v);
  return `class ${h.prefix_class} (prefix ${String(h.prefix_hash).slice(0, 12)}): x/x̄ = ${x(h.x)}/${x(h.x_bar)}, |M|/|M̄| = ${h.m}/${h.m_bar}, window ${x(h.window)} s, instances ${(h.instances ?? []).join(", ")}`;
}

// A confirmed hotspot stays on the banner after it clears (marked as such) until the operator
// dismisses it: a burst that confirms and clears between two glances must still be seen.
function renderBanner() {
  const banner = $("#hotspot-banner");
  const entries = [...state.confirmed.values()];
  banner.classList.toggle("hidden", entries.length === 0);
  banner.classList.toggle("cleared", entries.length > 0 && entries.every((e) => e.clearedAt));
  banner.innerHTML = entries.map(({ hotspot, confirmedAt, clearedAt }) => `<div>
    <strong>Hotspot confirmed</strong> at ${clock(confirmedAt)} · ${esc(hotspotText(hotspot))} ·
    ${clearedAt ? `cleared at ${clock(clearedAt)}` : "load-only fallback for this class is on"}</div>`).join("")
    + (entries.length ? '<button class="link dismiss" data-testid="dismiss-hotspots">dismiss cleared</button>' : "");
  banner.querySelector(".dismiss")?.addEventListener("click", () => {
    for (const [key, entry] of state.confirmed) if (entry.clearedAt) state.confirmed.delete(key);
    renderBanner();
  });
}

function confirmHotspot(hotspot, at) {
  const known = state.confirmed.get(hotspot.prefix_class);
  if (known && !known.clearedAt) known.hotspot = hotspot;
  else state.confirmed.set(hotspot.prefix_class, { hotspot, confirmedAt: at, clearedAt: null });
}

function clearHotspot(prefixClass, at) {
  const known = state.confirmed.get(prefixClass);
  if (known) known.clearedAt = at;
}

// ---------------------------------------------------------------- routing decisions
const decisionKey = (d) => `${d.router}\u0000${d.request_id}`;

// Merge newly received decisions (any order) into the table: newest first, bounded.
function addDecisions(decisions) {
  const known = new Set(state.decisions.map(decisionKey));
  const fresh = (decisions ?? []).filter((d) => !known.has(decisionKey(d)));
  if (!fresh.length) return;
  state.decisions = [...fresh, ...state.decisions].sort((a, b) => b.at - a.at).slice(0, MAX_DECISIONS);
  renderDecisions();
}

function indicatorText(c) {
  if (c.cached_tokens == null) return `${c.instance}: score ${fmt.score(c.score)} (indicators not captured)`;
  return `${c.instance}: score ${fmt.score(c.score)} · cached ${fmt.int(c.cached_tokens)} tokens · pending prefill ${fmt.int(c.pending_prefill_tokens)} · batch ${fmt.int(c.batch_size)}`;
}

function candidateChip(c, chosen) {
  const indicators = c.cached_tokens == null ? ""
    : ` <small>${fmt.int(c.cached_tokens)} · ${fmt.int(c.pending_prefill_tokens)} · ${fmt.int(c.batch_size)}</small>`;
  const cls = `cand${c.instance === chosen ? " chosen" : ""}${c.score == null ? " filtered" : ""}`;
  return `<span class="${cls}" data-candidate="${esc(c.instance)}" title="${esc(indicatorText(c))}">${esc(c.instance)} <b>${esc(fmt.score(c.score))}</b>${indicators}</span>`;
}

function candidateCell(d) {
  const candidates = d.candidates ?? [];
  const shown = candidates.slice(0, TOP_CANDIDATES);
  const chosen = candidates.find((c) => c.instance === d.instance);
  if (chosen && !shown.includes(chosen)) shown.push(chosen);
  const more = Math.max(0, (d.candidates_total ?? candidates.length) - shown.length);
  return shown.map((c) => candidateChip(c, d.instance)).join("") + (more ? `<span class="muted small">+${more} more</span>` : "");
}

function reasonCell(d) {
  const details = Object.entries(d.details ?? {}).map(([k, v]) => `${k}=${v}`).join(", ");
  const retry = d.attempts > 1
    ? ` <span class="badge warn" data-testid="decision-retry" title="${esc(`failed first on ${(d.tried ?? []).join(", ")}`)}">retry ×${d.attempts - 1}</span>` : "";
  const hot = d.hot_class
    ? ` <span class="badge bad" data-testid="decision-hotspot" title="${esc((d.hotspot_transitions ?? []).join(", "))}">hotspot ${esc(d.hot_class)}</span>` : "";
  return `<span class="badge" title="${esc(details)}">${esc(d.reason)}</span>${retry}${hot}`;
}

function decisionRow(d) {
  const arm = d.canary != null ? `${esc(d.arm)} <span class="badge canary">canary ${esc(d.canary)}</span>` : esc(d.arm);
  const status = d.status != null && d.status >= 400 ? ` <span class="badge bad">${esc(d.status)}</span>` : "";
  return `<tr data-request="${esc(d.request_id)}" class="${d.priority ? "priority" : ""}">
    <td>${clock(d.at)}</td><td class="mono">${esc(d.request_id)}</td><td>${esc(d.router)}</td>
    <td>${arm} · ${esc(d.policy)}</td><td><strong>${esc(d.instance)}</strong>${status}</td>
    <td>${reasonCell(d)}</td>
    <td class="num">${fmt.int(d.cached_tokens)} / ${fmt.int(d.prompt_tokens)}</td><td class="num">${fmt.ms(d.ttft_s)}</td>
    <td class="candidates">${candidateCell(d)}</td></tr>`;
}

function renderDecisions() {
  $("#decisions tbody").innerHTML = state.decisions.length
    ? state.decisions.map(decisionRow).join("")
    : `<tr class="empty"><td colspan="9" class="muted">${cfg.history ? "decisions are only shown live" : "no decision sampled yet"}</td></tr>`;
  $("#decisions-note").textContent = state.decisions.length ? `latest ${state.decisions.length}` : "";
}

// ---------------------------------------------------------------- applying messages
function applySnapshot(snapshot) {
  state.snapshot = snapshot;
  state.lastSnapshotAt = Date.now() / 1000;
  renderMetrics(snapshot.window);
  renderRouters(snapshot.routers);
  renderTier(snapshot.tier);
  renderDisaggregation(snapshot.disaggregation);
  renderInstances(snapshot.instances);
  renderTenants(snapshot.tenants);
  for (const h of snapshot.hotspots ?? []) confirmHotspot(h, snapshot.ts);
  renderBanner();
  if (snapshot.ts) {
    pushSeries(snapshot.ts, armStats(snapshot), snapshot.window.load_cv, snapshot.window.hit_ratio);
    redrawCharts();
  }
}

function applyEvent(message) {
  const event = message.event;
  if (message.kind === "hotspot") {
    const h = event.payload;
    if (h.transition === "confirmed") confirmHotspot(h, event.at);
    if (h.transition === "cleared") clearHotspot(h.prefix_class, event.at);
    renderBanner();
    annotate(event.at, "hotspot", `hotspot ${h.transition} ${h.prefix_class}`, hotspotText(h));
    redrawCharts(true);
    return;
  } else if (message.kind === "config_applied" || message.kind === "config_rejected") {
    addEvent(event.at, "config", `${event.router}: ${message.kind.replace("_", " ")} v${event.payload.version ?? "?"}${event.payload.error ? ` (${event.payload.error})` : ""}`);
  } else {
    addEvent(event.at, message.kind, `${event.router}: ${JSON.stringify(event.payload)}`);
  }
  redrawCharts();
}

// Router timestamp → receive time, and publisher send time → receive time (same host clock
// in tests and the benchmark; across hosts it includes clock offset).
function recordLatency(message) {
  const now = Date.now() / 1000;
  const live = window.switchyardLive;
  live.latencies.push(now - message.ts);
  if (message.published_at) live.deliveries.push(now - message.published_at);
  for (const series of [live.latencies, live.deliveries]) if (series.length > LATENCY_SAMPLES) series.shift();
}

function applyMessage(message) {
  window.switchyardLive.messages += 1;
  if (message.type === "snapshot") {
    if (message.ts) recordLatency(message);
    applySnapshot(message);
  } else if (message.type === "event") {
    applyEvent(message);
  } else if (message.type === "decisions") {
    addDecisions(message.decisions);
  } else if (message.type === "config") {
    annotate(message.at, "config", `config v${message.version} published`);
    redrawCharts(true);
  }
}

// ---------------------------------------------------------------- loading and connecting
async function loadSnapshot(withHistory) {
  const response = await fetch(cfg.snapshotUrl, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`snapshot: HTTP ${response.status}`);
  const body = await response.json();
  state.annotations = body.annotations.map((a) => ({ at: a.at, kind: a.kind, label: a.label }));
  $("#events").innerHTML = "";
  for (const a of body.annotations) addEvent(a.at, a.kind, a.detail ? `${a.label} — ${a.detail}` : a.label);
  if (withHistory) pushHistory(body.history);
  if (body.live) applySnapshot(body.live);
  addDecisions(body.decisions);
  if (cfg.history) renderDecisions();
  redrawCharts(true);
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}${cfg.wsPath}`);
  state.socket = socket;
  socket.onopen = () => {
    const reconnected = state.attempts > 0;
    state.attempts = 0;
    setConn("live", "live");
    if (reconnected) loadSnapshot(false).catch((error) => console.warn(error)); // catch up
  };
  socket.onmessage = (event) => applyMessage(JSON.parse(event.data));
  socket.onclose = () => {
    const delay = BACKOFF_MS[Math.min(state.attempts, BACKOFF_MS.length - 1)] * (0.8 + 0.4 * Math.random());
    state.attempts += 1;
    setConn("stale", `stale: reconnecting in ${(delay / 1000).toFixed(1)} s`);
    setTimeout(connect, delay);
  };
}

async function main() {
  bindSorting();
  if (cfg.history) {
    await loadSnapshot(true);
    setConn("history", "history");
    return;
  }
  try {
    await loadSnapshot(true);
  } catch (error) {
    console.warn(error);
  }
  connect();
  setInterval(tickAge, 500);
}

main();
