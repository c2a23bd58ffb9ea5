"""Step 1 of the search: locality clusters and the order in which to walk them.

Nodes of the same city, or joined by links of at most ``CLUSTER_RTT_MS``, form a cluster (single
linkage). Clusters are walked along an open path (nearest neighbour, smallest largest hop), and
each cluster's nodes fastest first, so that contiguous runs of nodes stay close together.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from planner.core.fleet import Network

CLUSTER_RTT_MS = 8.0          # 80 Gbit/s*ms / 10 Gbit/s: beyond this the TCP model loses bandwidth


def cluster_labels(rtt_ms: np.ndarray, threshold_ms: float = CLUSTER_RTT_MS,
                   cities: list | None = None) -> np.ndarray:
    """Single-linkage clusters: nodes joined by an RTT of at most ``threshold_ms`` or by the same
    city (when ``cities`` is given; None entries join nothing). Vectorised."""
    n = rtt_ms.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rows, cols = np.nonzero(rtt_ms <= threshold_ms)
    close = csr_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(n, n))
    if cities is not None:
        names = {c: k for k, c in enumerate(sorted({c for c in cities if c is not None}))}
        if names:
            code = np.array([names[c] if c is not None else -1 for c in cities])
            rows = np.flatnonzero(code >= 0)
            # Join every city member to the city's first member (a star keeps this O(n)).
            first = {}
            for i in rows:
                first.setdefault(code[i], i)
            heads = np.array([first[code[i]] for i in rows])
            star = csr_matrix((np.ones(rows.size, dtype=bool), (rows, heads)), shape=(n, n))
            close = close + star
    _, labels = connected_components(close, directed=False)
    return labels.astype(np.int64)


def network_clusters(net: Network, threshold_ms: float = CLUSTER_RTT_MS) -> np.ndarray:
    """Locality cluster per node of ``net``: same city, or linked within ``threshold_ms``."""
    return cluster_labels(net.rtt_ms, threshold_ms, [node.city_key for node in net.nodes])


def open_path(dist: np.ndarray, starts: list[int] | None = None) -> list[int]:
    """An open path through all points: nearest neighbour from several starts, the one with the
    smallest (largest hop, total length) wins. ``dist`` is a square matrix (may hold inf)."""
    c = dist.shape[0]
    if c <= 1:
        return list(range(c))
    d = np.where(np.isfinite(dist), dist, 1e12)
    if starts is None:
        starts = list(range(c)) if c <= 40 else [int(np.argmin(d.sum(axis=1))),
                                                  int(np.argmax(d.sum(axis=1)))]
    best, best_key = None, None
    for s in starts:
        seen = np.zeros(c, dtype=bool)
        path = [s]
        seen[s] = True
        worst = total = 0.0
        for _ in range(c - 1):
            row = np.where(seen, np.inf, d[path[-1]])
            nxt = int(np.argmin(row))
            worst = max(worst, row[nxt])
            total += row[nxt]
            path.append(nxt)
            seen[nxt] = True
        key = (worst, total)
        if best_key is None or key < best_key:
            best, best_key = path, key
    return best


def ordered_clusters(net: Network, nodes: np.ndarray, labels: np.ndarray,
                     from_biggest: bool = False) -> list[np.ndarray]:
    """Clusters of ``nodes`` (given their cluster labels) in open-path order, each cluster's
    nodes fastest first (then most memory, then index). ``from_biggest``: the path starts at the
    cluster with the most throughput (nearest neighbour from there)."""
    uniq = np.unique(labels)
    clusters = []
    for c in uniq:
        members = nodes[labels == c]
        order = np.lexsort((members, -net.mem[members], -net.thr[members]))
        clusters.append(members[order])
    if len(clusters) <= 1:
        return clusters
    reps = np.array([cl[0] for cl in clusters])
    dist = net.rtt_ms[np.ix_(reps, reps)]
    starts = None
    if from_biggest:
        thr = np.array([net.thr[cl].sum() for cl in clusters])
        starts = [int(np.lexsort((np.arange(thr.size), -thr))[0])]
    return [clusters[i] for i in open_path(dist, starts)]


def cluster_distance(net: Network, clusters: list[np.ndarray]) -> np.ndarray:
    """C x C RTT between clusters: the closest pair (exact for small groups, else between the
    clusters' fastest nodes, to keep memory linear)."""
    reps = np.array([cl[0] for cl in clusters])
    sizes = np.array([cl.size for cl in clusters])
    if sizes.sum() > 600:
        return net.rtt_ms[np.ix_(reps, reps)]
    allnodes = np.concatenate(clusters)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    sub = net.rtt_ms[np.ix_(allnodes, allnodes)]
    dist = np.minimum.reduceat(np.minimum.reduceat(sub, starts, axis=0), starts, axis=1)
    np.fill_diagonal(dist, 0.0)
    return dist

