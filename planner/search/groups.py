"""Step 4b of the search: the best placement of one job on one node group.

:func:`solve_group` screens sets of clusters grown by nearest neighbour from the fastest and
roomiest clusters (:func:`growth_sets`; far clusters are left idle when they do not pay) with a
few (D replicas, micro-batch b) configurations, gives the best sets every configuration (a
log-spread of replica counts, :func:`micro_batches`), and refines the best placements by
putting their stage groups in a better pipeline order (:func:`reorder_stages`) and dropping
stage groups. :func:`deep_solve` is the denser variant the bottleneck job gets. Every
candidate grid is judged by the cost model (:func:`evaluate_grid`), optionally trimmed to its
fastest rows first. :func:`best_placement` is the entry point for one job on one group.

Options are values (planner.search.options): the effort and :class:`SearchOptions` travel as
arguments. The answers of :func:`evaluate_grid` and :func:`approx_time` are kept in a
:class:`GridCache` that its owner (a search run, or one call) passes down.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from hulk.errors import PlanningError
from planner.core import costmodel as cm
from planner.core.costmodel import INFEASIBLE, Estimate, Placement, estimate, transfer_s
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.search import algorithm1 as alg1
from planner.search.arrangement import (balance_layers, match_rows, order_rows, placement_from_grid,
                                        stage_grid)
from planner.search.clusters import cluster_distance, cluster_labels, open_path, ordered_clusters
from planner.search.options import Effort, EffortParams, SearchOptions

MICRO_BATCH_CANDIDATES = (1, 2, 4, 8)
EVALUATED_GRIDS_KEPT = 100_000   # answers a GridCache keeps per table (then started afresh)
TRIM_FRACTIONS = (0.85, 0.7, 0.55, 0.4, 0.25, 0.12)   # shares of a grid's rows tried as trims
CITY_SPLIT_MIN_NODES = 64   # smaller pools: rings are short, the latency term is small
DEEP_SCREEN = 16   # grids of deep_solve judged by the cost model: the best by approx_time
FINALIST_SCREEN = 16   # the same for solve_group's finalist sets
DEEP_REPLICAS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128,
                 160, 192, 256)


DEFAULT_OPTIONS = SearchOptions()


class Solved(NamedTuple):
    """A job solved on some nodes: its placement (None when the nodes cannot hold it) and the
    cost model's estimate of it (INFEASIBLE then)."""

    placement: Placement | None
    estimate: Estimate


UNSOLVED = Solved(None, INFEASIBLE)


class GridCache:
    """The answers of :func:`evaluate_grid` and :func:`approx_time` on one network, kept by
    their owner: a search run asks for the same grid again and again (half of all calls on a
    1,000-server fleet), and both are pure functions of their arguments, so a repeat costs a
    dictionary look-up and gives the very same answer. Each table starts afresh past
    :data:`EVALUATED_GRIDS_KEPT` answers."""

    def __init__(self, net: Network):
        self.net = net
        self._tables: dict[str, dict] = {"evaluate": {}, "approx": {}}

    def remember(self, table: str, key, fn):
        """``fn()``, a pure answer, from table ``table`` when ``key`` was asked before (the
        island layouts of planner.search.islands)."""
        kept = self._tables.setdefault(table, {})
        hit = kept.get(key)
        if hit is None:
            hit = fn()
            if len(kept) >= EVALUATED_GRIDS_KEPT:
                kept.clear()
            kept[key] = hit
        return hit

    def answer(self, table: str, fn, job: Job, grid: np.ndarray, b: int, trim: bool):
        """``fn(job, net, grid, b, trim, self)``, from the table when asked before."""
        kept = self._tables[table]
        key = (job, b, trim, grid.dtype.str, grid.shape, grid.tobytes())
        hit = kept.get(key)
        if hit is None:
            hit = fn(job, self.net, grid, b, trim, self)
            if len(kept) >= EVALUATED_GRIDS_KEPT:
                kept.clear()
            kept[key] = hit
        return hit


def cache_for(net: Network, cache: GridCache | None) -> GridCache:
    """``cache``, or a fresh one for a caller outside a search run."""
    if cache is None:
        return GridCache(net)
    if cache.net is not net:
        raise ValueError("a GridCache keeps the answers of one network only")
    return cache


