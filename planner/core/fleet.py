"""The fleet as values: nodes, measured links, and the completed network the cost model reads.

``Fleet`` is what files and the store hold (sparse, possibly flawed measurements).
``complete(fleet)`` applies docs/COSTMODEL.md section 2 and returns a ``Network``: dense matrices of
RTT and bandwidth over node indices, with imputed pairs marked. Everything downstream (cost model,
search, GNN) works on node indices into a ``Network``; ids appear again only at output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from hulk import geo
from hulk.errors import PlanningError
from hulk.validate import Bound, Invalid, node_id
from planner.core import gpus as gpu_catalog

GBIT = 1e9 / 8  # bytes per second in one Gbit/s
MAX_BW_GBPS = 10.0
BW_RTT_PRODUCT = 80.0  # Gbit/s * ms: the window-limited TCP model
DEFAULT_SAME_CITY_RTT_MS = 1.0

# The range of every number a fleet file gives, checked where the file is read. Each is wide of
# any real server or link (a rack-scale system has 72 GPUs and 14 TB; the longest RTT on Earth is
# under a second) and narrow enough that the cost model's products stay finite floats.
FLEET_BOUNDS: dict[str, Bound] = {
    "gpus": Bound(0, 1024, "GPUs", integer=True),   # 0: a server without GPUs holds no stage
    "memory_gb": Bound(0, 100_000, "GB of GPU memory"),
    "compute_capability": Bound(0, 20, "a CUDA compute capability"),
    "rtt_ms": Bound(0, 60_000, "milliseconds of RTT"),
    "bandwidth_gbps": Bound(0.001, 100_000, "Gbit/s"),
    "loss": Bound(0, 1, "a loss fraction"),
    "samples": Bound(0, 10 ** 12, "samples", integer=True),
}
# Where a site link's figures come from: measured, or written by completion (a model's
# prediction, or relay over measured RTTs and the window formula).
MEASURED, PREDICTED, FORMULA = "measured", "predicted", "formula"
SITE_LINK_SOURCES = (MEASURED, PREDICTED, FORMULA)
# Completion holds n x n matrices (RTT, bandwidth, imputed: about 14 bytes a pair at peak), so
# a fleet's size is bounded where it is read and where it is completed: twice the 10,000 servers
# the planner is built for, about 5.6 GB at the bound.
MAX_FLEET_NODES = 20_000
BYTES_PER_PAIR = 14
# Free text a fleet file gives (fleet name, city, site, gpu_name) reaches terminals and the
# dashboard: at most this many printable characters.
FLEET_TEXT_CHARS = 128


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


class LinkTable(Sequence):
    """Measured node links held as columns (what a large fleet file reads into).

    Behaves as a sequence of :class:`Link` (built on access), so code written for a tuple of links
    keeps working; ``complete`` reads the columns directly. ``src``/``dst`` index into ``ids``;
    ``bandwidth_gbps`` is NaN where none was measured.
    """

    def __init__(self, ids: Sequence[str], src: np.ndarray, dst: np.ndarray, rtt_ms: np.ndarray,
                 bandwidth_gbps: np.ndarray, loss: np.ndarray, samples: np.ndarray):
        self.ids = list(ids)
        self.src = np.asarray(src, dtype=np.int64)
        self.dst = np.asarray(dst, dtype=np.int64)
        self.rtt_ms = np.asarray(rtt_ms, dtype=float)
        self.bandwidth_gbps = np.asarray(bandwidth_gbps, dtype=float)
        self.loss = np.asarray(loss, dtype=float)
        self.samples = np.asarray(samples, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.src)

    def _link(self, k: int) -> Link:
        bw = float(self.bandwidth_gbps[k])
        return Link(self.ids[self.src[k]], self.ids[self.dst[k]], rtt_ms=float(self.rtt_ms[k]),
                    bandwidth_gbps=None if bw != bw else bw, loss=float(self.loss[k]),
                    samples=int(self.samples[k]))

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return tuple(self._link(i) for i in range(*k.indices(len(self))))
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self._link(k)

    def __iter__(self) -> Iterator[Link]:
        return (self._link(k) for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LinkTable, tuple)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"LinkTable({len(self)} links)"


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
    # A link completion wrote (``fleet complete``) is "predicted" or "formula", with the
    # conservative figures the planner uses for it: an upper RTT and a lower bandwidth.
    source: str = "measured"
    rtt_hi_ms: float | None = None
    bandwidth_lo_gbps: float | None = None
    # Where ``rtt_ms`` comes from when not from ``source``: a measured throughput whose RTT was
    # never measured (ICMP blocked, samples refused) is a measured link with a formula or
    # predicted RTT, so the throughput reaches plans and the RTT is not mistaken for measured.
    rtt_source: str | None = None

    @property
    def rtt_measured(self) -> bool:
        return (self.rtt_source or self.source) == MEASURED

    @property
    def planned_rtt_ms(self) -> float:
        """The RTT completion uses: the upper figure of an RTT not measured, where given."""
        if not self.rtt_measured and self.rtt_hi_ms is not None:
            return self.rtt_hi_ms
        return self.rtt_ms

    @property
    def planned_bandwidth_gbps(self) -> float | None:
        """The bandwidth completion uses: none for a formula link (the window formula of its
        RTT stands), the lower figure of a predicted one where given, else as measured."""
        if self.source == FORMULA:
            return None
        if self.source != MEASURED and self.bandwidth_lo_gbps is not None:
            return self.bandwidth_lo_gbps
        return self.bandwidth_gbps


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[Node, ...]
    links: tuple[Link, ...] | LinkTable = ()
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


def rtt_from_bandwidth(gbps: float) -> float:
    """The largest RTT (ms) at which the window formula gives ``gbps``: what a measured
    throughput says of an RTT never measured. Pessimistic for a link slower than the formula
    (shaped, shared), the safe side: the planner exploits optimistic errors."""
    return min(FLEET_BOUNDS["rtt_ms"].high, BW_RTT_PRODUCT / min(float(gbps), MAX_BW_GBPS))


@dataclass
class Network:
    """The completed fleet over node indices 0..n-1.

    ``rtt_ms[i, j]``: rolling RTT (ms), 0 on the diagonal, ``inf`` between components.
    ``bw[i, j]``: bandwidth in bytes/s, ``inf`` on the diagonal (same node talks for free).
    ``imputed[i, j]``: True where the pair was completed rather than measured.
    ``hop_overhead_s``: seconds every pipeline hop adds; ``micro_batch_overhead_s``: seconds
    every stage adds per micro-batch (kernel launches, framework work); ``step_overhead_s``:
    seconds every replica adds once per iteration (optimizer step, per-step framework work). All
    0 in the reference model; a calibrated network sets them (planner/core/calibration.py), and
    ``outer_sync_factor``, what a DiLoCo job's outer sync takes against its price (1 in the
    reference model).
    """

    nodes: tuple[Node, ...]
    rtt_ms: np.ndarray
    bw: np.ndarray
    imputed: np.ndarray
    hop_overhead_s: float = 0.0
    micro_batch_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    outer_sync_factor: float = 1.0
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

    def subset(self, keep) -> "Network":
        """The network of the node indices ``keep`` (renumbered 0..len(keep)-1), keeping this
        one's throughputs and overheads, so a calibrated network stays calibrated."""
        keep = np.asarray(keep, dtype=np.int64)
        grid = np.ix_(keep, keep)
        out = Network(tuple(self.nodes[i] for i in keep), self.rtt_ms[grid], self.bw[grid],
                      self.imputed[grid], hop_overhead_s=self.hop_overhead_s,
                      micro_batch_overhead_s=self.micro_batch_overhead_s,
                      step_overhead_s=self.step_overhead_s,
                      outer_sync_factor=self.outer_sync_factor)
        out.thr, out.mem = self.thr[keep], self.mem[keep]
        return out

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


