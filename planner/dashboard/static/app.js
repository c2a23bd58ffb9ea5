// The Hulk dashboard: reads /api/fleet, /api/jobs and /api/plan every few seconds and draws the
// fleet on an equirectangular map (inline SVG), the jobs, the nodes and the last plan's comparison.
// Read-only; no external resources (the page must work on a machine without internet).
"use strict";

const REFRESH_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
const STATE_COLOURS = { alive: "#2563eb", silent: "#9ca3af", imported: "#a78bfa" };
const MAP_W = 1000, MAP_H_MIN = 300, MAP_H_MAX = 620;

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4))
                                      : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function svgTitle(node, text) { node.appendChild(el("svg:title", {}, text)); return node; }

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function duration(s) {
  if (s === null || s === undefined) return "";
  if (s < 120) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

// hulk/plural.py's count: count(1, "node") is "1 node", count(2, "node") "2 nodes".
function count(n, one, many) { return `${n} ${n === 1 ? one : (many || one + "s")}`; }

function stateBadge(state) { return el("span", { class: `state state-${state}` }, state); }

function row(cells) {
  const tr = el("tr");
  for (const c of cells) {
    const td = el("td", c && c.num ? { class: "num" } : {});
    if (c instanceof Node) td.appendChild(c);
    else if (c && typeof c === "object") td.textContent = c.text;
    else td.textContent = c === null || c === undefined ? "" : String(c);
    tr.appendChild(td);
  }
  return tr;
}

// ----------------------------------------------------------------------------------- the map

function projection(sites) {
  // The sites' bounding box with a margin, at least 60 x 30 degrees, at one scale for both axes
  // (equirectangular: x from longitude, y from latitude); the map is as tall as the box needs.
  let lons = sites.map(s => s.lon), lats = sites.map(s => s.lat);
  if (!lons.length) { lons = [-180, 180]; lats = [-60, 75]; }
  let lo = Math.min(...lons) - 12, hi = Math.max(...lons) + 12;
  let la = Math.min(...lats) - 8, ha = Math.max(...lats) + 8;
  if (hi - lo < 60) { const c = (hi + lo) / 2; lo = c - 30; hi = c + 30; }
  if (ha - la < 30) { const c = (ha + la) / 2; la = c - 15; ha = c + 15; }
  let scale = MAP_W / (hi - lo);
  const height = Math.min(MAP_H_MAX, Math.max(MAP_H_MIN, (ha - la) * scale));
  scale = Math.min(scale, height / (ha - la));
  const cx = (hi + lo) / 2, cy = (ha + la) / 2;
  return {
    height,
    x: lon => MAP_W / 2 + (lon - cx) * scale,
    y: lat => height / 2 - (lat - cy) * scale,
    lonRange: [cx - MAP_W / 2 / scale, cx + MAP_W / 2 / scale],
    latRange: [cy - height / 2 / scale, cy + height / 2 / scale],
  };
}

function placeLabel(placed, x, y, r, width) {
  // The first of right, left, above, below of the site whose box misses every label placed so
  // far and stays inside the map (close cities' labels must not print over each other).
  const h = 14;
  const options = [[x + r + 4, y + 4, "start"], [x - r - 4, y + 4, "end"],
                   [x + r + 2, y - r - 4, "start"], [x + r + 2, y + r + 13, "start"],
                   [x - r - 2, y - r - 4, "end"], [x - r - 2, y + r + 13, "end"]];
  const box = ([lx, ly, anchor]) => anchor === "start" ? [lx, ly - h + 3, lx + width, ly + 3]
                                                       : [lx - width, ly - h + 3, lx, ly + 3];
  const free = b => b[0] >= 0 && b[2] <= MAP_W &&
    placed.every(o => b[2] < o[0] || b[0] > o[2] || b[3] < o[1] || b[1] > o[3]);
  const choice = options.find(o => free(box(o))) ||
                 options.find(o => { const b = box(o); return b[0] >= 0 && b[2] <= MAP_W; }) || options[0];
  placed.push(box(choice));
  return choice;
}

function drawGraticule(svg, p) {
  const g = el("svg:g", { stroke: "#c9d6e3", "stroke-width": 1 });
  const [l0, l1] = p.lonRange, [a0, a1] = p.latRange;
  const step = l1 - l0 > 120 ? 30 : 10;
  for (let lon = Math.ceil(l0 / step) * step; lon <= l1; lon += step) {
    g.appendChild(el("svg:line", { x1: p.x(lon), x2: p.x(lon), y1: 0, y2: p.height }));
    svg.appendChild(el("svg:text", { x: p.x(lon) + 2, y: p.height - 4, class: "grid-label" },
                       `${Math.abs(lon)}°${lon < 0 ? "W" : "E"}`));
  }
  for (let lat = Math.ceil(a0 / step) * step; lat <= a1; lat += step) {
    g.appendChild(el("svg:line", { x1: 0, x2: MAP_W, y1: p.y(lat), y2: p.y(lat) }));
    svg.appendChild(el("svg:text", { x: 3, y: p.y(lat) - 3, class: "grid-label" },
                       `${Math.abs(lat)}°${lat < 0 ? "S" : "N"}`));
  }
  svg.insertBefore(g, svg.firstChild);
}

function linkTitle(l, source) {
  let rtt = `${l.rtt_ms} ms RTT (median of ${count(l.pairs, "pair")}, ${l.min_ms}–${l.max_ms} ms)`;
  if (source === "predicted") rtt = `${l.rtt_ms} ms RTT predicted by ${l.model} (planned as ≤ ${l.rtt_hi_ms} ms)`;
  else if (source === "formula") rtt = `${l.rtt_ms} ms RTT relayed over measured links`;
  let bw = "";
  if (l.bandwidth_gbps !== null && l.bandwidth_gbps !== undefined) {
    const bs = l.bandwidth_source || "measured";
    bw = bs === "predicted" ? `, ${l.bandwidth_gbps} Gbit/s predicted (planned as ≥ ${l.bandwidth_lo_gbps})`
      : bs === "formula" ? `, ${l.bandwidth_gbps} Gbit/s by the window formula`
      : `, ${l.bandwidth_gbps} Gbit/s measured`;
  }
  return `${l.a} – ${l.b} [${source}]: ${rtt}${bw}`;
}

function drawMap(fleet) {
  const svg = document.getElementById("map");
  clear(svg);
  const sites = fleet.sites;
  const p = projection(sites);
  svg.setAttribute("viewBox", `0 0 ${MAP_W} ${Math.round(p.height)}`);
  drawGraticule(svg, p);
  const at = {};
  for (const s of sites) at[s.key] = [p.x(s.lon), p.y(s.lat)];
  const links = el("svg:g", { id: "map-links", "stroke-linecap": "round" });
  // Longest RTT first, so the short (green) links are drawn on top.
  for (const l of [...fleet.links].reverse()) {
    const [x1, y1] = at[l.a], [x2, y2] = at[l.b];
    const source = l.source || "measured";
    const attrs = { x1, y1, x2, y2, stroke: l.colour, "stroke-width": source === "measured" ? 3 : 1.5,
                    "data-rtt": l.rtt_ms, "data-source": source };
    // Predicted and formula links are dashed: no probe measured them.
    if (source !== "measured") attrs["stroke-dasharray"] = source === "predicted" ? "6 4" : "2 4";
    const line = el("svg:line", attrs);
    links.appendChild(svgTitle(line, linkTitle(l, source)));
  }
  svg.appendChild(links);
  const byId = {};
  for (const n of fleet.nodes) byId[n.id] = n;
  const nodes = el("svg:g", { id: "map-sites" });
  const labels = el("svg:g", { id: "map-labels" });
  const placed = [];
  for (const s of sites) {
    const [x, y] = at[s.key];
    const r = 5 + 2.5 * Math.sqrt(s.gpus);
    const g = el("svg:g", { class: "site", "data-site": s.key });
    const inside = s.inside_rtt_ms === null ? "" : `, ${s.inside_rtt_ms} ms RTT inside`;
    g.appendChild(svgTitle(el("svg:circle", { cx: x, cy: y, r, fill: "#ffffff", stroke: "#1f2933",
                                              "stroke-width": 1.5 }),
                           `${s.key}: ${count(s.nodes.length, "node")}, ${count(s.gpus, "GPU")}, ` +
                           `${s.alive} alive, ${s.silent} silent${inside}`));
    const shown = s.nodes.slice(0, 24);
    shown.forEach((id, i) => {
      const n = byId[id];
      const angle = 2 * Math.PI * i / shown.length - Math.PI / 2;
      const d = shown.length === 1 ? 0 : r - 2;
      const dot = el("svg:circle", { cx: x + d * Math.cos(angle), cy: y + d * Math.sin(angle),
                                     r: shown.length === 1 ? r - 2 : 3.5,
                                     fill: STATE_COLOURS[n.state] || "#999", "data-node": id });
      g.appendChild(svgTitle(dot, `${id}: ${n.state}, ${count(n.gpus, "GPU")} ${n.gpu_name}`));
    });
    nodes.appendChild(g);
    const text = `${s.key} (${s.nodes.length})`;
    const [lx, ly, anchor] = placeLabel(placed, x, y, r, 7 * text.length);
    labels.appendChild(el("svg:text", { x: lx, y: ly, "text-anchor": anchor, class: "map-label" }, text));
  }
  svg.appendChild(nodes);
  svg.appendChild(labels);

  const legend = document.getElementById("legend");
  clear(legend);
  for (const stop of fleet.legend) {
    const item = el("span");
    const sw = el("span", { class: "swatch" });
    sw.style.background = stop.colour;
    item.append(sw, `${stop.rtt_ms} ms`);
    legend.appendChild(item);
  }
  for (const [source, dash] of [["measured", ""], ["predicted", "6 4"], ["formula", "2 4"]]) {
    if (source !== "measured" && !fleet.links.some(l => l.source === source)) continue;
    const item = el("span", { class: "link-source", "data-source": source });
    const sw = el("svg:svg", { width: 24, height: 8 });
    sw.appendChild(el("svg:line", { x1: 0, y1: 4, x2: 24, y2: 4, stroke: "#52606d",
                                    "stroke-width": 2, ...(dash ? { "stroke-dasharray": dash } : {}) }));
    item.append(sw, ` ${source}`);
    legend.appendChild(item);
  }
  for (const [state, colour] of Object.entries(STATE_COLOURS)) {
    const item = el("span");
    const dot = el("span", { class: "dot" });
    dot.style.background = colour;
    item.append(dot, state);
    legend.appendChild(item);
  }
  const notes = [];
  const unlocated = fleet.unlocated.length;
  if (unlocated) notes.push(`${count(unlocated, "node")} without a city or coordinates ` +
                            `${unlocated === 1 ? "is" : "are"} not on the map: ${fleet.unlocated.join(", ")}`);
  if (fleet.links_hidden) notes.push(`${count(fleet.links_hidden, "longer link")} not drawn`);
  if (!fleet.links.some(l => (l.source || "measured") === "measured"))
    notes.push("no measured links between sites yet");
  document.getElementById("map-note").textContent = notes.join("; ");
}

// ---------------------------------------------------------------------------------- the tables

function drawTotals(fleet, jobs) {
  document.getElementById("fleet-name").textContent = fleet.fleet;
  const t = fleet.totals;
  const box = document.getElementById("totals");
  clear(box);
  const running = (jobs.states.running || 0), queued = (jobs.states.queued || 0);
  for (const text of [count(t.nodes, "node"), `${t.alive} alive`, `${t.silent} silent`,
                      count(t.gpus, "GPU"), `${t.memory_gb} GB`, `${count(running, "job")} running`,
                      `${queued} queued`]) {
    box.appendChild(el("span", {}, text));
  }
}

function drawNodes(fleet) {
  const body = document.querySelector("#nodes-table tbody");
  clear(body);
  for (const n of fleet.nodes) {
    const gpus = n.gpus ? `${n.gpus} × ${n.gpu_name}` : (n.gpu_unavailable || "none");
    const seen = n.silent_for_s === null ? "never (imported)" : `${duration(n.silent_for_s)} ago`;
    const launch = n.launch ? `${n.launch.job} (${n.launch.state})` : "";
    const spool = n.spool_depth ? `${n.spool_depth}${n.spool_dropped ? `, ${n.spool_dropped} dropped` : ""}` : "";
    const tr = row([n.id, n.site || "(no location)", stateBadge(n.state), gpus,
                    { text: `${n.memory_gb} GB`, num: true }, seen, launch, spool]);
    tr.setAttribute("data-node", n.id);
    body.appendChild(tr);
  }
}

// A step's measured time against the plan's estimate, e.g. "0.231 s (est. 0.200 s, +16%)".
function stepTime(j) {
  if (j.iteration_s === null || j.iteration_s === undefined) return "";
  const measured = `${j.iteration_s.toPrecision(3)} s`;
  if (!j.iteration_estimate_s) return measured;
  const off = Math.round((j.iteration_s / j.iteration_estimate_s - 1) * 100);
  return `${measured} (est. ${j.iteration_estimate_s.toPrecision(3)} s, ${off >= 0 ? "+" : ""}${off}%)`;
}

function drawJobs(jobs) {
  const body = document.querySelector("#jobs-table tbody");
  clear(body);
  for (const j of jobs.jobs) {
    const nodes = j.nodes.length > 6 ? `${j.nodes.slice(0, 6).join(", ")} +${j.nodes.length - 6}`
                                     : j.nodes.join(", ");
    const tr = row([j.name, j.model, stateBadge(j.state), nodes, j.cities.join(", "),
                    { text: duration(j.elapsed_s), num: true }, { text: duration(j.estimate_s), num: true },
                    { text: stepTime(j), num: true }, { text: j.restarts, num: true }, j.detail]);
    tr.setAttribute("data-job", j.name);
    body.appendChild(tr);
  }
  if (!jobs.jobs.length) body.appendChild(row(["no jobs (hulk-planner jobs submit jobs.yaml)"]));
  document.getElementById("jobs-states").textContent =
    Object.entries(jobs.states).map(([s, n]) => `${n} ${s}`).join(", ") +
    (jobs.hidden ? ` (${jobs.hidden} older not shown)` : "");
}

function drawPlan(doc) {
  const plan = doc.plan, cmp = doc.comparison;
  const summary = [];
  if (plan.plan_ids.length) summary.push(`plan ${plan.plan_ids.join(", ")}`);
  if (plan.jobs.length) summary.push(`jobs ${plan.jobs.map(j => `${j.name} (${j.state})`).join(", ")}`);
  if (plan.estimated_makespan_s !== null) summary.push(`estimated ${duration(plan.estimated_makespan_s)}`);
  if (doc.status === "computing") summary.push("comparing the methods…");
  if (!plan.jobs.length) summary.push("no plan yet: submit jobs with `hulk-planner jobs submit`");
  if (cmp) summary.push(`compared on ${count(cmp.nodes, "node")} at ${new Date(cmp.computed_ms).toLocaleTimeString()}` +
                        (cmp.compute_bound_s !== null ? `; compute bound ${duration(cmp.compute_bound_s)}` : ""));
  document.getElementById("plan-summary").textContent = summary.join(" · ");
  const body = document.querySelector("#plan-table tbody");
  clear(body);
  const bars = document.getElementById("plan-bars");
  clear(bars);
  if (!cmp) return;
  const done = cmp.methods.filter(m => m.makespan_s !== null);
  const longest = Math.max(1, ...done.map(m => m.makespan_s));
  cmp.methods.forEach((m, i) => {
    const note = m.error || (m.unplaced.length ? `cannot place ${m.unplaced.join(", ")}` : "");
    const tr = row([m.label, { text: duration(m.makespan_s), num: true },
                    { text: m.vs_hulk === null ? "" : `${m.vs_hulk.toFixed(2)}×`, num: true },
                    { text: duration(m.sum_jct_s), num: true }, { text: `${m.planning_s} s`, num: true },
                    note]);
    tr.setAttribute("data-method", m.method);
    body.appendChild(tr);
    const y = 8 + i * 30;
    bars.appendChild(el("svg:text", { x: 0, y: y + 15, class: "bar-label" }, m.label));
    if (m.makespan_s !== null) {
      // Log scale: the baselines can be hundreds of times longer than Hulk's plan.
      const w = 300 * Math.log1p(m.makespan_s) / Math.log1p(longest);
      bars.appendChild(svgTitle(el("svg:rect", { x: 190, y, width: Math.max(2, w), height: 20,
                                                 fill: m.method === cmp.hulk ? "#2563eb" : "#94a3b8" }),
                                `${m.label}: ${duration(m.makespan_s)}`));
      bars.appendChild(el("svg:text", { x: 196 + w, y: y + 15, class: "bar-label" }, duration(m.makespan_s)));
    } else {
      bars.appendChild(el("svg:text", { x: 190, y: y + 15, class: "bar-label" }, "n/a"));
    }
  });
  bars.setAttribute("viewBox", `0 0 600 ${16 + cmp.methods.length * 30}`);
}

// ------------------------------------------------------------------------------------ refresh

async function getJson(name) {
  const response = await fetch(`${location.origin}/api/${name}`, { credentials: "same-origin", cache: "no-store" });
  if (!response.ok) throw new Error(`/api/${name}: HTTP ${response.status}`);
  return response.json();
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [fleet, jobs, plan] = await Promise.all([getJson("fleet"), getJson("jobs"), getJson("plan")]);
    drawTotals(fleet, jobs);
    drawMap(fleet);
    drawNodes(fleet);
    drawJobs(jobs);
    drawPlan(plan);
    status.textContent = `updated ${new Date(fleet.generated_ms).toLocaleTimeString()}`;
    status.className = "status";
    document.body.setAttribute("data-loaded", "1");
  } catch (err) {
    status.textContent = `cannot refresh: ${err.message}`;
    status.className = "status error";
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
