"""The fleet graph: what the store (or a fleet file) knows, as values and as a networkx graph.

``fleet_from_store`` turns the store's nodes and window statistics into a ``Fleet`` (one link per
measured ordered pair, RTT = the window's exact mean; imported links where nothing was measured).
A large fleet (more than ``SITE_LINKS_ABOVE`` nodes) is probed by plan (``planner.core.probe_plan``):
there the store folds measurements between two sites into one rollup per ordered site pair as
it rolls them up, and they are read as site links; only pairs inside a site stay node links, so
the Fleet grows with sites and sites' sizes, not with the square of the servers.
``fleet_graph`` draws a Fleet or a completed Network as an undirected ``nx.Graph``: nodes carry
their GPU features and computed throughput, edges the window statistics, and pairs completed by
``planner.core.fleet.complete`` (docs/COSTMODEL.md section 2) are present with ``imputed=True``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import replace

import networkx as nx
import numpy as np

from hulk.validate import shown
from planner.core.fleet import (FORMULA, Fleet, Link, Network, Node, Site, SiteLink, complete,
                                link_problem, node_problem, rtt_from_bandwidth)
from planner.core.gcpause import gc_paused
from planner.core.rollup import DailyRollup, WindowStats
from planner.core.probe_plan import site_key
from planner.core.site_pairs import PER_PAIR_UP_TO, site_locations
from planner.linkpred.complete import with_formula_rtts
from planner.service.node_state import revoked_nodes
from planner.service.store import PairRollup, Store

log = logging.getLogger(__name__)


def nodes_from_store(store: Store) -> list[Node]:
    """The store's nodes; one outside the fleet files' rules (a store written before them) is
    left out with a warning, so it cannot break every plan."""
    nodes = []
    for row in store.nodes():
        city = row.get("city")
        site = row.get("site")
        nodes.append(node := Node(
            id=row["id"], city=city,
            gpus=int(row["gpu_count"] if row.get("gpu_count") is not None else 0),
            gpu_name=row.get("gpu_name"), compute_capability=row.get("compute_capability"),
            memory_gb=float(row.get("memory_gb") or 0.0),
            latitude=row.get("latitude"), longitude=row.get("longitude"),
            # A site named after the city is the default one: the node names no site of its own.
            site=None if site == site_key(city) else site))
        if problem := node_problem(node):
            log.warning("node %s in the store left out: %s", shown(node.id), problem)
            nodes.pop()
    return nodes


# Above this many nodes the fleet is read with site links (the store keeps site-pair rollups
# for such a fleet: planner.core.site_pairs.PER_PAIR_UP_TO).
SITE_LINKS_ABOVE = PER_PAIR_UP_TO


def fleet_from_store(store: Store, window_days: int = 90, name: str = "default",
                     site_links: bool | None = None, *, keep_revoked: bool = False) -> Fleet:
    """The fleet of the store's last ``window_days``: measured ordered pairs with their mean RTT,
    loss and sample count; links of an imported fleet file fill pairs never measured. Links
    between two sites (or inside one) whose throughput tests measured a bandwidth carry it
    (``measured_site_bandwidth``); two sites whose throughput was measured and whose RTT never
    was get a site link of their own, its RTT completion's and marked so (``rtt_source``).

    Site links: the store's site-pair rollups (a fleet of more than ``SITE_LINKS_ABOVE`` nodes
    keeps pairs between two sites only as those) are one ``SiteLink`` per ordered site pair and
    the Fleet lists its ``sites``. With ``site_links`` (default: above ``SITE_LINKS_ABOVE``
    nodes) node-pair rollups between two sites still held (from when the fleet was smaller) are
    folded into the site links too; pairs inside a site, and pairs with a node of no known site,
    stay node links. Every figure is a sum SQLite adds up (no histograms are read).

    Revoked nodes (``planner.service.node_state``) and their links are left out, so nothing
    plans on them; ``keep_revoked`` keeps them for views that mark them."""
    # Hundreds of thousands of links stay alive, none of them in a cycle.
    with gc_paused():
        return _fleet_from_store(store, window_days, name, site_links, keep_revoked)


def measured_site_bandwidth(store: Store, window_days: int = 90
                            ) -> dict[tuple[str, str], float]:
    """Gbit/s per site pair from the store's throughput tests (docs/COSTMODEL.md section 2),
    both orders as keys: the median of the pair's ok tests, and where both directions were
    tested the smaller of the two medians (the cost model's bandwidth is one figure for both
    directions, and a pipeline's activations and gradients cross both)."""
    out: dict[tuple[str, str], float] = {}
    for (a, b), (gbps, _) in store.throughput_by_site_pair(window_days).items():
        if gbps > 0:
            both = min(gbps, out[(a, b)]) if (a, b) in out else gbps
            out[(a, b)] = out[(b, a)] = both
    return out


def _with_measured(links: list, site_of: dict[str, str | None],
                   measured: dict[tuple[str, str], float]) -> list:
    """Node links between (or inside) sites with a measured throughput carry it: measured
    throughput wins over the formula and over an imported figure."""
    if not measured:
        return links
    out = []
    for link in links:
        gbps = measured.get((site_of.get(link.src), site_of.get(link.dst)))
        out.append(link if gbps is None else replace(link, bandwidth_gbps=gbps))
    return out


def _fleet_from_store(store: Store, window_days: int, name: str,
                      site_links: bool | None, keep_revoked: bool) -> Fleet:
    nodes = nodes_from_store(store)
    revoked = frozenset() if keep_revoked else revoked_nodes(store)
    if revoked:
        nodes = [n for n in nodes if n.id not in revoked]
    measured_bw = measured_site_bandwidth(store, window_days)
    fold = len(nodes) > SITE_LINKS_ABOVE if site_links is None else site_links
    window = store.window_totals(window_days)
    if revoked:
        window = [row for row in window if row[0] not in revoked and row[1] not in revoked]
    site_sums = {(a, b): [count, lost, total]
                 for a, b, count, lost, total in store.site_window_totals(window_days)}
    imported = store.imported_links()
    # Only imported links need to know which pairs were measured (a large set at scale).
    measured = {frozenset((src, dst)) for src, dst, count, lost, _ in window if count > lost} \
        if imported else set()
    pairs = window
    if fold:
        site_of = {n.id: n.site_key for n in nodes}
        pairs = []
        for row in window:
            a, b = site_of.get(row[0]), site_of.get(row[1])
            if a is None or b is None or a == b:
                pairs.append(row)
                continue
            acc = site_sums.setdefault((a, b), [0, 0, 0.0])
            acc[0] += row[2]
            acc[1] += row[3]
            acc[2] += row[4]
    # The window's exact mean and loss; a pair whose every probe was lost has no RTT to speak
    # of (its loss shows in the graph stats).
    links = [Link(src, dst, rtt_ms=total / (count - lost), loss=lost / count, samples=count)
             for src, dst, count, lost, total in pairs if count > lost]
    links.sort(key=lambda k: (k.src, k.dst))
    for row in imported:
        if frozenset((row["src"], row["dst"])) in measured \
                or row["src"] in revoked or row["dst"] in revoked:
            continue
        links.append(link := Link(row["src"], row["dst"], rtt_ms=row["rtt_ms"],
                                  bandwidth_gbps=row["bandwidth_gbps"], loss=row["loss"] or 0.0,
                                  samples=row["samples"] or 0))
        if problem := link_problem(link):
            log.warning("imported link %s -> %s in the store left out: %s", shown(link.src),
                        shown(link.dst), problem)
            links.pop()
    links = _with_measured(links, {n.id: n.site_key for n in nodes}, measured_bw)
    site_link_list = [SiteLink(a, b, rtt_ms=total / (count - lost), loss=lost / count,
                               samples=count, bandwidth_gbps=measured_bw.get((a, b)))
                      for (a, b), (count, lost, total) in sorted(site_sums.items())
                      if count > lost]
    unprobed = _throughput_only(nodes, links, site_link_list, measured_bw)
    if not fold and not site_sums and not unprobed:
        return Fleet(tuple(nodes), tuple(links), name=name)
    site_link_list += unprobed
    located = site_locations((n.site_key, n.coordinates) for n in nodes)
    sites = tuple(Site(s, *(where or (None, None))) for s, where in sorted(located.items()))
    return with_formula_rtts(Fleet(tuple(nodes), tuple(links), name=name, sites=sites,
                                   site_links=tuple(site_link_list)))


def _throughput_only(nodes: list[Node], links: list[Link], site_links: list[SiteLink],
                     measured: dict[tuple[str, str], float]) -> list[SiteLink]:
    """A site link for each pair of two sites of ``nodes`` whose throughput was measured and
    whose RTT never was (ICMP blocked, every sample refused): no link carries its throughput
    otherwise, so plans would never see it. Its RTT is marked ``rtt_source`` formula; the
    window formula's RTT of the throughput stands in until ``with_formula_rtts`` gives it
    completion's figure. The samples behind it are RTT samples: 0."""
    if not measured:
        return []
    site_of = {n.id: n.site_key for n in nodes}
    sites = set(site_of.values())
    timed = {frozenset((site_of.get(k.src), site_of.get(k.dst))) for k in links}
    timed |= {frozenset((k.src, k.dst)) for k in site_links}
    out = []
    for (a, b), gbps in sorted(measured.items()):
        if a < b and a in sites and b in sites and frozenset((a, b)) not in timed:
            out.append(SiteLink(a, b, rtt_ms=rtt_from_bandwidth(gbps), bandwidth_gbps=gbps,
                                rtt_source=FORMULA))
    return out


def pair_stats(pairs: Iterable[PairRollup]) -> dict[frozenset[str], WindowStats]:
    """Window statistics per unordered pair: both directions' rollups merged (exact sums)."""
    merged: dict[frozenset[str], DailyRollup] = {}
    for p in pairs:
        key = frozenset((p.src, p.dst))
        merged.setdefault(key, DailyRollup()).merge(p.rollup)
    return {k: r.stats() for k, r in merged.items()}


def fleet_graph(source: Fleet | Network,
                stats: dict[frozenset[str], WindowStats] | None = None) -> nx.Graph:
    """The undirected fleet graph. Every pair that can communicate is an edge with ``rtt_ms``,
    ``bandwidth_gbps`` and ``imputed``; measured edges also carry ``samples``, ``loss`` and, when
    ``stats`` is given, ``jitter_ms``, ``p50_ms``, ``p99_ms``, ``min_ms``, ``max_ms``.
    One Python edge per pair: for fleets of hundreds of nodes (10,000 servers would be 50
    million edges); the planners and the plots read the completed Network's arrays instead."""
    network = complete(source) if isinstance(source, Fleet) else source
    link_info: dict[frozenset[str], dict] = {}
    if isinstance(source, Fleet):
        for link in source.links:
            if link.imputed or link.src == link.dst:
                continue
            info = link_info.setdefault(frozenset((link.src, link.dst)), {"samples": 0,
                                                                          "loss_w": 0.0})
            info["samples"] += link.samples
            info["loss_w"] += link.loss * max(link.samples, 1)
            info["n"] = info.get("n", 0) + max(link.samples, 1)
    g = nx.Graph(name=getattr(source, "name", "fleet"))
    for i, node in enumerate(network.nodes):
        coords = node.coordinates
        g.add_node(node.id, index=i, city=node.city_key, gpus=node.gpus, gpu_name=node.gpu_name,
                   compute_capability=node.compute_capability, memory_gb=node.memory_gb,
                   throughput=float(network.thr[i]),
                   latitude=coords[0] if coords else None,
                   longitude=coords[1] if coords else None)
    ids = network.ids
    n = network.n
    for i in range(n):
        for j in range(i + 1, n):
            rtt = float(network.rtt_ms[i, j])
            if not math.isfinite(rtt):
                continue  # different components: no edge, they cannot communicate
            bw = float(network.bw[i, j])
            attrs = {"rtt_ms": rtt, "bandwidth_gbps": bw * 8 / 1e9 if np.isfinite(bw) else None,
                     "imputed": bool(network.imputed[i, j])}
            key = frozenset((ids[i], ids[j]))
            info = link_info.get(key)
            if info is not None:
                attrs["samples"] = info["samples"]
                attrs["loss"] = info["loss_w"] / info["n"] if info["n"] else 0.0
            st = (stats or {}).get(key)
            if st is not None and not attrs["imputed"]:
                attrs.update(samples=st.samples, loss=st.loss, mean_ms=st.mean_ms,
                             jitter_ms=st.jitter_ms, p50_ms=st.p50_ms, p99_ms=st.p99_ms,
                             min_ms=st.min_ms, max_ms=st.max_ms)
            g.add_edge(ids[i], ids[j], **attrs)
    return g


def store_graph(store: Store, window_days: int = 90, name: str = "default") -> nx.Graph:
    """The fleet graph of the store's window, edges with the full window statistics."""
    fleet = fleet_from_store(store, window_days, name=name)
    return fleet_graph(fleet, pair_stats(store.window_rollups(window_days)))
