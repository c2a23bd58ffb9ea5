"""The dashboard's JSON documents, built from the store's values (pure: values in, dicts out).

``fleet_json``: nodes with GPUs and state (alive, silent, or imported without an agent), grouped
into sites (a city, or a place given by coordinates) with their map coordinates, and the links
between sites coloured by RTT. ``jobs_json``: jobs with their nodes and state. ``plan_json``: the
last plan and the methods' makespans for its jobs (``planner.dashboard.compare``).

Every number is finite or null: the documents go through ``json.dumps(allow_nan=False)``. Every
text an agent or a job sent (host and GPU names, launch states, a job's detail with its log's
last lines) reaches the page with its control characters shown as '?', as `hulk-planner jobs`
prints them (:func:`hulk.validate.terminal_safe`): an escape sequence is never part of the page.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hulk import geo
from hulk.validate import terminal_safe
from planner.core.fleet import Link
from planner.core.lifecycle import LIVE, JobRecord

ALIVE, SILENT, IMPORTED = "alive", "silent", "imported"
# The RTT colour scale is fixed (log scale, 1 ms green to 300 ms red), so a colour means the same
# RTT on every fleet and every refresh.
RTT_SCALE_MS = (1.0, 300.0)
RTT_RAMP = ((26, 152, 80), (254, 224, 139), (215, 48, 39))   # green, yellow, red
LEGEND_MS = (1, 3, 10, 30, 100, 300)
MAX_MAP_LINKS = 4000    # an SVG line each; past this the lowest-RTT links are drawn
MAX_JOBS = 200


@dataclass(frozen=True)
class PairLink:
    """One unordered pair of nodes: RTT (mean over both directions, weighted by samples) and the
    bandwidth its sites' throughput tests measured (None: not measured)."""

    a: str
    b: str
    rtt_ms: float
    loss: float
    samples: int
    bandwidth_gbps: float | None = None


def number(x: Any, digits: int = 3) -> float | None:
    """A finite float rounded to ``digits``, else None (JSON has no NaN or infinity)."""
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return round(x, digits) if math.isfinite(x) else None


def text(value: Any) -> str:
    """A text for the page: '' for none, control characters shown as '?' line by line (its lines
    kept: a log's last lines)."""
    return "\n".join(terminal_safe(line) for line in str(value).splitlines()) if value else ""


def rtt_colour(rtt_ms: float | None) -> str:
    """The link colour of an RTT: '#rrggbb' on the fixed log scale; grey when unknown."""
    if rtt_ms is None or not math.isfinite(rtt_ms):
        return "#999999"
    lo, hi = (math.log10(v) for v in RTT_SCALE_MS)
    t = (math.log10(max(rtt_ms, 1e-3)) - lo) / (hi - lo)
    t = min(1.0, max(0.0, t)) * (len(RTT_RAMP) - 1)
    k = min(int(t), len(RTT_RAMP) - 2)
    f = t - k
    rgb = [round(c0 + (c1 - c0) * f) for c0, c1 in zip(RTT_RAMP[k], RTT_RAMP[k + 1])]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def pair_links(links: Iterable[Link]) -> list[PairLink]:
    """A fleet's ordered links (``fleet_from_store``) merged per unordered pair; imputed links
    and self-links are left out. One pass: a large fleet has hundreds of thousands."""
    sums: dict[tuple[str, str], list[float]] = {}
    for link in links:
        if link.imputed or link.src == link.dst or not math.isfinite(link.rtt_ms):
            continue
        key = (link.src, link.dst) if link.src < link.dst else (link.dst, link.src)
        w = max(link.samples, 1)
        acc = sums.get(key)
        if acc is None:
            sums[key] = [link.rtt_ms * w, link.loss * w, w, link.samples, link.bandwidth_gbps]
        else:
            acc[0] += link.rtt_ms * w
            acc[1] += link.loss * w
            acc[2] += w
            acc[3] += link.samples
            acc[4] = acc[4] if link.bandwidth_gbps is None else link.bandwidth_gbps
    return [PairLink(a, b, rtt / w, loss / w, int(samples), bw)
            for (a, b), (rtt, loss, w, samples, bw) in sums.items()]


