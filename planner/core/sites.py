"""Completion of unmeasured pairs (docs/COSTMODEL.md section 2), vectorised, with sites.

``complete_fleet`` turns a ``Fleet`` into a dense ``Network``. A fleet without site links is
completed node by node as it always was (measured pairs, shortest paths over measured links,
same-site medians), with numpy doing the work so that a full mesh of 1,000 servers takes well
under a second. A fleet with site links is completed at the site level first (a few hundred
sites: Dijkstra over the site links is cheap) and the node matrices are then built by indexing
the site matrices with each node's site, so 10,000 servers never meet a Python loop over pairs
or an O(n^3) step; node links then override their pairs. Above ``FLOAT32_FROM_NODES`` servers the
matrices are float32 (half the memory; RTTs in ms and bandwidths in bytes/s keep 7 digits).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.fleet import (DEFAULT_SAME_CITY_RTT_MS, GBIT, Fleet, LinkTable, Network,
                                bandwidth_from_rtt)

FLOAT32_FROM_NODES = 4000


@dataclass(frozen=True)
class MeasuredPairs:
    """Measured node links merged per unordered pair (a < b), in order of first appearance."""

    a: np.ndarray          # int64 node index
    b: np.ndarray          # int64 node index, a < b
    rtt_ms: np.ndarray     # mean of the pair's RTTs
    bw_gbps: np.ndarray    # mean of its positive bandwidths, NaN where none


def _link_columns(fleet: Fleet, index: dict[str, int]) -> tuple[np.ndarray, ...]:
    """(src, dst, rtt, bw) of the links that count: known nodes, no self-loops, not imputed."""
    links = fleet.links
    if isinstance(links, LinkTable) and links.ids == [n.id for n in fleet.nodes]:
        keep = links.src != links.dst
        return links.src[keep], links.dst[keep], links.rtt_ms[keep], links.bandwidth_gbps[keep]
    src, dst, rtt, bw = [], [], [], []
    for link in links:
        if link.imputed or link.src == link.dst:
            continue
        i, j = index.get(link.src), index.get(link.dst)
        if i is None or j is None:
            continue
        src.append(i)
        dst.append(j)
        rtt.append(float(link.rtt_ms))
        bw.append(np.nan if link.bandwidth_gbps is None else float(link.bandwidth_gbps))
    return (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
            np.array(rtt, dtype=float), np.array(bw, dtype=float))


def merge_pairs(src: np.ndarray, dst: np.ndarray, rtt: np.ndarray, bw: np.ndarray,
                n: int) -> MeasuredPairs:
    """Average the RTTs (and positive bandwidths) of each unordered pair measured more than once.

    Means are taken with ``np.mean`` over the values in file order, as the rule always did, so a
    pair measured once keeps its value bit for bit."""
    a, b = np.minimum(src, dst), np.maximum(src, dst)
    key = a * n + b
    _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True,
                                          return_counts=True)
    order = np.argsort(first, kind="stable")        # groups in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    group = rank[inverse]
    starts = first[order]
    out_rtt = rtt[starts].astype(float)
    bw_pos = np.where(bw > 0, bw, np.nan)
    out_bw = bw_pos[starts].astype(float)
    repeated = np.flatnonzero(counts[order] > 1)
    if len(repeated):
        members: dict[int, list[int]] = {int(g): [] for g in repeated}
        for k in np.flatnonzero(np.isin(group, repeated)).tolist():
            members[int(group[k])].append(k)
        for g, ks in members.items():
            out_rtt[g] = float(np.mean([float(rtt[k]) for k in ks]))
            positive = [float(bw_pos[k]) for k in ks if bw_pos[k] == bw_pos[k]]
            out_bw[g] = float(np.mean(positive)) if positive else np.nan
    return MeasuredPairs(a[starts], b[starts], out_rtt, out_bw)


def site_codes(fleet: Fleet) -> tuple[list[str], np.ndarray]:
    """The fleet's sites (declared ones first, then as nodes name them) and each node's site
    number; a node with neither site nor city gets a site of its own (code ``-1 - i`` is not
    used: it gets a fresh number, unnamed)."""
    names: list[str] = [s.id for s in fleet.sites]
    code = {name: k for k, name in enumerate(names)}
    out = np.empty(len(fleet.nodes), dtype=np.int64)
    for i, node in enumerate(fleet.nodes):
        key = node.site_key
        if key is None:
            out[i] = len(names)
            names.append("")   # unnamed: matches no site link and no other node
            continue
        if key not in code:
            code[key] = len(names)
            names.append(key)
        out[i] = code[key]
    return names, out


def _site_medians(pairs: MeasuredPairs, site: np.ndarray, n_sites: int) -> np.ndarray:
    """Per site, the RTT an unmeasured pair of two of its servers gets (section 2 step 3)."""
    same = (site[pairs.a] == site[pairs.b]) & (site[pairs.a] >= 0)
    values, owner = pairs.rtt_ms[same], site[pairs.a][same]
    fleet_median = float(np.median(values)) if len(values) else DEFAULT_SAME_CITY_RTT_MS
    out = np.full(n_sites, fleet_median)
    if len(values):
        order = np.argsort(owner, kind="stable")
        owner, values = owner[order], values[order]
        bounds = np.flatnonzero(np.diff(owner)) + 1
        for chunk_owner, chunk in zip(np.split(owner, bounds), np.split(values, bounds)):
            out[chunk_owner[0]] = float(np.median(chunk))
    return out


def _relay(graph_pairs: MeasuredPairs, n: int, sources: np.ndarray) -> np.ndarray:
    """Shortest-path RTTs from ``sources`` over the measured links (rows of len(sources) x n)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    graph = csr_matrix((graph_pairs.rtt_ms, (graph_pairs.a, graph_pairs.b)), shape=(n, n))
    return dijkstra(graph, directed=False, indices=sources)


