// A canary's page: median TTFT and TPOT per arm at each judgement (uPlot). The chart and its
// numbers (a json_script) sit in the polled timeline, so each htmx swap brings a fresh
// container: the chart is drawn again into it. No inline script: the CSP allows only 'self'.
const COLORS = { baseline: "#4e9af1", candidate: "#f1a34e" };
const ms = (v) => (v == null ? "–" : v >= 10 ? `${v.toFixed(1)} s` : `${(v * 1000).toFixed(v < 0.1 ? 1 : 0)} ms`);
function columns(data) {
  return [data.t, data.ttft_baseline, data.ttft_candidate, data.tpot_baseline, data.tpot_candidate];
}

function line(metric, arm) {
  return {
    label: `${metric.toUpperCase()} ${arm}`, scale: metric, stroke: COLORS[arm], width: 2,
    dash: metric === "tpot" ? [6, 4] : undefined, spanGaps: true, points: { show: true },
    value: (u, v) => ms(v),
  };
}

// uPlot pads a range of one value by its own magnitude: one judgement's time would span
// years (2027-2029), one median a range around zero. These keep a single point readable.
const timeRange = (u, min, max) => (min === max ? [min - 60, max + 60] : [min, max]);
const latencyRange = (u, min, max) => {
  if (min == null || max == null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  return min === max ? [0, max * 2 || 1] : [Math.max(0, min - (max - min) * 0.1), max + (max - min) * 0.1];
};

function options(width) {
  const axis = { stroke: "#aaa", grid: { stroke: "#333" } };
  return {
    width, height: 260,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
    scales: { x: { time: true, range: timeRange }, ttft: { range: latencyRange },
              tpot: { range: latencyRange } },
    axes: [axis, { ...axis, scale: "ttft", label: "TTFT median", size: 72, values: (u, vals) => vals.map(ms) },
           { ...axis, scale: "tpot", label: "TPOT median", side: 1, size: 72, grid: { show: false },
             values: (u, vals) => vals.map(ms) }],
    series: [{ label: "time (UTC)" }, line("ttft", "baseline"), line("ttft", "candidate"),
             line("tpot", "baseline"), line("tpot", "candidate")],
  };
}

function draw() {
  const el = document.getElementById("canary-chart");
  const source = document.getElementById("canary-chart-data");
  if (!el || !source) return;
  const data = JSON.parse(source.textContent);
  if (el.dataset.points || !data.t.length) return;
  el.dataset.points = String(data.t.length);
  const medians = columns(data).slice(1).some((values) => values.some((v) => v != null));
  if (!medians) {  // only judgements that waited for samples so far
    el.classList.add("muted");
    el.textContent = "No medians yet: the chart starts at the first judgement with samples in both arms.";
    return;
  }
  new uPlot(options(el.clientWidth || 800), columns(data), el);
}

draw();
// afterSwap, not afterSettle: the new container gets its chart before the next paint.
document.body.addEventListener("htmx:afterSwap", draw);
