"""Draw a fleet on a longitude/latitude layout, links coloured by RTT (like the paper's figure 7)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402

from hulk.errors import InputError  # noqa: E402
from planner.core.fleet import Fleet  # noqa: E402
from planner.service.graph import fleet_graph  # noqa: E402


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
        r = min(span * 0.03, 0.4 * nearest) * (1 + len(ids) / 12)
        for k, node_id in enumerate(ids):
            angle = 2 * math.pi * k / len(ids) + math.pi / 2
            pos[node_id] = (lon + r * math.cos(angle), lat + r * math.sin(angle))
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


def draw_fleet(fleet: Fleet, *, title: str | None = None, show_imputed: bool = False,
               dpi: int = 150) -> Figure:
    """The fleet's figure: measured links coloured by RTT (log scale), nodes sized by GPU count
    and coloured by throughput, one label per city (close cities share one)."""
    if not fleet.nodes:
        raise InputError("the fleet has no nodes to draw")
    g = fleet_graph(fleet)
    pos = layout(fleet)
    fig, ax = plt.subplots(figsize=(12, 8), dpi=dpi)
    edges = [(u, v, d) for u, v, d in g.edges(data=True) if show_imputed or not d["imputed"]]
    rtts = [d["rtt_ms"] for _, _, d in edges]
    if rtts:
        lo, hi = max(min(rtts), 0.1), max(max(rtts), 0.2)
        norm = LogNorm(vmin=lo, vmax=hi) if hi / lo > 10 else Normalize(vmin=lo, vmax=hi)
        # Slow links underneath, fast links on top so the nearby structure stays visible.
        edges.sort(key=lambda e: -e[2]["rtt_ms"])
        segments = [(pos[u], pos[v]) for u, v, _ in edges]
        colours = [max(d["rtt_ms"], lo) for _, _, d in edges]
        styles = ["dotted" if d["imputed"] else "solid" for _, _, d in edges]
        lines = LineCollection(segments, cmap="plasma_r", norm=norm, linewidths=0.7, alpha=0.55,
                               linestyles=styles, zorder=1)
        lines.set_array(colours)
        ax.add_collection(lines)
        bar = fig.colorbar(lines, ax=ax, shrink=0.85, pad=0.01)
        bar.set_label("round-trip time (ms)")
    xs = [pos[n.id][0] for n in fleet.nodes]
    ys = [pos[n.id][1] for n in fleet.nodes]
    thr = [g.nodes[n.id]["throughput"] / 1e12 for n in fleet.nodes]
    sizes = [30 + 12 * max(n.gpus, 0) for n in fleet.nodes]
    low, high = throughput_limits(thr)
    points = ax.scatter(xs, ys, s=sizes, c=thr, cmap="Greens", edgecolors="black",
                        linewidths=0.6, zorder=3, vmin=low, vmax=high)
    if len(fleet.nodes) <= 60:
        for n in fleet.nodes:
            ax.annotate(n.id, pos[n.id], fontsize=5, ha="center", va="center", zorder=5)
    cb = fig.colorbar(points, ax=ax, shrink=0.5, pad=0.08, location="bottom", aspect=40)
    cb.set_label("node throughput (TFLOP/s, 0.4 MFU)")
    measured = sum(1 for *_, d in g.edges(data=True) if not d["imputed"])
    n = len(fleet.nodes)
    ax.set_title(title or f"{fleet.name}: {n} nodes, {measured} of {n * (n - 1) // 2} pairs "
                 f"measured" + ("" if not show_imputed else ", imputed dotted"))
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
    """Write a PNG of the fleet (``draw_fleet``); returns the path written."""
    out = Path(out)
    if not fleet.nodes:
        raise InputError("the fleet has no nodes to draw", path=str(out))
    fig = draw_fleet(fleet, title=title, show_imputed=show_imputed, dpi=dpi)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