def micro_batches(job: Job, d: int) -> list[int]:
    """Micro-batch sizes to try with ``d`` replicas: 1, 2, 4, 8 and the job's own, up to the
    batch one replica gets."""
    per_replica = cm.micro_batches(job, d, 1)
    return sorted({b for b in MICRO_BATCH_CANDIDATES + (job.micro_batch,) if 1 <= b <= per_replica})


def _replica_candidates(job: Job, net: Network, nodes: np.ndarray, clusters: list[np.ndarray],
                        effort: EffortParams) -> list[int]:
    """Replica counts D to try: small ones, the cluster sizes and a log-spread up to what
    memory and the batch allow, ``effort.replica_options`` of them at most (plus the sizes)."""
    n = nodes.size
    max_d = max(1, min(n, cm.max_replicas(job, net.mem[nodes].sum()), job.global_batch))
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


def evaluate_grid(job: Job, net: Network, grid: np.ndarray, b: int, trim: bool = False,
                  cache: GridCache | None = None) -> Solved:
    """Match, balance and judge a grid; ``trim``: also try keeping only its fastest rows.
    A pure function of its arguments; ``cache`` (:class:`GridCache`) keeps the answers."""
    return cache_for(net, cache).answer("evaluate", _evaluate_grid, job, grid, b, trim)


def _evaluate_grid(job: Job, net: Network, grid: np.ndarray, b: int, trim: bool,
                   cache: GridCache) -> Solved:
    best = UNSOLVED
    for g in (_trimmed_grids(job, net, grid, b, cache) if trim else [grid]):
        g = match_rows(net, g, job.activation_bytes(b))
        placement = placement_from_grid(job, net, g, b)
        if placement is None:
            continue
        est = estimate(placement, net)
        if est.feasible and (best.placement is None
                             or est.iteration_s < best.estimate.iteration_s * (1 - 1e-12)):
            best = Solved(placement, est)
    return best


def _trimmed_grids(job: Job, net: Network, grid: np.ndarray, b: int, cache: GridCache
                   ) -> list[np.ndarray]:
    """The grid itself and, when the cost model's formula says it is faster, the grid keeping
    only its fastest stage groups (rows, in their order). Using every row is often slower: a
    slow row still needs a whole layer and sets max(x), integer layers leave the longest stage
    with one layer more than the others, and every extra stage adds to the bubble. Rows are
    scored with the section-4 formula on the unmatched grid (matching only lowers hops)."""
    _, rows = approx_time(job, net, grid, b, trim=True, cache=cache)
    return [grid] if rows is None else [grid, grid[rows]]


def approx_time(job: Job, net: Network, grid: np.ndarray, b: int, trim: bool = False,
                cache: GridCache | None = None) -> tuple[float, np.ndarray | None]:
    """The section-4 formula's iteration time for ``grid`` as it stands (rows unmatched,
    layers balanced by throughput, no all-reduce trade), every stage timed as its slowest
    replica: estimate() of that placement for D = 1 (up to rounding), an upper bound of it
    for D > 1. With ``trim``, the best of keeping only its fastest rows: (seconds, the rows
    kept or None for all). About a tenth of
    :func:`evaluate_grid`'s cost; inf where memory cannot hold the model. ``cache`` keeps the
    answers like evaluate_grid's (the screening asks for the same grids again)."""
    return cache_for(net, cache).answer("approx", _approx_time, job, grid, b, trim)


