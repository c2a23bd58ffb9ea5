"""Draw a fleet on a longitude/latitude layout, links coloured by RTT (like the paper's figure 7)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402

from hulk.errors import InputError  # noqa: E402
from hulk.plural import count as plural  # noqa: E402
from planner.core.fleet import Fleet, Network, complete  # noqa: E402
from planner.plots.output import plot_path, save_figure  # noqa: E402

MARKER_NODES = 300        # past this many nodes the dots shrink (by the square root)
CIRCLE_NODES = 12         # a place with more nodes draws them as a disc, not a larger circle
GOLDEN_ANGLE = math.pi * (3 - math.sqrt(5))
MAX_NODE_LINKS = 20_000   # node pairs beyond which links are drawn between sites (a hairball)
SITE_SAMPLE = 4           # members per site whose pairs give a site pair's drawn RTT


def layout(fleet: Fleet) -> dict[str, tuple[float, float]]:
    """(x = longitude, y = latitude) per node; nodes of one city spread on a small circle so they
    stay apart; nodes without coordinates go on a row below the map."""
    by_place: dict[tuple[float, float], list[str]] = defaultdict(list)
    unplaced: list[str] = []
    for node in fleet.nodes:
        c = node.coordinates
        if c is None:
            unplaced.append(node.id)
        else:
            by_place[(round(c[0], 2), round(c[1], 2))].append(node.id)
    lats = [p[0] for p in by_place] or [0.0]
    lons = [p[1] for p in by_place] or [0.0]
    span = max(max(lons) - min(lons), max(lats) - min(lats), 10.0)
    places = list(by_place)
    pos: dict[str, tuple[float, float]] = {}
    for (lat, lon), ids in by_place.items():
        if len(ids) == 1:
            pos[ids[0]] = (lon, lat)
            continue
        # A circle small enough not to reach the nearest other city.
        nearest = min((math.hypot(lat - a, lon - b) for a, b in places if (a, b) != (lat, lon)),
                      default=span)
        r = min(span * 0.03, 0.4 * nearest) * (1 + min(len(ids), CIRCLE_NODES) / 12)
        for k, node_id in enumerate(ids):
            if len(ids) <= CIRCLE_NODES:
                angle = 2 * math.pi * k / len(ids) + math.pi / 2
                pos[node_id] = (lon + r * math.cos(angle), lat + r * math.sin(angle))
            else:   # a sunflower disc of the same radius: a big site stays where it is
                rho, angle = r * math.sqrt((k + 0.5) / len(ids)), k * GOLDEN_ANGLE
                pos[node_id] = (lon + rho * math.cos(angle), lat + rho * math.sin(angle))
    if unplaced:
        y = min(lats) - span * 0.15
        x0, x1 = min(lons), max(lons) if len(lons) > 1 else min(lons) + span
        step = (x1 - x0) / max(len(unplaced) - 1, 1)
        for k, node_id in enumerate(unplaced):
            pos[node_id] = (x0 + k * step, y)
    return pos


def throughput_limits(tflops: list[float]) -> tuple[float, float]:
    """The colour bar's range: 0 to the fastest node, at least 1 TFLOP/s (a fleet without GPUs
    would otherwise get a bar from -0.1 to 0.1)."""
    return 0.0, max(max(tflops, default=0.0), 1.0)


CITY_LABEL_GID = "city-label"   # the city labels' artist id, for tests and later styling
MAX_NAMES_PER_LABEL = 12          # past this a merged label names the biggest and counts the rest


def label_text(members: list[tuple[str, float, float, int]]) -> str:
    """One label for one or more cities: "A (3), B (1)", two cities a line, west to east; a
    label for very many names the cities with the most nodes and counts the others."""
    shown = members
    if len(members) > MAX_NAMES_PER_LABEL:
        shown = sorted(members, key=lambda m: -m[3])[:MAX_NAMES_PER_LABEL - 1]
    names = [m[0] for m in sorted(shown, key=lambda m: m[1])]
    lines = [", ".join(names[k:k + 2]) for k in range(0, len(names), 2)]
    if len(shown) < len(members):
        lines.append(f"and {len(members) - len(shown)} more cities")
    return "\n".join(lines)


def place_city_labels(ax: Axes, anchors: list[tuple[str, float, float, int]],
                      fontsize: float = 7) -> list[Annotation]:
    """Label each (text, x, y, node count) anchor above its point; labels whose boxes would
    overlap on the figure merge into one label ("Frankfurt (2), Mainz (1)") over their points,
    until no two labels overlap. Call once the figure's layout is final (after tight_layout)."""
    fig = ax.figure
    ax.apply_aspect()                                   # the limits the equal aspect will draw
    renderer = fig.canvas.get_renderer()                # type: ignore[attr-defined]
    pad = fontsize * 0.3 * fig.dpi / 72                 # the white box around the text, in pixels
    groups = [[a] for a in anchors]
    while True:
        labels = []
        for members in groups:
            x = sum(m[1] for m in members) / len(members)
            y = max(m[2] for m in members)
            labels.append(ax.annotate(
                label_text(members), (x, y), textcoords="offset points", xytext=(0, 9),
                ha="center", va="bottom", fontsize=fontsize, fontweight="bold", zorder=4,
                gid=CITY_LABEL_GID, annotation_clip=False,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7}))
        boxes = [label.get_window_extent(renderer).padded(pad) for label in labels]
        parent = list(range(len(groups)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        merged = False
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                if boxes[i].overlaps(boxes[j]) and root(i) != root(j):
                    parent[root(j)] = root(i)
                    merged = True
        if not merged:
            return labels
        for label in labels:
            label.remove()
        joined: dict[int, list[tuple[str, float, float, int]]] = defaultdict(list)
        for i, members in enumerate(groups):
            joined[root(i)].extend(members)
        groups = list(joined.values())


def fleet_links(net: Network, show_imputed: bool, site_linked: frozenset = frozenset()
                ) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What to draw: ("node", i, j, rtt, imputed) for every measured node pair (and completed
    ones with ``show_imputed``) when the fleet has at most MAX_NODE_LINKS pairs; otherwise
    ("site", a, b, rtt, imputed) over site indices (:func:`site_members` order): one line per
    pair of sites, the median RTT of up to SITE_SAMPLE x SITE_SAMPLE of their node pairs,
    measured when the pair is in ``site_linked`` (frozensets of site keys with a site link) or
    any of those node pairs is. Never an n x n loop: a 10,000-server fleet has 50 million
    pairs."""
    n = net.n
    if n * (n - 1) // 2 <= MAX_NODE_LINKS:
        i, j = np.triu_indices(n, 1)
        rtt, imputed = net.rtt_ms[i, j], net.imputed[i, j]
        keep = np.isfinite(rtt) & (show_imputed | ~imputed)
        return "node", i[keep], j[keep], rtt[keep].astype(float), imputed[keep]
    members = site_members(net)
    keys = list(members)
    sample = [m[:SITE_SAMPLE] for m in members.values()]
    rows = []
    for a in range(len(sample)):
        for b in range(a + 1, len(sample)):
            block = np.ix_(sample[a], sample[b])
            rtt = net.rtt_ms[block]
            imputed = bool(net.imputed[block].all()) and \
                frozenset((keys[a], keys[b])) not in site_linked
            if not np.isfinite(rtt).any() or (imputed and not show_imputed):
                continue
            rows.append((a, b, float(np.median(rtt[np.isfinite(rtt)])), imputed))
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return "site", empty, empty, np.zeros(0), np.zeros(0, dtype=bool)
    a, b, rtt, imputed = (np.array(col) for col in zip(*rows))
    return "site", a, b, rtt, imputed


def site_members(net: Network) -> dict[str, list[int]]:
    """Node indices by site (a node's site, else its city; a node with neither is its own)."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(net.nodes):
        members[node.site_key or f"node {node.id}"].append(i)
    return members


def draw_fleet(fleet: Fleet, *, title: str | None = None, show_imputed: bool = False,
               dpi: int = 150) -> Figure:
    """The fleet's figure: measured links coloured by RTT (log scale), nodes sized by GPU count
    and coloured by throughput, one label per city (close cities share one). A fleet of more
    than MAX_NODE_LINKS node pairs gets one line per pair of sites instead (:func:`fleet_links`)."""
    if not fleet.nodes:
        raise InputError("the fleet has no nodes to draw")
    net = complete(fleet)
    pos = layout(fleet)
    fig, ax = plt.subplots(figsize=(12, 8), dpi=dpi)
    site_linked = frozenset(frozenset((k.src, k.dst)) for k in fleet.site_links)
    level, a, b, rtts, imputed = fleet_links(net, show_imputed, site_linked)
    if level == "node":
        anchor = [pos[node.id] for node in net.nodes]
    else:
        anchor = [(sum(pos[net.nodes[i].id][0] for i in m) / len(m),
                   sum(pos[net.nodes[i].id][1] for i in m) / len(m))
                  for m in site_members(net).values()]
    if rtts.size:
        lo, hi = max(float(rtts.min()), 0.1), max(float(rtts.max()), 0.2)
        norm = LogNorm(vmin=lo, vmax=hi) if hi / lo > 10 else Normalize(vmin=lo, vmax=hi)
        # Slow links underneath, fast links on top so the nearby structure stays visible.
        order = np.argsort(-rtts, kind="stable")
        segments = [(anchor[a[k]], anchor[b[k]]) for k in order.tolist()]
        styles = ["dotted" if imputed[k] else "solid" for k in order.tolist()]
        lines = LineCollection(segments, cmap="plasma_r", norm=norm, linewidths=0.7, alpha=0.55,
                               linestyles=styles, zorder=1)
        lines.set_array(np.maximum(rtts[order], lo))
        ax.add_collection(lines)
        bar = fig.colorbar(lines, ax=ax, shrink=0.85, pad=0.01)
        bar.set_label("round-trip time (ms)" + (" between sites (median)" if level == "site"
                                                else ""))
    xs = [pos[n.id][0] for n in fleet.nodes]
    ys = [pos[n.id][1] for n in fleet.nodes]
    thr = (net.thr / 1e12).tolist()
    shrink = min(1.0, math.sqrt(MARKER_NODES / len(fleet.nodes)))   # many nodes: smaller dots
    sizes = [(30 + 12 * max(n.gpus, 0)) * shrink for n in fleet.nodes]
    low, high = throughput_limits(thr)
    points = ax.scatter(xs, ys, s=sizes, c=thr, cmap="Greens", edgecolors="black",
                        linewidths=0.6, zorder=3, vmin=low, vmax=high)
    if len(fleet.nodes) <= 60:
        for n in fleet.nodes:
            ax.annotate(n.id, pos[n.id], fontsize=5, ha="center", va="center", zorder=5)
    cb = fig.colorbar(points, ax=ax, shrink=0.5, pad=0.08, location="bottom", aspect=40)
    cb.set_label("node throughput (TFLOP/s, 0.4 MFU)")
    n = len(fleet.nodes)
    # Measured pairs, counted without an n x n temporary beyond the imputed matrix itself.
    measured = (sum(int(np.count_nonzero(~row & np.isfinite(r)))
                    for row, r in zip(net.imputed, net.rtt_ms)) - n) // 2
    ax.set_title(title or f"{fleet.name}: {n:,} nodes, {measured:,} of {n * (n - 1) // 2:,} pairs "
                 f"measured" + ("" if not show_imputed else ", imputed dotted")
                 + ("" if level == "node" else
                    f"; one line per pair of the {plural(len(anchor), 'site')}, {int((~imputed).sum())} "
                    f"measured"))
    ax.set_xlabel("longitude (°)")
    ax.set_ylabel("latitude (°)")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.set_aspect("equal", adjustable="datalim")
    ax.margins(0.08)
    fig.tight_layout()
    cities: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for n in fleet.nodes:
        cities[n.city_key or "?"].append(pos[n.id])
    place_city_labels(ax, [(f"{city} ({len(pts)})", sum(p[0] for p in pts) / len(pts),
                            max(p[1] for p in pts), len(pts)) for city, pts in cities.items()])
    return fig


def plot_fleet(fleet: Fleet, out: str | Path, *, title: str | None = None,
               show_imputed: bool = False, dpi: int = 150) -> Path:
    """Write the fleet's figure (``draw_fleet``) in the format ``out``'s suffix names
    (:func:`plot_path`); returns the path written."""
    out = plot_path(out)
    if not fleet.nodes:
        raise InputError("the fleet has no nodes to draw", path=str(out))
    fig = draw_fleet(fleet, title=title, show_imputed=show_imputed, dpi=dpi)
    save_figure(fig, out)
    return out
