"""Step 4a of the search: a K x D grid of nodes made into one job's placement.

A grid row is a stage group of D nodes (one per data-parallel replica), rows in pipeline order.
:func:`stage_grid` chunks ordered clusters into rows, :func:`match_rows` reorders each row so
that consecutive stages' replicas pair up over cheap links, :func:`order_rows` puts the stage
groups in a cheaper pipeline order, and :func:`placement_from_grid`
gives each stage its layers (balanced by throughput within memory, with a cap on the largest
stage's all-reduce where that pays).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from scipy.optimize import linear_sum_assignment

from planner.core import costmodel as cm
from planner.core.costmodel import Placement, Stage, transfer_s
from planner.core.fleet import Network
from planner.core.jobs import Job


def stage_grid(clusters: list[np.ndarray], d: int, carry_over: bool = True) -> np.ndarray | None:
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


def match_rows(net: Network, grid: np.ndarray, act: float) -> np.ndarray:
    """Reorder each stage's nodes so replica p's hop k -> k+1 is a bottleneck-minded matching.

    Only hops that can set the pipeline's largest transfer matter for (M - 1) * max(x): a
    boundary whose worst pairing is no dearer than the unavoidable largest hop of the whole
    chain (the largest lower bound of any boundary's bottleneck matching), or whose pairings are
    all within 5% of each other, is left as it is."""
    k, d = grid.shape
    if d == 1 or k == 1:
        return grid
    src, dst = grid[:-1, :, None], grid[1:, None, :]
    cost = transfer_s(net, src, dst, act)   # (K-1, D, D)
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


def order_rows(net: Network, grid: np.ndarray, act: float, passes: int = 8) -> np.ndarray | None:
    """The grid's rows (stage groups) in a better pipeline order, or None when none was found.

    With M micro-batches a pipeline pays its largest stage-to-stage transfer M - 1 times, so
    the order of the stage groups matters as much as which nodes they are: on WAN fleets the
    clusters' path order can put a slow link between two consecutive stages that another order
    avoids. Row i -> j costs the largest of its replicas' transfers (replica p to replica p);
    2-opt segment reversals lower the sum of these costs to the 4th power (close to the
    bottleneck, as in :func:`match_rows`) over an open path (a zero-cost depot at index K
    makes the ends free). O(passes x K^2) numpy work; the caller judges the result by the cost
    model."""
    k, d = grid.shape
    if k < 3:
        return None
    src, dst = grid[:, None, :], grid[None, :, :]
    with np.errstate(divide="ignore"):
        hop = transfer_s(net, src, dst, act)   # (K, K, D)
    cost = hop.max(axis=2)
    cost = np.where(np.isfinite(cost), cost, 1e12)
    scale = cost[~np.eye(k, dtype=bool)].max()
    if not scale > 0:
        return None
    w = np.zeros((k + 1, k + 1))
    w[:k, :k] = (cost / scale) ** 4
    tour = np.arange(k + 1)             # depot k closes the open path into a cycle
    i_idx, j_idx = np.triu_indices(k + 1, 2)
    keep = ~((i_idx == 0) & (j_idx == k))
    i_idx, j_idx = i_idx[keep], j_idx[keep]
    for _ in range(passes):
        a, b = tour[i_idx], tour[i_idx + 1]
        c, e = tour[j_idx], tour[(j_idx + 1) % (k + 1)]
        delta = w[a, c] + w[b, e] - w[a, b] - w[c, e]
        best = int(np.argmin(delta))
        if not delta[best] < -1e-12:
            break
        i, j = int(i_idx[best]), int(j_idx[best])
        tour[i + 1:j + 1] = tour[i + 1:j + 1][::-1].copy()
    at = int(np.flatnonzero(tour == k)[0])
    order = np.concatenate([tour[at + 1:], tour[:at]])
    if order[0] > order[-1]:   # a path and its reverse cost the same: keep the first row first
        order = order[::-1]
    if np.array_equal(order, np.arange(k)):
        return None
    return grid[order]


def balance_layers(job: Job, stage_thr: np.ndarray, caps: np.ndarray) -> np.ndarray | None:
    """Layers per stage minimising max(l_k / thr_k) with 1 <= l_k <= cap_k, sum = L (greedy
    water-filling, exact for this objective). None when memory cannot hold the model."""
    # Python scalars throughout: this runs for every candidate grid, and numpy calls on arrays
    # of a few elements cost more than the arithmetic; every step gives the floats that
    # _balance_layers_numpy would.
    k = stage_thr.size
    n_layers = job.layers
    cap = caps.tolist()
    if k > n_layers or (k and min(cap) < 1) or sum(cap) < n_layers:
        return None
    if n_layers == k:
        return np.ones(k, dtype=np.int64)
    thr = stage_thr.tolist()
    total = float(stage_thr.sum())          # numpy's pairwise sum: the numpy path's total
    # A finite total means no throughput is infinite or NaN; then all are in (0, inf) when
    # the smallest is positive.
    if not (math.isfinite(total) and total > 0 and min(thr) > 0):
        return _balance_layers_numpy(job, stage_thr, caps)
    # Start from the continuous optimum rounded down, then fill greedily.
    floor = math.floor
    share = [min(c, max(1, floor(n_layers * t / total))) for t, c in zip(thr, cap)]
    lay = share if sum(share) <= n_layers else [1] * k
    return _fill_layers(lay, thr, cap, n_layers - sum(lay))


def _fill_layers(lay: list[int], thr: list[float], cap: list[int], left: int) -> np.ndarray | None:
    """Add ``left`` layers one by one to the stage whose time grows least (a heap)."""
    k = len(lay)
    heap = [((lay[i] + 1) / thr[i], i) for i in range(k) if lay[i] < cap[i]]
    heapq.heapify(heap)
    while left > 0:
        if not heap:
            return None
        _, i = heapq.heappop(heap)
        lay[i] += 1
        left -= 1
        if lay[i] < cap[i]:
            heapq.heappush(heap, ((lay[i] + 1) / thr[i], i))
    return np.array(lay, dtype=np.int64)


def _balance_layers_numpy(job: Job, stage_thr: np.ndarray, caps: np.ndarray) -> np.ndarray | None:
    """balance_layers for throughputs that are not all finite and positive (numpy's semantics)."""
    k = stage_thr.size
    layers = np.ones(k, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.minimum(caps, np.maximum(1, np.floor(job.layers * stage_thr / stage_thr.sum())))
    # A NaN share (infinite throughputs: inf / inf) casts to a huge negative integer, and
    # _fill_layers would then add layers one by one for ever: such a stage starts at one layer.
    share = np.where(np.isfinite(share), share, 1).astype(np.int64)
    if share.sum() <= job.layers and (share >= 1).all():
        layers = share
    return _fill_layers(layers.tolist(), stage_thr.tolist(), caps.tolist(),
                        job.layers - int(layers.sum()))


def placement_from_grid(job: Job, net: Network, grid: np.ndarray, b: int) -> Placement | None:
    """Layers for a K x D grid (dropping stages that cannot hold a layer); None if infeasible."""
    d = grid.shape[1]
    m = cm.micro_batches(job, d, b)
    while grid.shape[0] > 0:
        k = grid.shape[0]
        u = cm.layer_memory_bytes(job, b, m, min(k, job.layers))
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
        layers = balance_layers(job, stage_thr, caps)
        if layers is None:
            return None
        # A one-layer stage that is still the slowest is a bottleneck no layer split can fix:
        # drop it when the others can hold the model and that lowers the slowest stage's time.
        if k > 1:
            load = layers / stage_thr
            worst = int(np.argmax(load))
            if layers[worst] == 1:
                rest = np.delete(np.arange(k), worst)
                alt = balance_layers(job, stage_thr[rest], caps[rest])
                if alt is not None and (alt / stage_thr[rest]).max() < load[worst] * (1 - 1e-9):
                    grid = grid[rest]
                    continue
        if d > 1:
            layers = _trade_allreduce(job, net, grid, b, m, stage_thr, caps, layers)
        bounds = [0] + np.cumsum(layers).tolist()
        rows = grid.tolist()
        stages = tuple(Stage(bounds[s], bounds[s + 1], tuple(rows[s])) for s in range(k))
        return Placement(job, stages, b)
    return None


def _trade_allreduce(job: Job, net: Network, grid: np.ndarray, b: int, m: int,
                     stage_thr: np.ndarray, caps: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """Throughput-balanced layers can give a fast stage so many layers that its all-reduce
    (which grows with its layers) dominates. Try caps on every stage's all-reduce time and keep
    the split with the lowest approximate iteration time (pipeline + slowest all-reduce)."""
    k, d = grid.shape
    a_max, bw_min = cm.ring_links(net, grid)
    base_ar, per_layer_ar = cm.allreduce_terms(d, a_max, cm.gradient_bytes(job, 1), bw_min)
    f = job.flops_per_layer(b)
    hops = None
    if k > 1:
        src, dst = grid[:-1], grid[1:]
        hops = transfer_s(net, src, dst, job.activation_bytes(b)).max(axis=1)

    def approx(lay: np.ndarray) -> float:
        c = cm.stage_compute_s(f, lay, stage_thr, net)   # every stage as its slowest replica
        return (float(cm.pipeline_s(c, hops, m))
                + float((base_ar + per_layer_ar * lay).max()))

    best, best_t = layers, approx(layers)
    top = float((base_ar + per_layer_ar * layers).max())
    tried = None
    for frac in (0.85, 0.7, 0.55, 0.4, 0.3):
        limit = top * frac
        ar_cap = np.floor((limit - base_ar) / per_layer_ar).astype(np.int64)
        new_caps = np.minimum(caps, ar_cap)
        if (new_caps < 1).any() or new_caps.sum() < job.layers:
            break
        if (new_caps >= best).all():
            continue   # the best split so far fits under these caps: balancing gives it again
        key = new_caps.tobytes()
        if key == tried:
            continue   # the same caps as the last split tried: the same split, no better
        tried = key
        alt = balance_layers(job, stage_thr, new_caps)
        if alt is None:
            break
        t = approx(alt)
        if t < best_t:
            best, best_t = alt, t
    return best
