"""A fleet seen as a :class:`SiteGraph`: its named sites and the site pairs it has measured.

Sites come in the order ``planner.core.sites.site_codes`` gives (declared sites first, then as
nodes name them); a node with neither site nor city has no site here. Measured pairs are the
fleet's site links and its node links between two different sites, rolled up per site pair by
``planner.core.sites.roll_up_by_site`` (median RTT, median positive throughput), then merged per
unordered pair the same way; a site link's RTT that was not measured (``rtt_source``) is left
out, so such a pair has a throughput and no RTT. Pairs of a site with itself are not edges:
completion fills them.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from hulk import geo
from planner.core.fleet import Fleet
from planner.core.site_pairs import site_locations
from planner.core.sites import roll_up_by_site, site_codes
from planner.linkpred.graph import SiteGraph, provider_of


def site_graph(fleet: Fleet) -> SiteGraph:
    """The fleet's named sites, their providers, places and GPUs, and its measured site pairs."""
    names, code = site_codes(fleet)
    order = [name for name in names if name]
    index = {name: k for k, name in enumerate(order)}
    declared = {site.id: site for site in fleet.sites}

    located = site_locations((node.site_key, node.coordinates) for node in fleet.nodes)
    lat = np.full(len(order), np.nan)
    lon = np.full(len(order), np.nan)
    providers = []
    for k, name in enumerate(order):
        site = declared.get(name)
        where = None
        if site is not None and site.latitude is not None and site.longitude is not None:
            where = (site.latitude, site.longitude)
        if where is None:
            where = located.get(name)
        if where is None:
            where = geo.coordinates(name)     # a site named after a city or cloud region
        if where is not None:
            lat[k], lon[k] = where
        given = getattr(site, "provider", None) if site is not None else None
        providers.append(given.strip().lower() if given and given.strip() else provider_of(name))

    gpus = np.zeros(len(order))
    for node, c in zip(fleet.nodes, code):
        name = names[c]
        if name:
            gpus[index[name]] += node.gpus

    i, j, rtt, gbps = _measured_pairs(fleet, index)
    return SiteGraph(tuple(order), tuple(providers), lat, lon, gpus, i, j, rtt, gbps)


def _measured_pairs(fleet: Fleet, index: dict[str, int]) -> tuple[np.ndarray, ...]:
    """(i, j, rtt_ms, gbps) per unordered pair of different named sites, i < j, sorted."""
    rolled = roll_up_by_site(fleet) if len(fleet.links) else fleet
    rtts: dict[tuple[int, int], list[float]] = defaultdict(list)
    bws: dict[tuple[int, int], list[float]] = defaultdict(list)
    for link in rolled.site_links:
        a, b = index.get(link.src), index.get(link.dst)
        if a is None or b is None or a == b:
            continue
        key = (min(a, b), max(a, b))
        # An RTT the formula filled in beside a measured throughput is no measurement.
        if link.rtt_measured:
            rtts[key].append(float(link.rtt_ms))
        if link.bandwidth_gbps is not None and link.bandwidth_gbps > 0:
            bws[key].append(float(link.bandwidth_gbps))
    keys = sorted(rtts.keys() | bws.keys())
    i = np.array([a for a, _ in keys], dtype=np.int64)
    j = np.array([b for _, b in keys], dtype=np.int64)
    rtt = np.array([_median(rtts[k]) if rtts.get(k) else np.nan for k in keys], dtype=float)
    gbps = np.array([_median(bws[k]) if bws.get(k) else np.nan for k in keys], dtype=float)
    return i, j, rtt, gbps


def _median(values: list[float]) -> float:
    # Most pairs hold one figure: np.median's overhead per call is most of a 200-site fleet's read.
    return values[0] if len(values) == 1 else float(np.median(values))
