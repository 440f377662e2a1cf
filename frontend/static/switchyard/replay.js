// Replay results: TTFT by percentile per policy (uPlot). Re-draws when htmx swaps in the
// finished job.
const PALETTE = ["#4e9af1", "#f1a34e", "#59c26b", "#d15ad1", "#e05a5a", "#9a9a9a", "#c9c94e", "#4ec9c9"];

function draw() {
  const el = document.getElementById("replay-plot");
  const source = document.getElementById("replay-results");
  if (!el || !source || el.dataset.drawn) return;
  const results = JSON.parse(source.textContent);
  const runs = results.policies.filter((p) => p.ttft_percentiles);
  if (!runs.length) return;
  el.dataset.drawn = "1";
  const ms = (v) => (v == null ? "–" : v >= 10 ? `${v.toFixed(1)} s` : `${(v * 1000).toFixed(v < 0.1 ? 1 : 0)} ms`);
  new uPlot({
    width: el.clientWidth || 800, height: 280, scales: { x: { time: false } },
    axes: [{ stroke: "#aaa", grid: { stroke: "#333" }, label: "percentile" },
           { stroke: "#aaa", grid: { stroke: "#333" }, size: 72, values: (u, vals) => vals.map(ms) }],
    series: [{ label: "percentile" }, ...runs.map((run, i) => ({
      label: results.rate_scales && results.rate_scales.length > 1 ? `${run.kind} ×${run.rate_scale}` : run.kind,
      stroke: PALETTE[i % PALETTE.length], width: 2, value: (u, v) => ms(v) }))],
  }, [results.percentiles, ...runs.map((run) => run.ttft_percentiles)], el);
}

draw();
document.body.addEventListener("htmx:afterSwap", draw);