def _approx_time(job: Job, net: Network, grid: np.ndarray, b: int, trim: bool,
                 cache: GridCache | None = None) -> tuple[float, np.ndarray | None]:
    k, d = grid.shape
    m = cm.micro_batches(job, d, b)
    f = job.flops_per_layer(b)
    act = job.activation_bytes(b)
    row_thr = net.thr[grid].min(axis=1)
    row_mem = net.mem[grid].min(axis=1)
    if d > 1:
        a_max, bw_min = cm.ring_links(net, grid)
        with np.errstate(divide="ignore", invalid="ignore"):
            ar_base, ar_per_layer = cm.allreduce_terms(d, a_max, cm.gradient_bytes(job, 1), bw_min)

    def approx(rows: np.ndarray) -> float:
        kk = rows.size
        u = cm.layer_memory_bytes(job, b, m, min(kk, job.layers))
        caps = np.floor(row_mem[rows] / u).astype(np.int64)
        if (caps < 1).any() or kk > job.layers:
            return math.inf
        layers = balance_layers(job, row_thr[rows], caps)
        if layers is None:
            return math.inf
        c = cm.stage_compute_s(f, layers, row_thr[rows], net)
        hop = None
        if kk > 1:
            src, dst = grid[rows[:-1]], grid[rows[1:]]
            with np.errstate(divide="ignore", invalid="ignore"):
                hop = transfer_s(net, src, dst, act).max(axis=1)
        # Every stage as its slowest replica: an upper bound of max_p T_pipe(p).
        t = float(cm.replica_step_s(cm.pipeline_s(c, hop, m), net))
        if d > 1:
            t += float((ar_base[rows] + ar_per_layer[rows] * layers).max())
        return t if math.isfinite(t) else math.inf

    best_t, best_rows = approx(np.arange(k)), None
    if not trim or k <= 2:
        return best_t, None
    fastest = np.lexsort((np.arange(k), -row_thr))
    sizes = sorted({k} | {max(1, int(round(k * x))) for x in TRIM_FRACTIONS}
                   | {min(k, job.layers)}, reverse=True)
    for size in sizes:
        if size >= k:
            continue
        rows = np.sort(fastest[:size])
        t = approx(rows)
        if t < best_t * (1 - 1e-9):
            best_t, best_rows = t, rows
    return best_t, best_rows


def reorder_stages(job: Job, net: Network, placement: Placement, est: Estimate, *,
                   options: SearchOptions = DEFAULT_OPTIONS, cache: GridCache | None = None
                   ) -> Solved:
    """``placement`` with its stage groups in a better pipeline order
    (planner.search.arrangement.order_rows) when the cost model says that is faster; as it is
    when ``options.stage_order`` is off."""
    if not options.stage_order:
        return Solved(placement, est)
    grid = order_rows(net, placement.node_matrix(), job.activation_bytes(placement.micro_batch))
    if grid is None:
        return Solved(placement, est)
    p, e = evaluate_grid(job, net, grid, placement.micro_batch, cache=cache)
    if p is not None and e.iteration_s < est.iteration_s * (1 - 1e-9):
        return Solved(p, e)
    return Solved(placement, est)


def _prune(job: Job, net: Network, placement: Placement, est: Estimate, passes: int,
           labels_of: dict[int, int], cache: GridCache, trim: bool = False) -> Solved:
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
        best = Solved(placement, est)
        for mask in cands:
            p, e = evaluate_grid(job, net, grid[mask], b, trim, cache)
            if p is not None and e.iteration_s < best.estimate.iteration_s * (1 - 1e-9):
                best = Solved(p, e)
        if best.placement is placement:
            break
        placement, est = best
    return Solved(placement, est)


