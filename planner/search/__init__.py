"""The Hulk planner (``--method search``): all jobs at once on disjoint node groups.

Pipeline of the planner, every step judged by the reference cost model (costmodel.estimate):

1. **Locality clusters.** Nodes of the same city, or joined by links of at most
   ``CLUSTER_RTT_MS`` (the RTT up to which the TCP model still gives the full 10 Gbit/s), form a
   cluster (single linkage). Rings and chains
   that stay inside clusters are cheap; every WAN hop is expensive: a pipeline pays
   ``(M - 1) * max(x)`` with ``x`` including ``2 (a + A / bw)`` per hop, a data-parallel ring
   pays ``2 (D - 1) (a_max + S / (D bw_min))`` over its worst link.
2. **Heuristic class scores** (:func:`heuristic_scores`): nodes in locality order (component,
   clusters along an open path, fastest first) cut into contiguous segments, one per job, sized
   by the job's share of all FLOPs so that jobs finish together.
3. **Algorithm 1** (planner.search.algorithm1): feasible groups, merges and waiting phases.
4. **Per group** (:func:`best_placement`): which nodes (sets of clusters grown from the fastest
   or roomiest cluster by nearest neighbour; far clusters are left idle when they do not pay),
   K stages x D replicas, arrangement of the grid (stage groups of D similar nodes inside a
   cluster, stage groups ordered along an open path over clusters, bottleneck matching of
   replicas between consecutive stages), layer ranges balanced by throughput within memory (with
   a cap on the largest stage's all-reduce where that pays), micro-batch size from 1, 2, 4, 8
   and the job's own; then a local search that drops stage groups / whole clusters when that
   makes the job faster.
5. **Across groups**: moves of free nodes and of cluster chunks (all, 1/2, 1/4, 1/8) from other
   jobs (the nearest ones and those with most slack, compensated with free nodes) or whole-group
   exchanges to the critical job, accepted when they lower the phase's makespan, then free nodes
   for the other jobs (sum of completion times); later-phase jobs are pulled into an earlier
   phase when free nodes allow it.
6. **Growing the bottleneck** (:meth:`_Planner.grow_bottleneck`): the job that sets the
   makespan is re-solved over a dense range of replica counts (:func:`_deep_solve`, stage groups
   per cluster and per city, trimmed to the fastest rows when extra rows only add hops, bubble
   and all-reduce) on its own nodes, plus the idle nodes of its clusters, plus those of the 1, 2
   and 4 nearest clusters, or on a larger idle cluster; failing that, a job sharing its clusters
   moves to idle clusters and leaves it the nodes. Each step is kept only when the makespan drops.

Determinism: all choices depend only on the inputs and ``seed`` (ties broken by node index, the
seeded generator only orders equal candidates). The amount of work is set by ``max_rounds`` and
``effort``; ``budget_s`` is only a wall-clock safety cap. When the cap is hit the plan is still
valid but may differ between runs, and a note says so.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from hulk.errors import PlanningError
from planner.search import algorithm1 as alg1
from planner.core.costmodel import INFEASIBLE, Estimate, Placement, Stage, estimate
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan

CLUSTER_RTT_MS = 8.0          # 80 Gbit/s*ms / 10 Gbit/s: beyond this the TCP model loses bandwidth
MICRO_BATCH_CANDIDATES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Effort:
    """How hard best_placement looks. ``replica_options``: how many values of D it tries;
    ``prune_passes``: rounds of dropping stage groups; ``keep``: configurations refined;
    ``seeds``: seed clusters grown into candidate sets; ``finalists``: sets given every (D, b);
    ``screen_only``: finalists keep only the screening (D, b) values (used inside moves)."""

    replica_options: int
    prune_passes: int
    keep: int
    seeds: int
    finalists: int
    screen_only: bool = False
    patience: int = 3


EFFORTS = {
    "fast": Effort(replica_options=5, prune_passes=2, keep=1, seeds=1, finalists=1, screen_only=True),
    "normal": Effort(replica_options=8, prune_passes=4, keep=2, seeds=3, finalists=2),
    "full": Effort(replica_options=14, prune_passes=8, keep=3, seeds=5, finalists=4),
}


# --------------------------------------------------------------------------------------------
# Locality

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


def _open_path(dist: np.ndarray, starts: list[int] | None = None) -> list[int]:
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


def _node_order(net: Network, nodes: np.ndarray, labels: np.ndarray,
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
    return [clusters[i] for i in _open_path(dist, starts)]


# --------------------------------------------------------------------------------------------
# One job on one group

def _transfer_cost(net: Network, src: np.ndarray, dst: np.ndarray, act: float) -> np.ndarray:
    """Pipeline hop cost 2 (a + A / bw) for all pairs src x dst."""
    rtt = net.rtt_ms[np.ix_(src, dst)]
    bw = net.bw[np.ix_(src, dst)]
    return 2.0 * (rtt / 2000.0 + act / bw)


def _match_rows(net: Network, grid: np.ndarray, act: float) -> np.ndarray:
    """Reorder each stage's nodes so replica p's hop k -> k+1 is a bottleneck-minded matching.

    Only hops that can set the pipeline's largest transfer matter for (M - 1) * max(x): a
    boundary whose worst pairing is no dearer than the unavoidable largest hop of the whole
    chain (the largest lower bound of any boundary's bottleneck matching), or whose pairings are
    all within 5% of each other, is left as it is."""
    k, d = grid.shape
    if d == 1 or k == 1:
        return grid
    src, dst = grid[:-1, :, None], grid[1:, None, :]
    cost = 2.0 * (net.rtt_ms[src, dst] / 2000.0 + act / net.bw[src, dst])   # (K-1, D, D)
    cost = np.where(np.isfinite(cost), cost, 1e12)
    hi, lo = cost.max(axis=(1, 2)), cost.min(axis=(1, 2))
    bound = np.maximum(cost.min(axis=2).max(axis=1), cost.min(axis=1).max(axis=1))
    todo = np.flatnonzero((hi > lo * 1.05) & (hi > bound.max() * (1 + 1e-9)))
    if todo.size == 0:
        return grid
    grid = grid.copy()
    perm = np.tile(np.arange(d), (k, 1))
    for s in todo + 1:
        c = cost[s - 1][perm[s - 1]]           # rows: row s-1 as now ordered; cols: row s as built
        scaled = (c / c.max()) ** 4  # sum of 4th powers: close to bottleneck assignment
        _, cols = linear_sum_assignment(scaled)
        perm[s] = cols
        grid[s] = grid[s][cols]
    return grid


def _balance_layers(job: Job, stage_thr: np.ndarray, caps: np.ndarray) -> np.ndarray | None:
    """Layers per stage minimising max(l_k / thr_k) with 1 <= l_k <= cap_k, sum = L (greedy
    water-filling, exact for this objective). None when memory cannot hold the model."""
    k = stage_thr.size
    if k > job.layers or (caps < 1).any() or caps.sum() < job.layers:
        return None
    layers = np.ones(k, dtype=np.int64)
    left = job.layers - k
    if left == 0:
        return layers
    # Start from the continuous optimum rounded down, then fill greedily.
    share = np.minimum(caps, np.maximum(1, np.floor(job.layers * stage_thr / stage_thr.sum())))
    share = share.astype(np.int64)
    if share.sum() <= job.layers:
        layers = share
    left = job.layers - int(layers.sum())
    heap = [((layers[i] + 1) / stage_thr[i], i) for i in range(k) if layers[i] < caps[i]]
    heapq.heapify(heap)
    while left > 0:
        if not heap:
            return None
        _, i = heapq.heappop(heap)
        layers[i] += 1
        left -= 1
        if layers[i] < caps[i]:
            heapq.heappush(heap, ((layers[i] + 1) / stage_thr[i], i))
    return layers


def _placement_from_grid(job: Job, net: Network, grid: np.ndarray, b: int,
                         phase: int = 0) -> Placement | None:
    """Layers for a K x D grid (dropping stages that cannot hold a layer); None if infeasible."""
    d = grid.shape[1]
    m = math.ceil(job.global_batch / d / b)
    while grid.shape[0] > 0:
        k = grid.shape[0]
        u = job.state_bytes / job.layers + job.activation_bytes(b) * min(m, k, job.layers)
        caps = np.floor(net.mem[grid].min(axis=1) / u).astype(np.int64)
        if (caps < 1).any():
            grid = grid[caps >= 1]
            continue
        if k > job.layers:
            # Too many stages: keep the fastest stage groups, or the roomiest if those lack memory.
            stage_thr = net.thr[grid].min(axis=1)
            keep = np.argsort(-stage_thr, kind="stable")[:job.layers]
            if caps[keep].sum() < job.layers:
                keep = np.argsort(-caps, kind="stable")[:job.layers]
            grid = grid[np.sort(keep)]
            continue
        stage_thr = net.thr[grid].min(axis=1)
        layers = _balance_layers(job, stage_thr, caps)
        if layers is None:
            return None
        # A one-layer stage that is still the slowest is a bottleneck no layer split can fix:
        # drop it when the others can hold the model and that lowers the slowest stage's time.
        if k > 1:
            load = layers / stage_thr
            worst = int(np.argmax(load))
            if layers[worst] == 1:
                rest = np.delete(np.arange(k), worst)
                alt = _balance_layers(job, stage_thr[rest], caps[rest])
                if alt is not None and (alt / stage_thr[rest]).max() < load[worst] * (1 - 1e-9):
                    grid = grid[rest]
                    continue
        if d > 1:
            layers = _trade_allreduce(job, net, grid, b, m, stage_thr, caps, layers)
        bounds = np.concatenate([[0], np.cumsum(layers)])
        stages = tuple(Stage(int(bounds[s]), int(bounds[s + 1]), tuple(int(i) for i in grid[s]))
                       for s in range(k))
        return Placement(job, stages, b, phase)
    return None


def _trade_allreduce(job: Job, net: Network, grid: np.ndarray, b: int, m: int,
                     stage_thr: np.ndarray, caps: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """Throughput-balanced layers can give a fast stage so many layers that its all-reduce
    (which grows with its layers) dominates. Try caps on every stage's all-reduce time and keep
    the split with the lowest approximate iteration time (pipeline + slowest all-reduce)."""
    k, d = grid.shape
    ring_next = np.roll(grid, -1, axis=1)
    a_max = (net.rtt_ms[grid, ring_next] / 2000.0).max(axis=1)
    bw_min = net.bw[grid, ring_next].min(axis=1)
    per_layer_ar = 2.0 * (d - 1) * (2.0 * job.params / job.layers) / (d * bw_min)   # s per layer
    base_ar = 2.0 * (d - 1) * a_max
    f = job.flops_per_layer(b)
    if k > 1:
        src, dst = grid[:-1], grid[1:]
        hops = (2.0 * (net.rtt_ms[src, dst] / 2000.0 + job.activation_bytes(b) / net.bw[src, dst])).max(axis=1)
        hop_max, hop_sum = float(hops.max()), float(hops.sum())
    else:
        hop_max = hop_sum = 0.0

    def approx(lay: np.ndarray) -> float:
        c = f * lay / stage_thr
        return (float(c.sum()) + hop_sum + (m - 1) * max(float(c.max()), hop_max)
                + float((base_ar + per_layer_ar * lay).max()))

    best, best_t = layers, approx(layers)
    top = float((base_ar + per_layer_ar * layers).max())
    for frac in (0.85, 0.7, 0.55, 0.4, 0.3):
        limit = top * frac
        ar_cap = np.floor((limit - base_ar) / per_layer_ar).astype(np.int64)
        new_caps = np.minimum(caps, ar_cap)
        if (new_caps < 1).any() or new_caps.sum() < job.layers:
            break
        alt = _balance_layers(job, stage_thr, new_caps)
        if alt is None:
            break
        t = approx(alt)
        if t < best_t:
            best, best_t = alt, t
    return best


def _grid(net: Network, clusters: list[np.ndarray], d: int, carry_over: bool = True
          ) -> np.ndarray | None:
    """Stage groups of ``d`` nodes: chunks of each cluster (fastest together), clusters in path
    order; leftovers carried into the next cluster's first chunk, or dropped (rings that cross
    a WAN link are slow)."""
    rows = []
    carry = np.zeros(0, dtype=np.int64)
    for cl in clusters:
        pool = np.concatenate([carry, cl]) if carry_over else cl
        full = pool.size // d
        if full:
            rows.append(pool[:full * d].reshape(full, d))
        carry = pool[full * d:]
    if not rows:
        return None
    return np.concatenate(rows, axis=0)


def _replica_candidates(job: Job, net: Network, nodes: np.ndarray, clusters: list[np.ndarray],
                        effort: Effort) -> list[int]:
    n = nodes.size
    max_d = max(1, min(n, int(net.mem[nodes].sum() // job.state_bytes), job.global_batch))
    base = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    sizes = sorted({cl.size for cl in clusters})
    cands = sorted({x for x in base + sizes + [n] if 1 <= x <= max_d})
    if len(cands) > effort.replica_options:
        # Keep small values (pipelines), cluster sizes and a log-spread of the rest.
        pick = set(cands[:3]) | {s for s in sizes if s <= max_d}
        spread = np.unique(np.geomspace(1, len(cands), effort.replica_options).astype(int) - 1)
        pick |= {cands[i] for i in spread}
        cands = sorted(pick)
    return cands


def _micro_batches(job: Job, d: int) -> list[int]:
    per_replica = math.ceil(job.global_batch / d)
    return sorted({b for b in MICRO_BATCH_CANDIDATES + (job.micro_batch,) if 1 <= b <= per_replica})


def _evaluate(job: Job, net: Network, grid: np.ndarray, b: int, trim: bool = False
              ) -> tuple[Placement | None, Estimate]:
    """Match, balance and judge a grid; ``trim``: also try keeping only its fastest rows."""
    best: tuple[Placement | None, Estimate] = (None, INFEASIBLE)
    for g in (_trimmed_grids(job, net, grid, b) if trim else [grid]):
        g = _match_rows(net, g, job.activation_bytes(b))
        placement = _placement_from_grid(job, net, g, b)
        if placement is None:
            continue
        est = estimate(placement, net)
        if est.feasible and (best[0] is None
                             or est.iteration_s < best[1].iteration_s * (1 - 1e-12)):
            best = (placement, est)
    return best


TRIM_FRACTIONS = (0.85, 0.7, 0.55, 0.4, 0.25, 0.12)


def _trimmed_grids(job: Job, net: Network, grid: np.ndarray, b: int) -> list[np.ndarray]:
    """The grid itself and, when the cost model's formula says it is faster, the grid keeping
    only its fastest stage groups (rows, in their order). Using every row is often slower: a
    slow row still needs a whole layer and sets max(x), integer layers leave the longest stage
    with one layer more than the others, and every extra stage adds to the bubble. Rows are
    scored with the section-4 formula on the unmatched grid (matching only lowers hops)."""
    k, d = grid.shape
    if k <= 2:
        return [grid]
    m = math.ceil(job.global_batch / d / b)
    f = job.flops_per_layer(b)
    act = job.activation_bytes(b)
    row_thr = net.thr[grid].min(axis=1)
    row_mem = net.mem[grid].min(axis=1)
    if d > 1:
        ring_next = np.roll(grid, -1, axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            a_max = (net.rtt_ms[grid, ring_next] / 2000.0).max(axis=1)
            bw_min = net.bw[grid, ring_next].min(axis=1)
            ar_per_layer = 2.0 * (d - 1) * (2.0 * job.params / job.layers) / (d * bw_min)
        ar_base = 2.0 * (d - 1) * a_max
    fastest = np.lexsort((np.arange(k), -row_thr))
    sizes = sorted({k} | {max(1, int(round(k * x))) for x in TRIM_FRACTIONS}
                   | {min(k, job.layers)}, reverse=True)

    def approx(rows: np.ndarray) -> float:
        kk = rows.size
        u = job.state_bytes / job.layers + act * min(m, kk, job.layers)
        caps = np.floor(row_mem[rows] / u).astype(np.int64)
        if (caps < 1).any() or kk > job.layers:
            return math.inf
        layers = _balance_layers(job, row_thr[rows], caps)
        if layers is None:
            return math.inf
        c = f * layers / row_thr[rows]
        if kk > 1:
            src, dst = grid[rows[:-1]], grid[rows[1:]]
            with np.errstate(divide="ignore", invalid="ignore"):
                hop = (2.0 * (net.rtt_ms[src, dst] / 2000.0 + act / net.bw[src, dst])).max(axis=1)
            hop_sum, hop_max = float(hop.sum()), float(hop.max())
        else:
            hop_sum = hop_max = 0.0
        t = float(c.sum()) + hop_sum + (m - 1) * max(float(c.max()), hop_max)
        if d > 1:
            t += float((ar_base[rows] + ar_per_layer[rows] * layers).max())
        return t if math.isfinite(t) else math.inf

    full_t = approx(np.arange(k))
    best_t, best_rows = full_t, None
    for size in sizes:
        if size >= k:
            continue
        rows = np.sort(fastest[:size])
        t = approx(rows)
        if t < best_t * (1 - 1e-9):
            best_t, best_rows = t, rows
    if best_rows is None:
        return [grid]
    return [grid, grid[best_rows]]


def _prune(job: Job, net: Network, placement: Placement, est: Estimate, passes: int,
           labels_of: dict[int, int], trim: bool = False) -> tuple[Placement, Estimate]:
    """Local search over stage groups: drop a whole cluster's stages, the slowest stage, or the
    first/last stage, while that shortens the iteration."""
    b = placement.micro_batch
    for _ in range(passes):
        grid = placement.node_matrix()
        k = grid.shape[0]
        if k <= 1:
            break
        cands: list[np.ndarray] = []
        row_cluster = np.array([labels_of.get(int(r[0]), -1) for r in grid])
        for c in np.unique(row_cluster):
            mask = row_cluster != c
            if mask.any() and not mask.all():
                cands.append(mask)
        slow = int(np.argmin(net.thr[grid].min(axis=1)))
        for r in {slow, 0, k - 1}:
            mask = np.ones(k, dtype=bool)
            mask[r] = False
            cands.append(mask)
        best = (placement, est)
        for mask in cands:
            p, e = _evaluate(job, net, grid[mask], b, trim)
            if p is not None and e.iteration_s < best[1].iteration_s * (1 - 1e-9):
                best = (p, e)
        if best[0] is placement:
            break
        placement, est = best
    return placement, est


def _cluster_distance(net: Network, clusters: list[np.ndarray]) -> np.ndarray:
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


def _growth_sets(job: Job, net: Network, clusters: list[np.ndarray], dist: np.ndarray,
                 seeds: int):
    """Cluster sets to try: from each seed cluster (most throughput, most memory), add the
    nearest cluster one at a time; every prefix that can hold the model is a candidate."""
    c = len(clusters)
    thr = np.array([net.thr[cl].sum() for cl in clusters])
    mem = np.array([net.mem[cl].sum() for cl in clusters])
    order = list(np.lexsort((np.arange(c), -thr)))
    seed_list = order[:seeds]
    roomiest = int(np.lexsort((np.arange(c), -mem))[0])
    if roomiest not in seed_list:
        seed_list.append(roomiest)
    seen: set[frozenset] = set()
    for s in seed_list:
        if not np.isfinite(dist[s]).any():
            continue
        chosen = [int(s)]
        near = dist[s].astype(float).copy()
        while True:
            key = frozenset(chosen)
            if key not in seen and alg1.fits(job, net, np.concatenate([clusters[i] for i in chosen])):
                seen.add(key)
                stop = yield s, list(chosen)
                if stop:
                    break
            if len(chosen) == c:
                break
            near[chosen] = np.inf
            if not np.isfinite(near).any():
                break
            best = np.flatnonzero(near == near.min())
            nxt = int(best[np.argmax(thr[best])])
            chosen.append(nxt)
            near = np.minimum(near, dist[nxt])


def _configs_for(job: Job, net: Network, nodes: np.ndarray, clusters: list[np.ndarray],
                 effort: Effort, hint: tuple[int, int] | None, screening: bool) -> list[tuple[int, int]]:
    n = nodes.size
    if screening:
        big = max(cl.size for cl in clusters)
        ds = {1, 2, big}
        bs = {job.micro_batch}
        if hint is not None:
            d0 = hint[0]
            ds |= {d0 // 2, d0 - 1, d0, d0 + 1, d0 + 2, 2 * d0}
            bs |= {hint[1]}
        return sorted((d, b) for d in ds if 1 <= d <= n for b in bs if b in _micro_batches(job, d))
    configs = [(d, b) for d in _replica_candidates(job, net, nodes, clusters, effort)
               for b in _micro_batches(job, d)]
    if hint is not None:
        d0, b0 = hint
        for d in (d0 // 2, d0 - 1, d0, d0 + 1, d0 * 2):
            if 1 <= d <= n:
                configs += [(d, b) for b in (b0 // 2, b0, b0 * 2) if b in _micro_batches(job, d)]
    return sorted(set(configs))


def _try_configs(job: Job, net: Network, clusters: list[np.ndarray], configs,
                 trim: bool = False) -> list:
    results = []
    for d, b in configs:
        grids = [_grid(net, clusters, d, True)]
        if d > 1 and len(clusters) > 1:
            grids.append(_grid(net, clusters, d, False))
        for grid in grids:
            if grid is None:
                continue
            p, e = _evaluate(job, net, grid, b, trim)
            if p is not None:
                results.append((e.iteration_s, d, b, p, e))
    results.sort(key=lambda r: (r[0], r[1], r[2]))
    return results


def _solve(job: Job, net: Network, nodes: np.ndarray, effort: Effort,
           hint: tuple[int, int] | None = None, labels: np.ndarray | None = None
           ) -> tuple[Placement | None, Estimate]:
    """Best placement of ``job`` on ``nodes`` (may use a subset); (None, INFEASIBLE) if none.

    1. screening: for every growth set of clusters (:func:`_growth_sets`), a few (D, b);
    2. the best ``effort.finalists`` sets get every (D, b) candidate;
    3. the best ``effort.keep`` configurations get the stage-dropping local search."""
    nodes = np.unique(np.asarray(nodes, dtype=np.int64))
    if nodes.size == 0:
        return None, INFEASIBLE
    if labels is None:
        labels = cluster_labels(net.rtt_ms[np.ix_(nodes, nodes)],
                                cities=[net.nodes[i].city_key for i in nodes])
    clusters = _node_order(net, nodes, labels)
    dist = _cluster_distance(net, clusters)
    screened = []
    gen = _growth_sets(job, net, clusters, dist, effort.seeds)
    stop = False
    seed_best: dict[int, tuple[float, int]] = {}   # seed -> (best time, prefixes since it)
    while True:
        try:
            seed, chosen = gen.send(stop) if screened or stop else next(gen)
        except StopIteration:
            break
        path = [chosen[i] for i in _open_path(dist[np.ix_(chosen, chosen)])]
        sub = [clusters[i] for i in path]
        sub_nodes = np.concatenate(sub)
        res = _try_configs(job, net, sub, _configs_for(job, net, sub_nodes, sub, effort, hint, True))
        t = res[0][0] if res else math.inf
        if res:
            screened.append((t, len(screened), sub, sub_nodes, res))
        best_t, since = seed_best.get(seed, (math.inf, 0))
        if t < best_t * (1 - 1e-9):
            seed_best[seed] = (t, 0)
            stop = False
        else:
            seed_best[seed] = (best_t, since + 1)
            stop = since + 1 >= effort.patience
    if not screened:
        # Screening configurations may all miss memory; try every configuration on everything.
        sub_nodes = np.concatenate(clusters)
        res = _try_configs(job, net, clusters,
                           _configs_for(job, net, sub_nodes, clusters, effort, hint, False))
        if not res:
            return None, INFEASIBLE
        screened.append((res[0][0], 0, clusters, sub_nodes, res))
    screened.sort(key=lambda r: (r[0], r[1]))
    results = []
    for _, _, sub, sub_nodes, res in screened[:effort.finalists]:
        results += res
        if effort.finalists > 0 and not effort.screen_only:
            results += _try_configs(job, net, sub,
                                    _configs_for(job, net, sub_nodes, sub, effort, hint, False))
    results.sort(key=lambda r: (r[0], r[1], r[2]))
    labels_of = {int(i): ci for ci, cl in enumerate(clusters) for i in cl}
    best: tuple[Placement | None, Estimate] = (None, INFEASIBLE)
    for _, _, _, p, e in results[:effort.keep]:
        p, e = _prune(job, net, p, e, effort.prune_passes, labels_of)
        if best[0] is None or e.iteration_s < best[1].iteration_s:
            best = (p, e)
    return best


GROW_ROUNDS = 6
CITY_SPLIT_MIN_NODES = 64   # smaller pools: rings are short, the latency term is small
RELOCATE_NEIGHBOURS = 3     # jobs sharing the bottleneck's clusters that may move out
MIGRATE_CLUSTERS = 2        # larger idle clusters the bottleneck job may move to
RELOCATE_HOMES = 3          # roomiest idle clusters tried as their new home
DEEP_REPLICAS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128,
                 160, 192, 256)


def _deep_solve(job: Job, net: Network, nodes: np.ndarray, labels: np.ndarray,
                hint: tuple[int, int] | None = None) -> tuple[Placement | None, Estimate]:
    """Best placement of ``job`` on all of ``nodes`` over a dense range of replica counts and
    every micro-batch size (stage groups chunked per cluster, rows trimmed to the fastest by
    :func:`_evaluate`), the best few refined by :func:`_prune`."""
    nodes = np.unique(np.asarray(nodes, dtype=np.int64))
    if nodes.size == 0 or not alg1.fits(job, net, nodes):
        return None, INFEASIBLE
    clusters = _node_order(net, nodes, labels if labels.size == nodes.size else
                           cluster_labels(net.rtt_ms[np.ix_(nodes, nodes)],
                                          cities=[net.nodes[i].city_key for i in nodes]))
    max_d = max(1, min(nodes.size, int(net.mem[nodes].sum() // job.state_bytes), job.global_batch))
    ds = {d for d in DEEP_REPLICAS if d <= max_d} | {cl.size for cl in clusters if cl.size <= max_d}
    if hint is not None:
        ds |= {d for d in (hint[0] - 1, hint[0], hint[0] + 1) if 1 <= d <= max_d}
    configs = [(d, b) for d in sorted(ds) for b in _micro_batches(job, d)]
    results = _try_configs(job, net, clusters, configs, trim=True)
    # Stage groups inside one city: a ring pays 2 (D - 1) a_max, so for small models the
    # latency of its worst link matters as much as bandwidth, and a locality cluster may join
    # several cities a few ms apart.
    names = {c: k for k, c in enumerate(sorted({str(net.nodes[i].city_key) for i in nodes}))}
    if len(names) > len(clusters) and nodes.size >= CITY_SPLIT_MIN_NODES:
        city = np.array([names[str(net.nodes[i].city_key)] for i in nodes])
        by_city = _node_order(net, nodes, city)
        results += _try_configs(job, net, by_city, configs, trim=True)
        results.sort(key=lambda r: (r[0], r[1], r[2]))
    if not results:
        return None, INFEASIBLE
    labels_of = {int(i): ci for ci, cl in enumerate(clusters) for i in cl}
    best: tuple[Placement | None, Estimate] = (None, INFEASIBLE)
    for _, _, _, p, e in results[:3]:
        p, e = _prune(job, net, p, e, 4, labels_of, trim=True)
        if best[0] is None or e.iteration_s < best[1].iteration_s:
            best = (p, e)
    return best


def best_placement(job: Job, nodes, net: Network, *, rng: np.random.Generator | None = None,
                   effort: str = "normal") -> tuple[Placement, Estimate]:
    """The best configuration of ``job`` on the node group ``nodes`` that this search finds:
    which of the nodes to use, K stages x D replicas, the grid arrangement, layer ranges and
    micro-batch size. Raises PlanningError when no valid placement exists on these nodes.
    ``rng`` is accepted for interface stability; the search is deterministic."""
    del rng
    p, e = _solve(job, net, np.asarray(list(nodes), dtype=np.int64), EFFORTS[effort])
    if p is None:
        raise PlanningError(f"job {job.name} has no valid placement on the {len(list(nodes))} "
                            f"given nodes (not enough memory)")
    return p, e


# --------------------------------------------------------------------------------------------
# All jobs

def heuristic_scores(jobs: list[Job], net: Network, *, labels: np.ndarray | None = None,
                     components: np.ndarray | None = None) -> np.ndarray:
    """Class scores (n x (jobs + 1)) for Algorithm 1: nodes in locality order, cut into one
    contiguous segment per job sized by its share of all FLOPs (at least what its memory needs);
    the biggest job takes the first segment."""
    n, num = net.n, len(jobs)
    scores = np.zeros((n, num + 1))
    if num == 0 or n == 0:
        scores[:, -1] = 1.0
        return scores
    if components is None:
        components = alg1.component_labels(net)
    if labels is None:
        labels = network_clusters(net)
    order_parts = []
    comps = sorted(np.unique(components), key=lambda c: -net.thr[components == c].sum())
    for c in comps:
        members = np.flatnonzero(components == c)
        for cl in _node_order(net, members, labels[members], from_biggest=True):
            order_parts.append(cl)
    order = np.concatenate(order_parts)
    flops = np.array([j.total_flops for j in jobs])
    total_thr = float(net.thr[order].sum())
    mean_mem = float(net.mem[order].mean())
    mean_thr = total_thr / order.size
    # Throughput a job needs just to hold its model (nodes of average memory), with slack.
    need = np.array([alg1.memory_threshold(j, min(j.layers, 16)) / mean_mem * mean_thr * 1.3
                     for j in jobs])
    target = flops / flops.sum() * total_thr
    for _ in range(20):  # raise jobs to their need, take it proportionally from the others
        low = target < need
        if not low.any():
            break
        extra = float((need[low] - target[low]).sum())
        target[low] = need[low]
        rich = ~low
        if not rich.any() or target[rich].sum() <= extra:
            break
        target[rich] -= extra * target[rich] / target[rich].sum()
    jobs_order = sorted(range(num), key=lambda j: (-flops[j], j))
    pos = 0
    cum_all = np.concatenate([[0.0], np.cumsum(net.thr[order])])
    for rank, j in enumerate(jobs_order):
        if pos >= n:
            break
        rest = jobs_order[rank + 1:]
        if not rest:
            take = n - pos
        else:
            want = cum_all[pos] + target[j]
            take = max(1, int(np.searchsorted(cum_all, want * (1 - 1e-12))) - pos)
            while take < n - pos and not alg1.fits(jobs[j], net, order[pos:pos + take]):
                take = max(take + 1, int(take * 1.2))
            # Leave enough of the following nodes for the remaining jobs to fit.
            rest_jobs = [jobs[r] for r in rest]
            if not _fit_all(rest_jobs, net, order[pos + take:]):
                lo, hi = 1, take
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if _fit_all(rest_jobs, net, order[pos + mid:]):
                        lo = mid
                    else:
                        hi = mid - 1
                take = lo
        scores[order[pos:pos + take], j] = 1.0
        pos += take
    return scores


def _min_prefix(job: Job, net: Network, nodes: np.ndarray) -> int:
    """Length of the shortest prefix of ``nodes`` that can hold ``job`` (0 when none can)."""
    if not alg1.fits(job, net, nodes):
        return 0
    lo, hi = 1, nodes.size
    while lo < hi:
        mid = (lo + hi) // 2
        if alg1.fits(job, net, nodes[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _fit_all(jobs: list[Job], net: Network, nodes: np.ndarray) -> bool:
    """Whether consecutive segments of ``nodes`` can hold ``jobs`` in this order."""
    pos = 0
    for job in jobs:
        k = _min_prefix(job, net, nodes[pos:])
        if k == 0:
            return False
        pos += k
    return True


@dataclass
class _JobState:
    job: Job
    group: np.ndarray            # nodes reserved for the job (its placement's nodes)
    placement: Placement
    est: Estimate
    hint: tuple[int, int]


class _Planner:
    def __init__(self, jobs, net, seed, budget_s, max_rounds, progress):
        self.jobs, self.net = jobs, net
        self.rng = np.random.default_rng(seed)
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.max_rounds = max_rounds if max_rounds is not None else 12 + 6 * len(jobs)
        self.progress = progress
        self.components = alg1.component_labels(net)
        self.labels = network_clusters(net)
        self.cut_short = False
        self.notes: list[str] = []

    def out_of_time(self) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.cut_short = True
            return True
        return False

    def solve(self, job: Job, nodes: np.ndarray, effort: str = "fast",
              hint: tuple[int, int] | None = None):
        nodes = np.unique(nodes)
        return _solve(job, self.net, nodes, EFFORTS[effort], hint, self.labels[nodes])

    def state(self, job: Job, nodes: np.ndarray, effort: str = "normal") -> _JobState | None:
        p, e = self.solve(job, nodes, effort)
        if p is None:
            return None
        return _JobState(job, np.array(sorted(p.nodes), dtype=np.int64), p, e,
                         (p.replicas, p.micro_batch))

    # ---- one phase ------------------------------------------------------------------------
    def refine_phase(self, states: dict[str, _JobState], rounds: int, tick: Callable[[], None]):
        """Moves for the critical job until none lowers the makespan (free nodes first, then
        chunks of other jobs), then free nodes for the other jobs (sum of completion times)."""
        net = self.net
        used_rounds = 0
        while used_rounds < rounds and states and not self.out_of_time():
            tick()
            used_rounds += 1
            used = np.zeros(net.n, dtype=bool)
            for s in states.values():
                used[s.group] = True
            times = {name: s.est.job_s for name, s in states.items()}
            crit = max(times, key=lambda k: (times[k], k))
            cs = states[crit]
            comp = self.components[cs.group[0]]
            free = np.flatnonzero(~used & (self.components == comp))
            best = self._best_move(cs, free, states, times, donors=False)
            if best is None:
                best = self._best_move(cs, free, states, times, donors=True)
            if best is None:
                break
            for k, (p, e) in best.items():
                s = states[k]
                states[k] = _JobState(s.job, np.array(sorted(p.nodes), dtype=np.int64), p, e,
                                      (p.replicas, p.micro_batch))
        for _ in range(max(2, rounds - used_rounds)):
            if self.out_of_time() or not states:
                break
            tick()
            used = np.zeros(net.n, dtype=bool)
            for s in states.values():
                used[s.group] = True
            makespan = max(s.est.job_s for s in states.values())
            if not self._improve_others(states, np.flatnonzero(~used), makespan):
                break

    def grow_bottleneck(self, states: dict[str, _JobState]) -> bool:
        """Give idle nodes to the job that sets the makespan and re-solve its configuration over a
        dense range of replica counts (:func:`_deep_solve`): first the idle nodes of its own
        clusters (more replicas D inside a cluster), then those of the nearest clusters (longer
        pipelines, or replicas across clusters where the ring S / (D bw) pays). Repeats while the
        makespan drops; True when anything changed."""
        net = self.net
        changed = False
        for _ in range(GROW_ROUNDS):
            if self.out_of_time() or not states:
                break
            used = np.zeros(net.n, dtype=bool)
            for s in states.values():
                used[s.group] = True
            times = {name: s.est.job_s for name, s in states.items()}
            crit = max(times, key=lambda k: (times[k], k))
            cs = states[crit]
            makespan, total = times[crit], sum(times.values())
            comp = self.components[cs.group[0]]
            free = np.flatnonzero(~used & (self.components == comp))
            best = None
            for pool in self._grow_pools(cs.group, free):
                p, e = _deep_solve(cs.job, net, pool, self.labels[pool], cs.hint)
                if p is None or e.job_s >= makespan * (1 - 1e-9):
                    continue
                key = (e.job_s, len(p.nodes))
                if best is None or key < best[0]:
                    best = (key, p, e)
            if best is not None:
                upd = {crit: (best[1], best[2])}
            else:
                upd = self._relocate(states, crit, free, makespan)
                if upd is None:
                    break
            new_times = dict(times)
            for k, (p, e) in upd.items():
                new_times[k] = e.job_s
            if not (max(new_times.values()) < makespan * (1 - 1e-9)
                    or (max(new_times.values()) <= makespan and sum(new_times.values()) < total)):
                break
            for k, (p, e) in upd.items():
                states[k] = _JobState(states[k].job, np.array(sorted(p.nodes), dtype=np.int64), p,
                                      e, (p.replicas, p.micro_batch))
            changed = True
        return changed

    def _relocate(self, states: dict[str, _JobState], crit: str, free: np.ndarray,
                  makespan: float):
        """Move a job that shares the bottleneck job's clusters onto idle clusters, and give the
        bottleneck job the nodes it leaves there. Returns {job: (placement, estimate)} for the
        best such pair that lowers the makespan, else None."""
        net = self.net
        cs = states[crit]
        mine = np.unique(self.labels[cs.group])
        in_mine = np.isin(self.labels, mine)
        outside = free[~in_mine[free]]
        if outside.size == 0:
            return None
        same = free[in_mine[free]]
        neighbours = [k for k in states if k != crit and in_mine[states[k].group].any()]
        neighbours.sort(key=lambda k: (-int(in_mine[states[k].group].sum()), k))
        lab = self.labels[outside]
        free_clusters = sorted(np.unique(lab),
                               key=lambda c: (-float(net.thr[outside[lab == c]].sum()), int(c)))
        best = None
        for name in neighbours[:RELOCATE_NEIGHBOURS]:
            ds = states[name]
            kept = ds.group[~in_mine[ds.group]]
            # Homes for the neighbour: what it keeps outside plus one of the roomiest idle
            # clusters, or plus all idle nodes outside the bottleneck's clusters.
            homes = [np.union1d(kept, outside[lab == c]) for c in free_clusters[:RELOCATE_HOMES]]
            homes.append(np.union1d(kept, outside))
            moved = None
            for home in homes:
                if not alg1.fits(ds.job, net, home):
                    continue
                p, e = self.solve(ds.job, home, "fast", ds.hint)
                if p is None or e.job_s >= makespan * (1 - 1e-9):
                    continue
                if moved is None or (e.job_s, len(p.nodes)) < (moved[1].job_s, len(moved[0].nodes)):
                    moved = (p, e)
            if moved is None:
                continue
            pool = np.setdiff1d(np.union1d(np.union1d(cs.group, same), ds.group[in_mine[ds.group]]),
                                moved[0].nodes)
            p, e = _deep_solve(cs.job, net, pool, self.labels[pool], cs.hint)
            if p is None or e.job_s >= makespan * (1 - 1e-9):
                continue
            key = max(e.job_s, moved[1].job_s)
            if best is None or key < best[0]:
                best = (key, {crit: (p, e), name: moved})
        return None if best is None else best[1]

    def _grow_pools(self, group: np.ndarray, free: np.ndarray) -> list[np.ndarray]:
        """Node pools for the bottleneck job: its group plus the idle nodes of its clusters, then
        plus the idle nodes of the 1, 2 and 4 nearest other clusters."""
        net = self.net
        mine = np.unique(self.labels[group])
        same = free[np.isin(self.labels[free], mine)]
        pools = [group] + ([np.union1d(group, same)] if same.size else [])
        others = free[~np.isin(self.labels[free], mine)]
        if others.size:
            near = net.rtt_ms[np.ix_(others, group)].min(axis=1)
            lab = self.labels[others]
            ranked = sorted(np.unique(lab), key=lambda c: (float(near[lab == c].min()), int(c)))
            for count in (1, 2, 4):
                if count > len(ranked) or (count > 1 and count // 2 >= len(ranked)):
                    break
                extra = others[np.isin(lab, ranked[:count])]
                pools.append(np.union1d(np.union1d(group, same), extra))
            # Or move to an idle cluster larger than its own (communication-bound jobs want
            # many nodes joined by fast links).
            own = max(int(np.isin(self.labels, [c]).sum()) for c in mine)
            sizes = {int(c): int((lab == c).sum()) for c in np.unique(lab)}
            big = sorted((c for c in sizes if sizes[c] > own), key=lambda c: (-sizes[c], c))
            for c in big[:MIGRATE_CLUSTERS]:
                pools.append(others[lab == c])
        return pools

    def polish(self, states: dict[str, _JobState]) -> bool:
        """Re-solve every job on its own group with more effort; True when any job got faster."""
        improved = False
        for name in sorted(states):
            s = states[name]
            p, e = self.solve(s.job, s.group, "normal", s.hint)
            if p is not None and e.iteration_s < s.est.iteration_s * (1 - 1e-9):
                states[name] = _JobState(s.job, np.array(sorted(p.nodes), dtype=np.int64), p, e,
                                         (p.replicas, p.micro_batch))
                improved = True
        return improved

    def _best_move(self, cs: _JobState, free: np.ndarray, states, times, donors: bool):
        """The candidate move with the lowest (makespan, sum of times), if it improves on now."""
        crit = cs.job.name
        makespan, total = times[crit], sum(times.values())
        best_key, best = None, None
        for cand_nodes, donor, donor_nodes, extra in self._candidates(cs, free, states, times,
                                                                      donors):
            new_c = self.solve(cs.job, np.concatenate([cs.group, cand_nodes]), "fast", cs.hint)
            if new_c[0] is None or new_c[1].job_s >= makespan * (1 - 1e-9) and donor is not None:
                continue
            upd = {crit: new_c}
            if donor is not None:
                ds = states[donor]
                rest = np.setdiff1d(ds.group, donor_nodes)
                if extra is not None and extra.size:
                    rest = np.union1d(rest, extra)
                rest = np.setdiff1d(rest, new_c[0].nodes)
                if rest.size == 0:
                    continue
                new_d = self.solve(ds.job, rest, "fast", ds.hint)
                if new_d[0] is None:
                    continue
                upd[donor] = new_d
            new_times = dict(times)
            for k, (p, e) in upd.items():
                new_times[k] = e.job_s
            key = (max(new_times.values()), sum(new_times.values()))
            better = key[0] < makespan * (1 - 1e-9) or (key[0] <= makespan
                                                         and key[1] < total * (1 - 1e-9))
            if better and (best_key is None or key < best_key):
                best_key, best = key, upd
        return best

    def _candidates(self, cs: _JobState, free: np.ndarray, states, times, donors: bool):
        """Node sets to add to the critical job: free cluster chunks nearest to it, and chunks of
        the jobs with most slack."""
        net = self.net
        out = []
        if free.size and not donors:
            near = net.rtt_ms[np.ix_(free, cs.group)].min(axis=1)
            lab = self.labels[free]
            by_cluster: dict[int, np.ndarray] = {}
            for c in np.unique(lab):
                by_cluster[int(c)] = free[lab == c]
            ranked = sorted(by_cluster, key=lambda c: (near[lab == c].min(), -net.thr[by_cluster[c]].sum(), c))
            for c in ranked[:4]:
                members = by_cluster[c]
                members = members[np.lexsort((members, -net.thr[members]))]
                out.append((members, None, None, None))
                if members.size >= 4:
                    out.append((members[:members.size // 2], None, None, None))
                elif members.size > 1:
                    out.append((members[:1], None, None, None))
            big = sorted(by_cluster, key=lambda c: (-net.thr[by_cluster[c]].sum(), c))[:2]
            for c in big:
                if c not in ranked[:4]:
                    out.append((by_cluster[c], None, None, None))
        if not donors:
            return out
        # Chunks of other jobs' groups near the critical job; the donor is compensated with free
        # nodes of its own clusters and of the nearest free cluster.
        comp = self.components[cs.group[0]]
        others = [k for k in states if k != cs.job.name
                  and self.components[states[k].group[0]] == comp]
        dist_to_c = {k: float(net.rtt_ms[np.ix_(states[k].group, cs.group)].min()) for k in others}
        makespan = times[cs.job.name]
        near_jobs = sorted(others, key=lambda k: (dist_to_c[k], times[k], k))[:3]
        slack = sorted(others, key=lambda k: (-(makespan - times[k]) * net.thr[states[k].group].sum(),
                                              k))[:3]
        for d in dict.fromkeys(near_jobs + slack):
            g = states[d].group
            lab = self.labels[g]
            near = net.rtt_ms[np.ix_(g, cs.group)].min(axis=1)
            clusters = sorted(np.unique(lab), key=lambda c: (near[lab == c].min(), c))
            for c in clusters[:2]:
                members = g[lab == c]
                members = members[np.lexsort((members, -net.thr[members]))]
                sizes = {members.size, members.size // 2, members.size // 4, members.size // 8}
                for size in sorted(x for x in sizes if x >= 1):
                    chunk = members[:size]
                    out.append((chunk, d, chunk, self._compensation(g, chunk, free)))
            # Exchange: the critical job may take the donor's whole group; the donor gets what
            # the critical job leaves of its old group, plus free nodes near it.
            comp_nodes = np.union1d(cs.group, self._compensation(np.union1d(g, cs.group), g, free))
            out.append((g, d, g, comp_nodes))
        return out

    def _compensation(self, group: np.ndarray, chunk: np.ndarray, free: np.ndarray) -> np.ndarray:
        """Free nodes a donor may take instead of ``chunk``: free nodes in its remaining clusters,
        plus the free cluster nearest to its remaining nodes."""
        rest = np.setdiff1d(group, chunk)
        if free.size == 0 or rest.size == 0:
            return np.zeros(0, dtype=np.int64)
        lab_rest = np.unique(self.labels[rest])
        same = free[np.isin(self.labels[free], lab_rest)]
        others = free[~np.isin(self.labels[free], lab_rest)]
        if others.size:
            near = self.net.rtt_ms[np.ix_(others, rest)].min(axis=1)
            nearest = self.labels[others[int(np.argmin(near))]]
            same = np.concatenate([same, others[self.labels[others] == nearest]])
        return same

    def _improve_others(self, states, free: np.ndarray, makespan: float) -> bool:
        """Give free nodes to non-critical jobs when that shortens them (never past makespan)."""
        improved = False
        if free.size == 0:
            return False
        net = self.net
        for name in sorted(states, key=lambda k: (-states[k].est.job_s, k)):
            s = states[name]
            if self.components[s.group[0]] != self.components[free[0]]:
                continue
            near = net.rtt_ms[np.ix_(free, s.group)].min(axis=1)
            cand = free[near <= max(CLUSTER_RTT_MS, near.min())]
            if cand.size == 0:
                continue
            p, e = self.solve(s.job, np.concatenate([s.group, cand]), "fast", s.hint)
            if p is not None and e.job_s < s.est.job_s * (1 - 1e-6) and e.job_s <= makespan:
                states[name] = _JobState(s.job, np.array(sorted(p.nodes), dtype=np.int64), p, e,
                                         (p.replicas, p.micro_batch))
                free = np.setdiff1d(free, p.nodes)
                improved = True
                if free.size == 0:
                    break
        return improved

    # ---- whole plan -------------------------------------------------------------------------
    def run(self, grouping: alg1.Grouping) -> Plan:
        phases = grouping.phases()
        per_phase_rounds = max(1, self.max_rounds // max(1, len(phases)))
        second_rounds = max(2, per_phase_rounds // 3)
        # Upper bound of ticks: each refine_phase ticks at most rounds + max(2, rounds) times.
        total_ticks = len(phases) * (per_phase_rounds + max(2, per_phase_rounds)
                                     + second_rounds + max(2, second_rounds))
        done = [0]

        def tick():
            done[0] += 1
            if self.progress is not None:
                self.progress(min(done[0], total_ticks), total_ticks)

        by_name = {j.name: j for j in self.jobs}
        phase_states: list[dict[str, _JobState]] = []
        for ph in phases:
            states: dict[str, _JobState] = {}
            for name in grouping.jobs_in_phase(ph):
                st = self.state(by_name[name], np.asarray(grouping.groups[name], dtype=np.int64))
                if st is None:
                    raise PlanningError(f"job {name}: Algorithm 1 gave a group with no valid placement")
                states[name] = st
            self.refine_phase(states, per_phase_rounds, tick)
            if self.polish(states):
                self.refine_phase(states, second_rounds, tick)
            if self.grow_bottleneck(states):
                self.refine_phase(states, second_rounds, tick)
            phase_states.append(states)
        phase_states = self.pull_forward(phase_states)
        placements = []
        for ph, states in enumerate(phase_states):
            self.polish(states)
            for name in states:
                p = states[name].placement
                placements.append(Placement(p.job, p.stages, p.micro_batch, ph))
        if self.progress is not None:
            self.progress(total_ticks, total_ticks)
        notes = list(grouping.notes)
        if self.cut_short:
            notes.append("search stopped at the budget_s safety cap; the plan is valid but may "
                         "differ from an uncapped run")
        placements.sort(key=lambda p: (p.phase, [j.name for j in self.jobs].index(p.job.name)))
        return Plan("search", placements, notes=notes)

    def pull_forward(self, phase_states: list[dict[str, _JobState]]) -> list[dict[str, _JobState]]:
        """Move a later-phase job into an earlier phase on free nodes when that ends sooner."""
        changed = True
        while changed and len(phase_states) > 1 and not self.out_of_time():
            changed = False
            for ph in range(1, len(phase_states)):
                for name in sorted(phase_states[ph]):
                    s = phase_states[ph][name]
                    for target in range(ph):
                        used = np.zeros(self.net.n, dtype=bool)
                        for t in phase_states[target].values():
                            used[t.group] = True
                        free = np.flatnonzero(~used)
                        if free.size == 0:
                            continue
                        comp = np.bincount(self.components[free]).argmax()
                        free = free[self.components[free] == comp]
                        if not alg1.fits(s.job, self.net, free):
                            continue
                        new = self.state(s.job, free, "normal")
                        if new is None:
                            continue
                        before = _makespan(phase_states)
                        trial = [dict(x) for x in phase_states]
                        del trial[ph][name]
                        trial[target][name] = new
                        trial = [x for x in trial if x]
                        if _makespan(trial) < before * (1 - 1e-9):
                            phase_states = trial
                            changed = True
                            break
                    if changed:
                        break
                if changed:
                    break
        return phase_states


def _makespan(phase_states) -> float:
    return sum(max(s.est.job_s for s in states.values()) for states in phase_states if states)


def plan_search(jobs: list[Job], net: Network, *, seed: int = 0, budget_s: float | None = None,
                max_rounds: int | None = None,
                progress: Callable[[int, int], None] | None = None,
                initial: alg1.Grouping | np.ndarray | None = None) -> Plan:
    """Plan all ``jobs`` on ``net`` (method "search"; see module docstring).

    ``initial``: a Grouping (e.g. the GNN's, after Algorithm 1) or a class-score array
    (n x (jobs + 1)) to start from instead of the heuristic scores. ``max_rounds`` bounds the
    cross-group moves (default 12 + 6 per job); ``budget_s`` is a wall-clock safety cap only.
    ``progress(done, total)`` is called once per round.
    """
    jobs = list(jobs)
    if net.n == 0:
        raise PlanningError("the fleet has no nodes")
    if not jobs:
        return Plan("search", [])
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise PlanningError("job names must be unique")
    planner = _Planner(jobs, net, seed, budget_s, max_rounds, progress)
    if isinstance(initial, alg1.Grouping):
        grouping = initial
        missing = set(names) - set(grouping.groups)
        if missing:
            raise PlanningError(f"initial grouping lacks jobs {sorted(missing)}")
    else:
        scores = initial if initial is not None else heuristic_scores(
            jobs, net, labels=planner.labels, components=planner.components)
        grouping = alg1.algorithm1(jobs, net, np.asarray(scores), labels=planner.components)
    return planner.run(grouping)