def complete_fleet(fleet: Fleet, prediction=None) -> Network:
    """docs/COSTMODEL.md section 2 for ``fleet``: the dense ``Network`` the planners read.

    ``prediction`` (a LinkPrediction over named sites, or None for today's rule alone): see
    :func:`apply_prediction`."""
    nodes = tuple(fleet.nodes)
    n = len(nodes)
    index = {node.id: i for i, node in enumerate(nodes)}
    pairs = merge_pairs(*_link_columns(fleet, index), n)
    names, site = site_codes(fleet)
    if fleet.site_links:
        net = _complete_by_sites(fleet, nodes, pairs, names, site)
    else:
        net = _complete_by_nodes(nodes, pairs, site, len(names))
    if prediction is not None:
        apply_prediction(net, fleet, pairs, names, site, prediction)
    return net


def apply_prediction(net: Network, fleet: Fleet, pairs: MeasuredPairs, names: list[str],
                     site: np.ndarray, prediction) -> None:
    """Give the node pairs of two different sites the prediction's conservative figures where
    it predicted them and no measurement covers the site pair, per quantity: its upper RTT
    where no site link joins the sites and no node link joins any of their servers; its lower
    throughput where, besides, no node link between them measured a throughput (a node pair
    with a measured RTT keeps it). A pair whose RTT was predicted and throughput not takes the
    window formula of the new RTT; FORMULA figures keep today's rule. A site link the fleet
    gives, a completed one too, is used as given, except a formula RTT beside a measured
    throughput (``rtt_source``), which a predicted RTT replaces. In place, by row blocks."""
    from planner.linkpred.graph import Source

    s = len(names)
    where = {name: k for k, name in enumerate(prediction.sites)}
    to_pred = np.array([where.get(name, -1) if name else -1 for name in names], dtype=np.int64)
    known = to_pred >= 0
    if not known.any():         # no named site the prediction covers (servers without a city)
        return
    grid = np.ix_(np.where(known, to_pred, 0), np.where(known, to_pred, 0))
    # Which site pairs a measurement covers, per quantity; a completed site link is used as
    # given (covers both), a measured one covers the throughput when it measured one.
    covered_rtt = np.zeros((s, s), dtype=bool)
    covered_bw = np.zeros((s, s), dtype=bool)
    sa, sb = site[pairs.a], site[pairs.b]
    covered_rtt[sa, sb] = covered_rtt[sb, sa] = True
    has_bw = np.isfinite(pairs.bw_gbps)
    covered_bw[sa[has_bw], sb[has_bw]] = covered_bw[sb[has_bw], sa[has_bw]] = True
    code = {name: k for k, name in enumerate(names) if name}
    for link in fleet.site_links:
        a, b = code.get(link.src), code.get(link.dst)
        if a is not None and b is not None:
            # The formula's RTT beside a measured throughput gives way, as relayed ones do.
            if link.source != "measured" or link.rtt_source != "formula":
                covered_rtt[a, b] = covered_rtt[b, a] = True
            if link.source != "measured" or link.bandwidth_gbps is not None:
                covered_bw[a, b] = covered_bw[b, a] = True
    between = known[:, None] & known[None, :]
    np.fill_diagonal(between, False)
    rtt_hi = np.asarray(prediction.rtt_hi_ms, dtype=float)[grid]
    gbps_lo = np.asarray(prediction.gbps_lo, dtype=float)[grid]
    new_rtt = between & ~covered_rtt
    new_rtt &= np.asarray(prediction.rtt_source)[grid] == Source.PREDICTED
    new_rtt &= np.isfinite(rtt_hi) & (rtt_hi >= 0)
    new_bw = between & ~covered_bw
    new_bw &= np.asarray(prediction.gbps_source)[grid] == Source.PREDICTED
    new_bw &= np.isfinite(gbps_lo) & (gbps_lo > 0)
    window_bw = new_rtt & ~new_bw & ~covered_bw   # a measured throughput stays
    if not (new_rtt.any() or new_bw.any()):
        return
    n = len(site)
    rows = max(1, (64 << 20) // max(1, 8 * n))
    for lo in range(0, n, rows):
        sa = site[lo:lo + rows]
        take_rtt = new_rtt[sa][:, site]
        if take_rtt.any():
            block = net.rtt_ms[lo:lo + rows]
            block[take_rtt] = rtt_hi[sa][:, site][take_rtt]
        take_bw = new_bw[sa][:, site]
        if take_bw.any():
            block = net.bw[lo:lo + rows]
            block[take_bw] = (gbps_lo[sa][:, site] * GBIT)[take_bw]
        take_window = window_bw[sa][:, site]
        if take_window.any():
            block = net.bw[lo:lo + rows]
            block[take_window] = _tcp_bw(net.rtt_ms[lo:lo + rows])[take_window]


def _complete_by_nodes(nodes, pairs: MeasuredPairs, site: np.ndarray, n_sites: int) -> Network:
    """No site links: measured pairs, shortest paths over them, then same-site medians."""
    n = len(nodes)
    dtype = np.float32 if n >= FLOAT32_FROM_NODES else np.float64
    rtt = np.full((n, n), np.inf, dtype=dtype)
    np.fill_diagonal(rtt, 0.0)
    measured = np.zeros((n, n), dtype=bool)
    rtt[pairs.a, pairs.b] = pairs.rtt_ms
    rtt[pairs.b, pairs.a] = pairs.rtt_ms
    measured[pairs.a, pairs.b] = measured[pairs.b, pairs.a] = True

    missing = ~measured
    np.fill_diagonal(missing, False)
    sources = np.flatnonzero(missing.any(axis=1))
    if len(sources) and len(pairs.a):
        relayed = _relay(pairs, n, sources)
        rtt[sources] = np.where(missing[sources], relayed, rtt[sources])

    medians = _site_medians(pairs, site, n_sites)
    same = site[:, None] == site[None, :]
    same &= missing
    rtt[same] = np.broadcast_to(medians[site][:, None], (n, n))[same]
    del same, missing
    return _finish(nodes, rtt, measured, pairs, default_bw=None)


def _site_matrices(fleet: Fleet, names: list[str]) -> tuple[np.ndarray, ...]:
    """Site-level RTT (inf where no link), bandwidth in Gbit/s (NaN where none measured) and
    which site pairs have a link (mean of duplicates, both directions merged)."""
    code = {name: k for k, name in enumerate(names) if name}
    s = len(names)
    src = np.array([code[k.src] for k in fleet.site_links], dtype=np.int64)
    dst = np.array([code[k.dst] for k in fleet.site_links], dtype=np.int64)
    # A completed link (predicted, formula) counts with its conservative figures.
    rtt = np.array([float(k.planned_rtt_ms) for k in fleet.site_links])
    bw = np.array([np.nan if k.planned_bandwidth_gbps is None else float(k.planned_bandwidth_gbps)
                   for k in fleet.site_links])
    merged = merge_pairs(src, dst, rtt, bw, s)
    site_rtt = np.full((s, s), np.inf)
    site_bw = np.full((s, s), np.nan)
    linked = np.zeros((s, s), dtype=bool)
    for arr, values in ((site_rtt, merged.rtt_ms), (site_bw, merged.bw_gbps)):
        arr[merged.a, merged.b] = values
        arr[merged.b, merged.a] = values
    linked[merged.a, merged.b] = linked[merged.b, merged.a] = True
    return site_rtt, site_bw, linked


def _complete_by_sites(fleet: Fleet, nodes, pairs: MeasuredPairs, names: list[str],
                       site: np.ndarray) -> Network:
    """Site links: each node pair takes its sites' figures (a site link, else the shortest path
    over site links, else, same site, the site's median); node links override their pairs."""
    n, s = len(nodes), len(names)
    site_rtt, site_bw, linked = _site_matrices(fleet, names)
    between = site_rtt.copy()
    np.fill_diagonal(between, np.inf)
    off = np.isfinite(between)
    level = between.copy()
    if off.any():
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import dijkstra

        ii, jj = np.nonzero(off)
        relayed = dijkstra(csr_matrix((between[ii, jj], (ii, jj)), shape=(s, s)), directed=False)
        level = np.where(off, between, relayed)
    medians = _site_medians(pairs, site, s)
    self_linked = np.diag(linked)
    np.fill_diagonal(level, np.where(self_linked, np.diag(site_rtt), medians))
    # Bandwidth between sites: the site link's measured figure, else the TCP model of its RTT.
    level_bw = np.where(linked & (site_bw > 0), site_bw * GBIT,
                        np.where(np.isfinite(level), bandwidth_from_rtt(
                            np.where(np.isfinite(level), level, 1e18)), 0.0))

    dtype = np.float32 if n >= FLOAT32_FROM_NODES else np.float64
    rtt = level.astype(dtype)[site][:, site]
    np.fill_diagonal(rtt, 0.0)
    bw = level_bw.astype(dtype)[site][:, site]
    measured = np.zeros((n, n), dtype=bool)
    rtt[pairs.a, pairs.b] = pairs.rtt_ms
    rtt[pairs.b, pairs.a] = pairs.rtt_ms
    measured[pairs.a, pairs.b] = measured[pairs.b, pairs.a] = True

    # Sites no site link reaches: relay over measured node links and the site figures.
    unreached = ~np.isfinite(rtt)
    if unreached.any() and len(pairs.a):
        sources = np.flatnonzero(unreached.any(axis=1))
        relayed = _relay_with_sites(pairs, site, level, sources)
        rows = np.where(unreached[sources], relayed, rtt[sources])
        rtt[sources] = rows
        bw[sources] = np.where(unreached[sources], _tcp_bw(rows), bw[sources])
        cols = sources  # keep the matrices symmetric
        rtt[:, cols] = rtt[cols].T
        bw[:, cols] = bw[cols].T
    del unreached
    # A completed site link's bandwidth (predicted: its lower figure) also stands for its
    # servers' measured pairs without a measured throughput, as completing with the prediction
    # gave them; measured site links leave those pairs the window formula of their own RTT.
    completed = _completed_site_bw(fleet, names)
    pair_bw = None if completed is None else completed[site[pairs.a], site[pairs.b]] * GBIT
    return _finish(nodes, rtt, measured, pairs, default_bw=bw, pair_bw=pair_bw)


def _completed_site_bw(fleet: Fleet, names: list[str]) -> np.ndarray | None:
    """Site x site bandwidth (Gbit/s) of predicted site links, NaN elsewhere; None if none."""
    code = {name: k for k, name in enumerate(names) if name}
    out = None
    for link in fleet.site_links:
        bw = link.planned_bandwidth_gbps
        if link.source == "predicted" and bw is not None:
            if out is None:
                out = np.full((len(names), len(names)), np.nan)
            a, b = code[link.src], code[link.dst]
            out[a, b] = out[b, a] = bw
    return out


def _relay_with_sites(pairs: MeasuredPairs, site: np.ndarray, level: np.ndarray,
                      sources: np.ndarray) -> np.ndarray:
    """Shortest-path RTTs from ``sources`` to every node over measured node links and the site
    figures. Each site is two hub vertices: its servers reach its out-hub for free, its in-hub
    reaches its servers for free, and out-hub s -> in-hub t costs ``level[s, t]`` (a site link,
    a path over them, or the site's own figure when s == t), so a hub never gives two servers of
    one site a free ride."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    n, s = len(site), level.shape[0]
    out_hub, in_hub = n + np.arange(s), n + s + np.arange(s)
    si, ti = np.nonzero(np.isfinite(level))
    everyone = np.arange(n)
    rows = np.concatenate([pairs.a, pairs.b, everyone, in_hub[site], out_hub[si]])
    cols = np.concatenate([pairs.b, pairs.a, out_hub[site], everyone, in_hub[ti]])
    weights = np.concatenate([pairs.rtt_ms, pairs.rtt_ms, np.zeros(2 * n), level[si, ti]])
    graph = csr_matrix((weights, (rows, cols)), shape=(n + 2 * s, n + 2 * s))
    return dijkstra(graph, directed=True, indices=sources)[:, :n]


def _tcp_bw(rtt: np.ndarray) -> np.ndarray:
    finite = np.isfinite(rtt)
    return np.where(finite, bandwidth_from_rtt(np.where(finite, rtt, 1e18)), 0.0)


def _finish(nodes, rtt: np.ndarray, measured: np.ndarray, pairs: MeasuredPairs,
            default_bw: np.ndarray | None, pair_bw: np.ndarray | None = None) -> Network:
    """Bandwidths (measured, else given per pair, else the TCP model), diagonal, imputed mask."""
    n = len(nodes)
    if default_bw is None:
        bw = np.empty_like(rtt)
        rows = max(1, (64 << 20) // max(1, 8 * n))  # in row blocks: no n x n float64 temporaries
        for lo in range(0, n, rows):
            bw[lo:lo + rows] = _tcp_bw(rtt[lo:lo + rows])
    else:
        bw = default_bw
        # Measured node pairs without a measured bandwidth: the TCP model of their own RTT.
        bw[pairs.a, pairs.b] = bw[pairs.b, pairs.a] = _tcp_bw(pairs.rtt_ms)
        if pair_bw is not None:
            given = np.isfinite(pair_bw)
            a, b = pairs.a[given], pairs.b[given]
            bw[a, b] = bw[b, a] = pair_bw[given]
    has_bw = np.isfinite(pairs.bw_gbps)
    a, b, value = pairs.a[has_bw], pairs.b[has_bw], pairs.bw_gbps[has_bw] * GBIT
    bw[a, b] = bw[b, a] = value
    np.fill_diagonal(bw, np.inf)
    np.logical_not(measured, out=measured)
    np.fill_diagonal(measured, False)
    return Network(nodes, rtt, bw, measured)


def roll_up_by_site(fleet: Fleet) -> Fleet:
    """The fleet with its node links replaced by site links (what ``fleet export`` writes for a
    large fleet): per pair of sites, and per site with itself, the median RTT and median
    measured bandwidth of its measured node pairs, their mean loss and summed samples. Site
    links the fleet already has are kept for site pairs no node link measured."""
    from planner.core.fleet import Site, SiteLink

    nodes = tuple(fleet.nodes)
    index = {node.id: i for i, node in enumerate(nodes)}
    names, site = site_codes(fleet)
    links = fleet.links
    if isinstance(links, LinkTable) and links.ids == [node.id for node in nodes]:
        src, dst, rtt, bw = links.src, links.dst, links.rtt_ms, links.bandwidth_gbps
        loss, samples = links.loss, links.samples
    else:
        kept = [(index[k.src], index[k.dst], k) for k in links
                if not k.imputed and k.src in index and k.dst in index and k.src != k.dst]
        src = np.array([i for i, _, _ in kept], dtype=np.int64)
        dst = np.array([j for _, j, _ in kept], dtype=np.int64)
        rtt = np.array([float(k.rtt_ms) for _, _, k in kept])
        bw = np.array([np.nan if k.bandwidth_gbps is None else float(k.bandwidth_gbps)
                       for _, _, k in kept])
        loss = np.array([float(k.loss) for _, _, k in kept])
        samples = np.array([int(k.samples) for _, _, k in kept], dtype=np.int64)
    keep = src != dst
    s_a, s_b = site[src[keep]], site[dst[keep]]
    lo, hi = np.minimum(s_a, s_b), np.maximum(s_a, s_b)
    key = lo * len(names) + hi
    order = np.argsort(key, kind="stable")
    key, rtt, bw = key[order], rtt[keep][order], bw[keep][order]
    loss, samples = loss[keep][order], samples[keep][order]
    bounds = np.flatnonzero(np.diff(key)) + 1
    rolled: dict[tuple[str, str], SiteLink] = {}
    for chunk in np.split(np.arange(len(key)), bounds):
        if not len(chunk):
            continue
        a, b = divmod(int(key[chunk[0]]), len(names))
        if not names[a] or not names[b]:
            continue   # a node with no site: nothing to roll up into
        measured_bw = bw[chunk][np.isfinite(bw[chunk]) & (bw[chunk] > 0)]
        rolled[(names[a], names[b])] = SiteLink(
            names[a], names[b], rtt_ms=float(np.median(rtt[chunk])),
            bandwidth_gbps=float(np.median(measured_bw)) if len(measured_bw) else None,
            loss=float(np.mean(loss[chunk])), samples=int(samples[chunk].sum()))
    for link in fleet.site_links:
        pair = tuple(sorted((link.src, link.dst)))
        if pair not in rolled and (link.src, link.dst) not in rolled:
            rolled[(link.src, link.dst)] = link
    declared = {s.id for s in fleet.sites}
    sites = list(fleet.sites)
    for i, node in enumerate(nodes):
        key_name = node.site_key
        if key_name and key_name not in declared:
            declared.add(key_name)
            where = node.coordinates
            sites.append(Site(key_name, *(where if where else (None, None))))
    return Fleet(nodes, (), name=fleet.name, sites=tuple(sites),
                 site_links=tuple(rolled.values()))
