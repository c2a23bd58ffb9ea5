"""The fleet as values: nodes, measured links, and the completed network the cost model reads.

``Fleet`` is what files and the store hold (sparse, possibly flawed measurements).
``complete(fleet)`` applies docs/COSTMODEL.md section 2 and returns a ``Network``: dense matrices of
RTT and bandwidth over node indices, with imputed pairs marked. Everything downstream (cost model,
search, GNN) works on node indices into a ``Network``; ids appear again only at output.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from statistics import median

import numpy as np

from hulk import geo
from planner.core import gpus as gpu_catalog

GBIT = 1e9 / 8  # bytes per second in one Gbit/s
MAX_BW_GBPS = 10.0
BW_RTT_PRODUCT = 80.0  # Gbit/s * ms: the window-limited TCP model
DEFAULT_SAME_CITY_RTT_MS = 1.0


@dataclass(frozen=True)
class Node:
    """One server."""

    id: str
    city: str | None = None
    gpus: int = gpu_catalog.DEFAULT_GPUS_PER_NODE
    gpu_name: str | None = None
    compute_capability: float | None = None
    memory_gb: float = 0.0  # total GPU memory of the server, summed over its GPUs
    latitude: float | None = None
    longitude: float | None = None
    site: str | None = None   # a city, cloud region or data centre; the city where absent

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def throughput(self) -> float:
        """thr_i in FLOP/s (docs/COSTMODEL.md section 1)."""
        return gpu_catalog.node_throughput(self.gpus, self.gpu_name, self.compute_capability)

    @cached_property
    def city_key(self) -> str | None:
        """The city used for 'same city' and geography: the gazetteer's name, else the trimmed name."""
        if not self.city or not self.city.strip():
            return None
        return geo.canonical_city(self.city) or self.city.strip()

    @cached_property
    def site_key(self) -> str | None:
        """The node's site: its ``site`` when given, else its city (``city_key``)."""
        if self.site and self.site.strip():
            return self.site.strip()
        return self.city_key

    @property
    def coordinates(self) -> tuple[float, float] | None:
        if self.latitude is not None and self.longitude is not None:
            return (self.latitude, self.longitude)
        return geo.coordinates(self.city)


@dataclass(frozen=True)
class Link:
    """A measured (or, when ``imputed``, completed) link. Direction is kept as measured."""

    src: str
    dst: str
    rtt_ms: float
    bandwidth_gbps: float | None = None
    loss: float = 0.0
    samples: int = 0
    imputed: bool = False


# Site and SiteLink are also defined by the `sites` branch, in the same shape: a merge of both
# branches keeps two copies without a conflict (checked), so keep only that branch's copy.
@dataclass(frozen=True)
class Site:
    """A place servers sit in (a city, a cloud region, a data centre), optionally located."""

    id: str
    latitude: float | None = None
    longitude: float | None = None


@dataclass(frozen=True)
class SiteLink:
    """Measured figures between two sites, standing for every pair of their servers.

    A site link from a site to itself gives the RTT between two servers of that site."""

    src: str
    dst: str
    rtt_ms: float
    bandwidth_gbps: float | None = None
    loss: float = 0.0
    samples: int = 0


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[Node, ...]
    links: tuple[Link, ...] = ()
    name: str = "default"
    sites: tuple[Site, ...] = ()
    site_links: tuple[SiteLink, ...] = ()

    def node_ids(self) -> list[str]:
        return [n.id for n in self.nodes]


def bandwidth_from_rtt(rtt_ms: np.ndarray | float) -> np.ndarray | float:
    """Window-limited TCP bandwidth in bytes/s: min(10 Gbit/s, 80 Gbit/s*ms / rtt_ms)."""
    rtt = np.asarray(rtt_ms, dtype=float)
    with np.errstate(divide="ignore"):
        gbps = np.minimum(MAX_BW_GBPS, np.where(rtt > 0, BW_RTT_PRODUCT / np.where(rtt > 0, rtt, 1.0),
                                                MAX_BW_GBPS))
    out = gbps * GBIT
    return float(out) if out.ndim == 0 else out


