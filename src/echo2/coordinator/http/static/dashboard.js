// The echo2 run dashboard: polls /dashboard/state.json and draws it as SVG. No library, no
// network beyond this coordinator; every string from the run goes in as text, never as markup.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const W = 320, H = 160, PAD = { left: 36, right: 8, top: 8, bottom: 20 };

function el(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function fmt(value, digits = 2) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

function setText(id, text) {
  document.getElementById(id).textContent = text;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function emptyChart(svg, message) {
  svg.appendChild(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, message));
}

function axes(svg, x0, x1, y0, y1, digits = 2, xLabels = true) {
  const bottom = H - PAD.bottom, right = W - PAD.right;
  svg.appendChild(el("line", { x1: PAD.left, y1: bottom, x2: right, y2: bottom, class: "axis" }));
  svg.appendChild(el("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: bottom, class: "axis" }));
  svg.appendChild(el("text", { x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, fmt(y1, digits)));
  svg.appendChild(el("text", { x: PAD.left - 4, y: bottom, "text-anchor": "end" }, fmt(y0, digits)));
  if (!xLabels) return;
  svg.appendChild(el("text", { x: PAD.left, y: H - 6 }, String(x0)));
  svg.appendChild(el("text", { x: right, y: H - 6, "text-anchor": "end" }, String(x1)));
}

// points: [[step, value], ...]; fixed: [min, max] of the y axis, or null to fit the data
function lineChart(id, points, fixed, emptyMessage) {
  const svg = document.getElementById(id);
  clear(svg);
  if (!points.length) return emptyChart(svg, emptyMessage);
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  let [y0, y1] = fixed || [Math.min(...ys), Math.max(...ys)];
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  axes(svg, x0, x1, y0, y1);
  const sx = x => PAD.left + (x - x0) / (x1 - x0) * (W - PAD.left - PAD.right);
  const sy = y => H - PAD.bottom - (y - y0) / (y1 - y0) * (H - PAD.top - PAD.bottom);
  const coords = points.map(p => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
  svg.appendChild(el("polyline", { points: coords, class: "line" }));
  if (points.length === 1) svg.appendChild(el("circle", { cx: sx(xs[0]), cy: sy(ys[0]), r: 2.5, class: "bar" }));
}

function histogram(id, hist, maxStaleness) {
  const svg = document.getElementById(id);
  clear(svg);
  const keys = Object.keys(hist).map(Number);
  if (!keys.length) return emptyChart(svg, "no batch assigned yet");
  const lo = Math.min(0, ...keys), hi = Math.max(maxStaleness, ...keys);
  const counts = [];
  for (let s = lo; s <= hi; s++) counts.push([s, hist[String(s)] || 0]);
  const top = Math.max(...counts.map(c => c[1]), 1);
  axes(svg, lo, hi, 0, top, 0, false);
  const slot = (W - PAD.left - PAD.right) / counts.length;
  const room = H - PAD.top - PAD.bottom - 12;  // the count above the tallest bar stays inside
  counts.forEach(([s, n], i) => {
    const h = n / top * room;
    const x = PAD.left + i * slot + slot * 0.15;
    svg.appendChild(el("rect", { x: x, y: H - PAD.bottom - h, width: slot * 0.7, height: h, class: "bar" }));
    svg.appendChild(el("text", { x: x + slot * 0.35, y: H - PAD.bottom - h - 2, "text-anchor": "middle" }, String(n)));
    svg.appendChild(el("text", { x: x + slot * 0.35, y: H - 6, "text-anchor": "middle" }, String(s)));
  });
}

function workerTable(state) {
  const body = document.querySelector("#workers tbody");
  clear(body);
  for (const w of state.workers) {
    const row = document.createElement("tr");
    row.className = w.status;
    const cells = [w.worker_id, w.status, String(w.version), String(w.leases), fmt(w.tokens_per_s, 1),
                   fmt(w.publish_to_loaded_s, 2), fmt(w.bytes_relayed / 1e6, 1), fmt(w.price_per_hour, 2),
                   fmt(w.cost, 4)];
    cells.forEach((text, i) => {
      const cell = document.createElement("td");
      cell.textContent = text;
      if (i === 1) cell.className = "status-cell";
      row.appendChild(cell);
    });
    body.appendChild(row);
  }
  const more = state.workers_total - state.workers.length;
  setText("workers-more", more > 0 ? `${more} more not shown` : "");
}

function tree(broadcast, workers) {
  const svg = document.getElementById("tree");
  clear(svg);
  if (!broadcast) { setText("tree-version", ""); return emptyChart(svg, "no version published yet"); }
  setText("tree-version", `(version ${broadcast.version}, ${broadcast.mode})`);
  const byDepth = new Map();
  for (const node of broadcast.nodes) {
    if (!byDepth.has(node.depth)) byDepth.set(node.depth, []);
    byDepth.get(node.depth).push(node);
  }
  const depths = [...byDepth.keys()].sort((a, b) => a - b);
  const width = 480, rowH = 56, height = Math.max(200, depths.length * rowH + 20);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const where = new Map();
  depths.forEach((d, row) => {
    const nodes = byDepth.get(d);
    nodes.forEach((node, i) => where.set(node.id, [(i + 1) * width / (nodes.length + 1), 24 + row * rowH]));
  });
  for (const node of broadcast.nodes) {
    if (node.parent === null || !where.has(node.parent)) continue;
    const [x1, y1] = where.get(node.parent), [x2, y2] = where.get(node.id);
    svg.appendChild(el("line", { x1, y1, x2, y2, class: "edge" }));
  }
  for (const node of broadcast.nodes) {
    const [x, y] = where.get(node.id);
    const kind = node.parent === null ? "node origin" : node.holds ? "node holds" : "node";
    svg.appendChild(el("circle", { cx: x, cy: y, r: 7, class: kind }));
    svg.appendChild(el("text", { x: x, y: y + 19, "text-anchor": "middle" }, node.id === "origin" ? "learner" : node.id));
  }
}

function decisions(list) {
  const ol = document.getElementById("decisions");
  clear(ol);
  setText("decisions-none", list.length ? "" : "no change of the active set yet: every live worker runs");
  for (const d of list) {
    const li = document.createElement("li");
    const when = d.time ? new Date(d.time * 1000).toLocaleTimeString() : "";
    const active = (d.active || []).join(", ") || "none";
    li.textContent = `${when} active: ${active}. ${d.reason || ""}${d.trigger ? ` (after ${d.trigger})` : ""}`;
    ol.appendChild(li);
  }
}

function render(state) {
  setText("step", String(state.learner_step));
  setText("version", String(state.version));
  setText("utilization", state.learner_utilization === null ? "-" : `${(state.learner_utilization * 100).toFixed(1)}%`);
  setText("queues", `${state.queued} / ${state.leased} / ${state.buffered}`);
  const dropped = state.counters.dropped_uninformative;
  setText("uninformative", state.uninformative_share === null ? String(dropped)
    : `${dropped} (${(state.uninformative_share * 100).toFixed(1)}% of scored)`);
  setText("fleet", `${state.workers_active} / ${state.workers_live}`);
  const bill = state.fleet_bill;
  setText("cost", `$${fmt(state.cost.per_hour, 2)}/h, $${fmt(state.cost.total, 4)} so far`
    + (bill.billed_usd === undefined ? "" : `; machines billed $${fmt(bill.billed_usd, 4)} (${bill.held_at_end.length} held)`));
  lineChart("chart-reward", state.curves.reward, null, "no step trained yet");
  lineChart("chart-accuracy", state.curves.accuracy, [0, 1], "no evaluation yet");
  lineChart("chart-utilization", state.curves.utilization, [0, 1], "no step trained yet");
  histogram("chart-staleness", state.staleness_hist, state.max_staleness);
  histogram("chart-token-staleness", state.token_staleness_hist, state.max_staleness);
  setText("masked", state.masked_token_share === null ? "-"
    : `${state.tokens_masked_stale} (${(state.masked_token_share * 100).toFixed(1)}% of the model's tokens)`);
  workerTable(state);
  tree(state.broadcast, state.workers);
  decisions(state.decisions);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const response = await fetch("/dashboard/state.json", { cache: "no-store", credentials: "same-origin" });
    if (response.status === 401) { window.location.reload(); return; }  // the session is gone: log in again
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
    status.className = "status";
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    status.className = "status error";
    status.textContent = `coordinator unreachable (${error.message}); retrying`;
  }
  setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", poll);