def node_location(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """(lat, lon) of a store node row: its own coordinates, else its city's in hulk.geo."""
    lat, lon = number(row.get("latitude"), 4), number(row.get("longitude"), 4)
    if lat is not None and lon is not None and -90 <= lat <= 90 and -180 <= lon <= 180:
        return lat, lon
    return geo.coordinates(row.get("city"))


def site_of(row: Mapping[str, Any], location: tuple[float, float] | None) -> str | None:
    """The site a node is drawn at: the store's site (the one it declared, else its city), else
    its city (the gazetteer's name when known), else its coordinates rounded to about a
    kilometre; None when it has none of these."""
    site = text(row.get("site")).strip()
    if site:
        return site
    city = text(row.get("city")).strip()
    if city:
        return geo.canonical_city(city) or city
    if location is not None:
        return f"{location[0]:.2f},{location[1]:.2f}"
    return None


def node_state(row: Mapping[str, Any], now_ms: int, silent_after_ms: float) -> str:
    if row.get("source") == "import" or row.get("last_seen_ms") is None:
        return IMPORTED
    return ALIVE if now_ms - int(row["last_seen_ms"]) <= silent_after_ms else SILENT


def node_json(row: Mapping[str, Any], now_ms: int, silent_after_ms: float) -> dict[str, Any]:
    location = node_location(row)
    seen = row.get("last_seen_ms")
    launch = None
    if row.get("launch_state"):
        launch = {"state": text(row["launch_state"]), "job": text(row.get("launch_job")),
                  "exit_code": row.get("launch_exit_code")}
    return {
        "id": row["id"], "hostname": text(row.get("hostname")), "city": text(row.get("city")),
        "site": site_of(row, location),
        "lat": location[0] if location else None, "lon": location[1] if location else None,
        "gpus": int(row.get("gpu_count") or 0), "gpu_name": text(row.get("gpu_name")),
        "memory_gb": number(row.get("memory_gb"), 1) or 0.0,
        "gpu_unavailable": text(row.get("gpu_unavailable_reason")),
        "state": node_state(row, now_ms, silent_after_ms),
        "last_seen_ms": seen, "silent_for_s": None if seen is None else number((now_ms - seen) / 1000, 1),
        "spool_depth": row.get("spool_depth"), "spool_dropped": row.get("spool_dropped"),
        "launch": launch,
    }


@dataclass(frozen=True)
class LinkSummary:
    """The links as the map draws them: between sites (each with its colour), and inside each."""

    between: tuple[dict[str, Any], ...] = ()     # shortest first
    inside_ms: Mapping[str, float] = field(default_factory=dict)
    pairs: int = 0


def node_sites(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node id -> site, for the nodes that can be put on the map."""
    out = {}
    for r in rows:
        location = node_location(r)
        site = site_of(r, location)
        if site is not None and location is not None:
            out[r["id"]] = site
    return out


def summarise_links(sites: Mapping[str, str], links: Iterable[PairLink]) -> LinkSummary:
    """Node pairs grouped into site pairs: median RTT (with min, max, mean loss) and the
    throughput tests' Gbit/s (null: not measured) between two sites, median RTT inside a site. The costly step on a large fleet: done when links or sites
    change, not on every refresh."""
    between: dict[tuple[str, str], list[PairLink]] = defaultdict(list)
    inside: dict[str, list[float]] = defaultdict(list)
    pairs = 0
    for link in links:
        pairs += 1
        a, b = sites.get(link.a), sites.get(link.b)
        if a is None or b is None:
            continue
        if a == b:
            inside[a].append(link.rtt_ms)
        else:
            between[(a, b) if a < b else (b, a)].append(link)
    drawn = []
    for (a, b), group in between.items():
        rtts = [l.rtt_ms for l in group]
        rtt = statistics.median(rtts)
        measured = [l.bandwidth_gbps for l in group if l.bandwidth_gbps is not None]
        drawn.append({"a": a, "b": b, "rtt_ms": number(rtt), "colour": rtt_colour(rtt),
                      "min_ms": number(min(rtts)), "max_ms": number(max(rtts)),
                      "loss": number(statistics.fmean(l.loss for l in group), 4),
                      "pairs": len(group), "samples": sum(l.samples for l in group),
                      "bandwidth_gbps": number(statistics.median(measured)) if measured else None})
    drawn.sort(key=lambda l: (l["rtt_ms"], l["a"], l["b"]))
    return LinkSummary(tuple(drawn), {k: statistics.median(v) for k, v in inside.items()}, pairs)


def fleet_json(rows: Sequence[Mapping[str, Any]], links: LinkSummary | Sequence[PairLink], *,
               fleet: str, now_ms: int, node_timeout_s: float,
               max_links: int = MAX_MAP_LINKS) -> dict[str, Any]:
    """The fleet document: nodes, sites with coordinates, links between sites coloured by RTT
    (median of the node pairs between two sites), and each site's RTT inside it. ``links`` is
    ``summarise_links`` of the same nodes' sites, or the node pairs to summarise now."""
    nodes = [node_json(r, now_ms, node_timeout_s * 1000) for r in rows]
    if not isinstance(links, LinkSummary):
        links = summarise_links(node_sites(rows), links)
    members: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for n in nodes:
        if n["site"] is not None and n["lat"] is not None:
            members[n["site"]].append(n)
    sites = {}
    for key, group in sorted(members.items()):
        sites[key] = {
            "key": key, "lat": number(statistics.fmean(n["lat"] for n in group), 4),
            "lon": number(statistics.fmean(n["lon"] for n in group), 4),
            "nodes": [n["id"] for n in group], "gpus": sum(n["gpus"] for n in group),
            "alive": sum(n["state"] == ALIVE for n in group),
            "silent": sum(n["state"] == SILENT for n in group),
            "inside_rtt_ms": number(links.inside_ms.get(key))}
    drawn = [l for l in links.between if l["a"] in sites and l["b"] in sites]
    states = defaultdict(int)
    for n in nodes:
        states[n["state"]] += 1
    return {
        "fleet": fleet, "generated_ms": now_ms, "node_timeout_s": node_timeout_s,
        "nodes": nodes, "sites": list(sites.values()), "links": drawn[:max_links],
        "links_hidden": max(0, len(drawn) - max_links),
        "unlocated": [n["id"] for n in nodes if n["site"] not in sites],
        "legend": [{"rtt_ms": v, "colour": rtt_colour(v)} for v in LEGEND_MS],
        "totals": {"nodes": len(nodes), "gpus": sum(n["gpus"] for n in nodes),
                   "memory_gb": number(sum(n["memory_gb"] for n in nodes), 1),
                   "pairs_measured": links.pairs, **{s: states[s] for s in (ALIVE, SILENT, IMPORTED)}},
    }


def job_json(record: JobRecord, cities: Mapping[str, str], now_ms: int,
             iteration: tuple[float, float | None] | None = None) -> dict[str, Any]:
    """One job's row; ``iteration``: its measured and estimated seconds a step, when its
    ranks measured any (Store.job_iterations)."""
    end = record.finished_ms or now_ms
    spec = record.spec or {}
    return {
        "name": text(record.name), "state": record.state, "model": text(spec.get("model") or "custom"),
        "nodes": list(record.nodes),
        "cities": sorted({text(cities[n]) for n in record.nodes if cities.get(n)}),
        "plan_id": record.plan_id, "submitted_ms": record.submitted_ms,
        "started_ms": record.started_ms, "finished_ms": record.finished_ms,
        "elapsed_s": None if record.started_ms is None else number((end - record.started_ms) / 1000, 1),
        "estimate_s": number(record.estimate_s, 1), "restarts": record.restarts,
        "detail": text(record.detail), "retired": record.retired_ms is not None,
        "iteration_s": number(iteration[0], 4) if iteration else None,
        "iteration_estimate_s": number(iteration[1], 4) if iteration else None,
    }


def jobs_json(records: Sequence[JobRecord], rows: Sequence[Mapping[str, Any]], *, now_ms: int,
              limit: int = MAX_JOBS,
              iterations: Mapping[str, tuple[float, float | None]] | None = None
              ) -> dict[str, Any]:
    """Live jobs first (oldest first), then the most recently finished, at most ``limit``;
    ``iterations``: job name -> (measured, estimated) seconds a step."""
    iterations = iterations or {}
    cities = {r["id"]: r.get("city") or "" for r in rows}
    live = [r for r in records if r.state in LIVE]
    done = sorted((r for r in records if r.state not in LIVE),
                  key=lambda r: (r.finished_ms or r.changed_ms, r.id), reverse=True)
    shown = (live + done)[:limit]
    counts = defaultdict(int)
    for r in records:
        counts[r.state] += 1
    return {"generated_ms": now_ms,
            "jobs": [job_json(r, cities, now_ms, iterations.get(r.name)) for r in shown],
            "hidden": len(records) - len(shown), "states": dict(sorted(counts.items()))}


def last_plan_records(records: Sequence[JobRecord]) -> list[JobRecord]:
    """The jobs of the plan in effect: the live ones; with none live, those of the newest plan id."""
    live = [r for r in records if r.state in LIVE]
    if live:
        return live
    planned = [r for r in records if r.plan_id]
    if not planned:
        return []
    newest = max(planned, key=lambda r: (r.changed_ms, r.id)).plan_id
    return [r for r in planned if r.plan_id == newest]