def node_problem(node: Node) -> str | None:
    """``field: expected ...`` for the first field of ``node`` outside the fleet files' rules
    (the node-id rule, FLEET_BOUNDS), or None: for nodes that did not come through a reader
    (a store written before these rules)."""
    return _problem([("id", node.id, node_id)] + [
        (key, getattr(node, key), FLEET_BOUNDS[key])
        for key in ("gpus", "memory_gb", "compute_capability")])


def link_problem(link: Link) -> str | None:
    """:func:`node_problem` for a link's figures."""
    return _problem([(key, getattr(link, key), FLEET_BOUNDS[key])
                     for key in ("rtt_ms", "bandwidth_gbps", "loss", "samples")])


def _problem(checks) -> str | None:
    for key, value, check in checks:
        try:
            if value is not None:
                check(value)
        except Invalid as bad:
            return f"{key}: {bad}"
    return None


def check_fleet_size(count: int) -> None:
    """PlanningError when ``count`` servers are more than completion can hold."""
    if count > MAX_FLEET_NODES:
        need = count * count * BYTES_PER_PAIR / 2 ** 30
        raise PlanningError(f"the fleet has {count:,} servers; the planner completes at most "
                            f"{MAX_FLEET_NODES:,} (its n x n matrices would need about "
                            f"{need:,.0f} GiB)")


def complete(fleet: Fleet, prediction=None) -> Network:
    """docs/COSTMODEL.md section 2: average duplicates, drop self-loops, give pairs between two
    sites with a site link that link's figures, fill same-site pairs with the site's median and
    everything else with the shortest path (planner/core/sites.py does the work).

    ``prediction`` (a ``planner.linkpred.graph.LinkPrediction`` over the fleet's sites, or None):
    pairs of two sites no measurement covers take its conservative figures where it predicted
    them (planner.linkpred.complete.predict_fleet_links makes one)."""
    from planner.core.sites import complete_fleet

    check_fleet_size(len(fleet.nodes))

    return complete_fleet(fleet, prediction)