def growth_sets(job: Job, net: Network, clusters: list[np.ndarray], dist: np.ndarray,
                seeds: int):
    """Cluster sets to try: from each seed cluster (most throughput, most memory), add the
    nearest cluster one at a time; every prefix that can hold the model is a candidate.
    A generator of (seed, cluster indices); sending True stops growing from that seed."""
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
                 effort: EffortParams, hint: tuple[int, int] | None, screening: bool) -> list[tuple[int, int]]:
    """(D, b) configurations to try on ``nodes``: a few near the hint when ``screening``, else
    every replica candidate with every micro-batch size, plus the hint's neighbours."""
    n = nodes.size
    if screening:
        big = max(cl.size for cl in clusters)
        ds = {1, 2, big}
        bs = {job.micro_batch}
        if hint is not None:
            d0 = hint[0]
            ds |= {d0 // 2, d0 - 1, d0, d0 + 1, d0 + 2, 2 * d0}
            bs |= {hint[1]}
        return sorted((d, b) for d in ds if 1 <= d <= n for b in bs if b in micro_batches(job, d))
    configs = [(d, b) for d in _replica_candidates(job, net, nodes, clusters, effort)
               for b in micro_batches(job, d)]
    if hint is not None:
        d0, b0 = hint
        for d in (d0 // 2, d0 - 1, d0, d0 + 1, d0 * 2):
            if 1 <= d <= n:
                configs += [(d, b) for b in (b0 // 2, b0, b0 * 2) if b in micro_batches(job, d)]
    return sorted(set(configs))


def _try_configs(job: Job, net: Network, clusters: list[np.ndarray], configs, cache: GridCache,
                 trim: bool = False, screen: int = 0) -> list:
    """Every configuration on the clusters' grids (carrying leftovers over or not), as
    (iteration time, D, b, placement, estimate), fastest first. ``screen``: when there are
    more grids than that, only the ``screen`` best by :func:`approx_time` are judged by the
    cost model (the formula ranks grids well and costs a tenth of a judgement)."""
    grids = []
    for d, b in configs:
        grids.append((d, b, stage_grid(clusters, d, True)))
        if d > 1 and len(clusters) > 1:
            grids.append((d, b, stage_grid(clusters, d, False)))
    grids = [g for g in grids if g[2] is not None]
    if screen and len(grids) > screen:
        ranked = sorted(range(len(grids)), key=lambda i: (
            approx_time(job, net, grids[i][2], grids[i][1], trim, cache)[0], grids[i][0], grids[i][1],
            i))
        grids = [grids[i] for i in sorted(ranked[:screen])]
    results = []
    for d, b, grid in grids:
        p, e = evaluate_grid(job, net, grid, b, trim, cache)
        if p is not None:
            results.append((e.iteration_s, d, b, p, e))
    results.sort(key=lambda r: (r[0], r[1], r[2]))
    return results


def solve_group(job: Job, net: Network, nodes: np.ndarray, effort: Effort,
                hint: tuple[int, int] | None = None, labels: np.ndarray | None = None, *,
                options: SearchOptions = DEFAULT_OPTIONS, cache: GridCache | None = None
                ) -> Solved:
    """Best placement of ``job`` on ``nodes`` (may use a subset); UNSOLVED if none.

    1. screening: for every growth set of clusters (:func:`growth_sets`), a few (D, b);
    2. the best ``finalists`` sets (of the effort's parameters) get every (D, b) candidate;
    3. the best ``keep`` configurations get the stage-dropping local search."""
    nodes = np.unique(np.asarray(nodes, dtype=np.int64))
    if nodes.size == 0:
        return UNSOLVED
    cache = cache_for(net, cache)
    params = effort.params
    if labels is None:
        labels = cluster_labels(net.rtt_ms[np.ix_(nodes, nodes)],
                                cities=[net.nodes[i].city_key for i in nodes])
    clusters = ordered_clusters(net, nodes, labels)
    dist = cluster_distance(net, clusters)
    screened = []
    gen = growth_sets(job, net, clusters, dist, params.seeds)
    stop = False
    seed_best: dict[int, tuple[float, int]] = {}   # seed -> (best time, prefixes since it)
    while True:
        try:
            seed, chosen = gen.send(stop) if screened or stop else next(gen)
        except StopIteration:
            break
        path = [chosen[i] for i in open_path(dist[np.ix_(chosen, chosen)])]
        sub = [clusters[i] for i in path]
        sub_nodes = np.concatenate(sub)
        res = _try_configs(job, net, sub, _configs_for(job, net, sub_nodes, sub, params, hint, True),
                           cache)
        t = res[0][0] if res else math.inf
        if res:
            screened.append((t, len(screened), sub, sub_nodes, res))
        best_t, since = seed_best.get(seed, (math.inf, 0))
        if t < best_t * (1 - 1e-9):
            seed_best[seed] = (t, 0)
            stop = False
        else:
            seed_best[seed] = (best_t, since + 1)
            stop = since + 1 >= params.patience
    if not screened:
        # Screening configurations may all miss memory; try every configuration on everything.
        sub_nodes = np.concatenate(clusters)
        res = _try_configs(job, net, clusters,
                           _configs_for(job, net, sub_nodes, clusters, params, hint, False), cache)
        if not res:
            return UNSOLVED
        screened.append((res[0][0], 0, clusters, sub_nodes, res))
    screened.sort(key=lambda r: (r[0], r[1]))
    results = []
    for _, _, sub, sub_nodes, res in screened[:params.finalists]:
        results += res
        if params.finalists > 0 and not params.screen_only:
            results += _try_configs(job, net, sub,
                                    _configs_for(job, net, sub_nodes, sub, params, hint, False),
                                    cache, screen=FINALIST_SCREEN)
    results.sort(key=lambda r: (r[0], r[1], r[2]))
    labels_of = {int(i): ci for ci, cl in enumerate(clusters) for i in cl}
    best = UNSOLVED
    for _, _, _, p, e in results[:params.keep]:
        p, e = reorder_stages(job, net, p, e, options=options, cache=cache)
        p, e = _prune(job, net, p, e, params.prune_passes, labels_of, cache)
        if best.placement is None or e.iteration_s < best.estimate.iteration_s:
            best = Solved(p, e)
    return best


def deep_solve(job: Job, net: Network, nodes: np.ndarray, labels: np.ndarray,
               hint: tuple[int, int] | None = None, *, options: SearchOptions = DEFAULT_OPTIONS,
               cache: GridCache | None = None) -> Solved:
    """Best placement of ``job`` on all of ``nodes`` over a dense range of replica counts and
    every micro-batch size (stage groups chunked per cluster, rows trimmed to the fastest by
    :func:`evaluate_grid`), the best few refined by :func:`_prune`."""
    nodes = np.unique(np.asarray(nodes, dtype=np.int64))
    if nodes.size == 0 or not alg1.fits(job, net, nodes):
        return UNSOLVED
    cache = cache_for(net, cache)
    clusters = ordered_clusters(net, nodes, labels if labels.size == nodes.size else
                                cluster_labels(net.rtt_ms[np.ix_(nodes, nodes)],
                                               cities=[net.nodes[i].city_key for i in nodes]))
    max_d = max(1, min(nodes.size, cm.max_replicas(job, net.mem[nodes].sum()), job.global_batch))
    ds = {d for d in DEEP_REPLICAS if d <= max_d} | {cl.size for cl in clusters if cl.size <= max_d}
    if hint is not None:
        ds |= {d for d in (hint[0] - 1, hint[0], hint[0] + 1) if 1 <= d <= max_d}
    configs = [(d, b) for d in sorted(ds) for b in micro_batches(job, d)]
    results = _try_configs(job, net, clusters, configs, cache, trim=True, screen=DEEP_SCREEN)
    # Stage groups inside one city: a ring pays 2 (D - 1) a_max, so for small models the
    # latency of its worst link matters as much as bandwidth, and a locality cluster may join
    # several cities a few ms apart.
    names = {c: k for k, c in enumerate(sorted({str(net.nodes[i].city_key) for i in nodes}))}
    if len(names) > len(clusters) and nodes.size >= CITY_SPLIT_MIN_NODES:
        city = np.array([names[str(net.nodes[i].city_key)] for i in nodes])
        by_city = ordered_clusters(net, nodes, city)
        results += _try_configs(job, net, by_city, configs, cache, trim=True, screen=DEEP_SCREEN)
        results.sort(key=lambda r: (r[0], r[1], r[2]))
    if not results:
        return UNSOLVED
    labels_of = {int(i): ci for ci, cl in enumerate(clusters) for i in cl}
    best = UNSOLVED
    for _, _, _, p, e in results[:3]:
        p, e = reorder_stages(job, net, p, e, options=options, cache=cache)
        p, e = _prune(job, net, p, e, 4, labels_of, cache, trim=True)
        if best.placement is None or e.iteration_s < best.estimate.iteration_s:
            best = Solved(p, e)
    return best


def best_placement(job: Job, nodes, net: Network, *, effort: Effort = Effort.NORMAL,
                   options: SearchOptions = DEFAULT_OPTIONS, cache: GridCache | None = None
                   ) -> Solved:
    """The best configuration of ``job`` on the node group ``nodes`` that this search finds:
    which of the nodes to use, K stages x D replicas, the grid arrangement, layer ranges and
    micro-batch size. Raises PlanningError when no valid placement exists on these nodes.
    ``cache``: a GridCache shared with other calls on ``net`` (None: one of its own)."""
    solved = solve_group(job, net, np.asarray(list(nodes), dtype=np.int64), effort,
                         options=options, cache=cache)
    if solved.placement is None:
        raise PlanningError(f"job {job.name} has no valid placement on the {len(list(nodes))} "
                            f"given nodes (not enough memory)")
    return solved