@dataclass
class Network:
    """The completed fleet over node indices 0..n-1.

    ``rtt_ms[i, j]``: rolling RTT (ms), 0 on the diagonal, ``inf`` between components.
    ``bw[i, j]``: bandwidth in bytes/s, ``inf`` on the diagonal (same node talks for free).
    ``imputed[i, j]``: True where the pair was completed rather than measured.
    """

    nodes: tuple[Node, ...]
    rtt_ms: np.ndarray
    bw: np.ndarray
    imputed: np.ndarray
    thr: np.ndarray = field(init=False)   # FLOP/s per node
    mem: np.ndarray = field(init=False)   # bytes per node
    index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.thr = np.array([n.throughput for n in self.nodes], dtype=float)
        # A node with no compute (no GPUs, or an unknown GPU of zero throughput) holds no training
        # state: zero memory keeps every planner from giving it layers it could never run.
        self.mem = np.array([n.memory_bytes if thr > 0 else 0.0
                             for n, thr in zip(self.nodes, self.thr)], dtype=float)
        self.index = {n.id: i for i, n in enumerate(self.nodes)}

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    def latency_s(self, i: int, j: int) -> float:
        """One-way latency a_ij in seconds."""
        return self.rtt_ms[i, j] / 2000.0

    def components(self) -> list[list[int]]:
        """Groups of node indices that can reach each other (finite RTT)."""
        seen = np.zeros(self.n, dtype=bool)
        groups = []
        finite = np.isfinite(self.rtt_ms)
        for i in range(self.n):
            if not seen[i]:
                members = np.flatnonzero(finite[i])
                seen[members] = True
                groups.append(members.tolist())
        return groups

    @classmethod
    def from_matrix(cls, nodes: tuple[Node, ...] | list[Node], rtt_ms: np.ndarray,
                    bw: np.ndarray | None = None, imputed: np.ndarray | None = None) -> "Network":
        """A network from a dense symmetric RTT matrix (generated fleets); bw from the TCP model."""
        rtt = np.array(rtt_ms, dtype=float)
        np.fill_diagonal(rtt, 0.0)
        if bw is None:
            bw = bandwidth_from_rtt(rtt)
        bw = np.array(bw, dtype=float)
        np.fill_diagonal(bw, np.inf)
        if imputed is None:
            imputed = np.zeros(rtt.shape, dtype=bool)
        return cls(tuple(nodes), rtt, bw, imputed)


def complete(fleet: Fleet) -> Network:
    """docs/COSTMODEL.md section 2: average duplicates, drop self-loops, fill same-city pairs with
    the city's median, everything else with the shortest path over measured links."""
    nodes = tuple(fleet.nodes)
    n = len(nodes)
    index = {node.id: i for i, node in enumerate(nodes)}
    rtts: dict[tuple[int, int], list[float]] = defaultdict(list)
    bws: dict[tuple[int, int], list[float]] = defaultdict(list)
    for link in fleet.links:
        if link.imputed or link.src == link.dst:
            continue
        i, j = index.get(link.src), index.get(link.dst)
        if i is None or j is None:
            continue
        key = (min(i, j), max(i, j))
        rtts[key].append(float(link.rtt_ms))
        if link.bandwidth_gbps is not None and link.bandwidth_gbps > 0:
            bws[key].append(float(link.bandwidth_gbps))

    rtt = np.full((n, n), np.inf)
    np.fill_diagonal(rtt, 0.0)
    measured = np.zeros((n, n), dtype=bool)
    for (i, j), values in rtts.items():
        rtt[i, j] = rtt[j, i] = float(np.mean(values))
        measured[i, j] = measured[j, i] = True

    # Shortest paths over measured links only (before same-city filling), as the rule says.
    missing = ~measured
    np.fill_diagonal(missing, False)
    if missing.any() and rtts:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import dijkstra

        keys = np.array(list(rtts.keys()))
        weights = rtt[keys[:, 0], keys[:, 1]]
        graph = csr_matrix((weights, (keys[:, 0], keys[:, 1])), shape=(n, n))
        sources = np.flatnonzero(missing.any(axis=1))
        relayed = dijkstra(graph, directed=False, indices=sources)
        for row, src in enumerate(sources):
            cols = missing[src]
            rtt[src, cols] = relayed[row, cols]

    # Same-city pairs without a measurement: the city's median, else the fleet's, else 1 ms.
    city = [node.city_key for node in nodes]
    by_city: dict[str, list[float]] = defaultdict(list)
    for (i, j), _ in rtts.items():
        if city[i] is not None and city[i] == city[j]:
            by_city[city[i]].append(rtt[i, j])
    all_same_city = [v for values in by_city.values() for v in values]
    fleet_median = median(all_same_city) if all_same_city else DEFAULT_SAME_CITY_RTT_MS
    members: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(city):
        if c is not None:
            members[c].append(i)
    for c, idx in members.items():
        value = median(by_city[c]) if by_city.get(c) else fleet_median
        for a in idx:
            for b in idx:
                if a != b and not measured[a, b]:
                    rtt[a, b] = value

    bw = bandwidth_from_rtt(np.where(np.isfinite(rtt), rtt, 1e18))
    bw = np.where(np.isfinite(rtt), bw, 0.0)
    for (i, j), values in bws.items():
        bw[i, j] = bw[j, i] = float(np.mean(values)) * GBIT
    np.fill_diagonal(bw, np.inf)
    imputed = ~measured
    np.fill_diagonal(imputed, False)
    return Network(nodes, rtt, bw, imputed)
