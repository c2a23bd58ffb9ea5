"""A DT-FM-style planner: the strong peer (Yuan et al., NeurIPS 2022, "Decentralized training of
foundation models in heterogeneous environments").

Each job runs alone on the whole fleet (its largest connected component that can hold it); jobs
run one after another, shortest first, as the paper's baselines do. For one job:

1. **Partition** the nodes into K stage groups of D nodes each (the data-parallel groups); the
   first partition chunks locality clusters (same city / low RTT, fastest nodes together), so
   every group's all-reduce ring stays cheap. Besides the whole fleet, the partition may cover
   only a growing set of nearby clusters that can hold the model (far devices left out), which
   makes the peer stronger than the paper's use-every-device setting.
2. **Bottleneck matching** between consecutive stage groups decides which node of group k feeds
   which node of group k+1 (a linear assignment on 4th powers of the hop costs, which approximates
   the bottleneck assignment; scipy.optimize.linear_sum_assignment).
3. **Open-path ordering** of the stage groups (a TSP-like path): the cost between two groups is a
   lower bound of their bottleneck matching, ``max(max_i min_j c_ij, max_j min_i c_ij)``; the path
   is nearest neighbour from several starts, then 2-opt moves.
4. **Local / evolutionary search** over the partition: a (1 + lambda) evolution whose mutations
   swap two nodes between stage groups or swap a used node with an unused one, each candidate
   scored by the reference cost model after steps 2-3 and layer balancing (throughput within
   memory). K, D and the micro-batch size are chosen by scoring every candidate's initial
   partition and evolving the best few.

Deterministic for a given seed: the budget is a number of generations, never wall-clock time.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hulk.errors import PlanningError
from hulk.plural import count
from planner.core.costmodel import (INFEASIBLE, Estimate, Placement, estimate, max_replicas,
                                    transfer_s)
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, Unplaced
from planner.search import algorithm1 as alg1
from planner.search.arrangement import match_rows, placement_from_grid, stage_grid
from planner.search.clusters import cluster_distance, network_clusters, open_path, ordered_clusters
from planner.search.groups import growth_sets, micro_batches

DEFAULT_GENERATIONS = 60
OFFSPRING = 4
MAX_POOLS_PER_SEED = 8     # growing sets of nearby clusters tried from each seed cluster
SCREENED = 6               # partitions (pool, D) given every micro-batch size
GROUP_SAMPLE = 8           # nodes per stage group used for the path-order cost


def _group_path_cost(net: Network, groups: np.ndarray, act: float) -> np.ndarray:
    """K x K lower bound of the bottleneck matching cost between stage groups (vectorised; on
    the first GROUP_SAMPLE nodes of each group when groups are wider)."""
    groups = groups[:, :GROUP_SAMPLE]   # a sample keeps the (K, K, D, D) tensor small
    a = groups[:, None, :, None]
    b = groups[None, :, None, :]
    cost = transfer_s(net, a, b, act)       # (K, K, D, D)
    cost = np.where(np.isfinite(cost), cost, 1e12)
    bound = np.maximum(cost.min(axis=3).max(axis=2), cost.min(axis=2).max(axis=2))
    np.fill_diagonal(bound, 0.0)
    return bound


def path_order(dist: np.ndarray) -> list[int]:
    """Open path minimising (largest hop, total): nearest neighbour from up to 16 starts, then
    2-opt segment reversals."""
    k = dist.shape[0]
    if k <= 2:
        return list(range(k))
    starts = np.arange(k) if k <= 16 else np.unique(np.linspace(0, k - 1, 16).astype(int))
    # Nearest neighbour from all starts at once.
    s_count = starts.size
    seen = np.zeros((s_count, k), dtype=bool)
    paths = np.zeros((s_count, k), dtype=np.int64)
    paths[:, 0] = starts
    seen[np.arange(s_count), starts] = True
    for step in range(1, k):
        rows = np.where(seen, np.inf, dist[paths[:, step - 1]])
        nxt = rows.argmin(axis=1)
        paths[:, step] = nxt
        seen[np.arange(s_count), nxt] = True
    hops = dist[paths[:, :-1], paths[:, 1:]]
    keys = np.lexsort((hops.sum(axis=1), hops.max(axis=1)))
    best = paths[keys[0]].tolist()
    # 2-opt on an open path with a symmetric cost: reversing best[i..j] changes only the hops
    # (i-1, i) and (j, j+1). Take the best reversal that lowers the total without raising the
    # largest hop, up to k times (vectorised over all i < j).
    path = np.array(best)
    i_idx, j_idx = np.triu_indices(k, 1)
    keep = i_idx >= 1
    i_idx, j_idx = i_idx[keep], j_idx[keep]
    for _ in range(k):
        hops = dist[path[:-1], path[1:]]
        worst = hops.max()
        before = hops[i_idx - 1] + np.where(j_idx < k - 1, hops[np.minimum(j_idx, k - 2)], 0.0)
        a = dist[path[i_idx - 1], path[j_idx]]
        b = np.where(j_idx < k - 1, dist[path[i_idx], path[np.minimum(j_idx + 1, k - 1)]], 0.0)
        gain = before - (a + b)
        gain = np.where((a <= worst) & (b <= worst), gain, -np.inf)
        pick = int(np.argmax(gain))
        if gain[pick] <= 1e-12 * max(1.0, float(hops.sum())):
            break
        i, j = i_idx[pick], j_idx[pick]
        path[i:j + 1] = path[i:j + 1][::-1].copy()
    return path.tolist()


def _ordered(job: Job, net: Network, groups: np.ndarray, b: int) -> np.ndarray:
    """Stage groups in open-path order (step 3)."""
    if groups.shape[0] <= 1:
        return groups
    return groups[path_order(_group_path_cost(net, groups, job.activation_bytes(b)))]


def _score(job: Job, net: Network, groups: np.ndarray, b: int, reorder: bool = True
           ) -> tuple[Placement | None, Estimate]:
    """Order the stage groups (unless ``reorder`` is False: keep the given order), match
    replicas, balance layers, and judge by the cost model."""
    act = job.activation_bytes(b)
    if reorder:
        groups = _ordered(job, net, groups, b)
    grid = match_rows(net, groups, act)
    placement = placement_from_grid(job, net, grid, b)
    if placement is None:
        return None, INFEASIBLE
    est = estimate(placement, net)
    return (placement, est) if est.feasible else (None, INFEASIBLE)


def _evolve(job: Job, net: Network, groups: np.ndarray, spare: np.ndarray, b: int,
            placement: Placement, est: Estimate, rng: np.random.Generator,
            generations: int) -> tuple[Placement, Estimate]:
    """(1 + lambda) evolution over the partition: swap nodes between groups or with spare nodes.

    Offspring keep their parent's stage order (a swap of one or two nodes rarely changes the
    best open path, and ordering costs as much as the rest of the scoring); the champion is
    re-ordered at the end. Large partitions get fewer generations (EVOLVE_FULL_NODES)."""
    k, d = groups.shape
    generations = _generations_for(generations, k * d)
    best_groups, best_spare = _ordered(job, net, groups, b), spare.copy()
    start = (placement, est)
    for _ in range(generations):
        champion = None
        for _ in range(OFFSPRING):
            g, sp = best_groups.copy(), best_spare.copy()
            for _ in range(int(rng.integers(1, 3))):
                if sp.size and rng.random() < 0.3:
                    r, c, s = int(rng.integers(k)), int(rng.integers(d)), int(rng.integers(sp.size))
                    g[r, c], sp[s] = sp[s], g[r, c]
                elif k * d > 1:
                    a, b2 = rng.choice(k * d, size=2, replace=False)
                    ra, ca, rb, cb = a // d, a % d, b2 // d, b2 % d
                    g[ra, ca], g[rb, cb] = g[rb, cb], g[ra, ca]
            p, e = _score(job, net, g, b, reorder=False)
            if p is not None and (champion is None or e.iteration_s < champion[3].iteration_s):
                champion = (g, sp, p, e)
        if champion is not None and champion[3].iteration_s < est.iteration_s * (1 - 1e-12):
            best_groups, best_spare, placement, est = champion
    if (placement, est) is not start:
        p, e = _score(job, net, best_groups, b)
        if p is not None and e.iteration_s < est.iteration_s * (1 - 1e-12):
            placement, est = p, e
    return placement, est


EVOLVE_FULL_NODES = 256    # partitions up to this many nodes get every generation


def _generations_for(generations: int, nodes: int) -> int:
    """Generations for a partition of ``nodes`` nodes: all of them up to EVOLVE_FULL_NODES,
    then fewer in proportion (at least a sixth): each costs about linearly more there, and
    single swaps move a large partition's iteration time very little."""
    if nodes <= EVOLVE_FULL_NODES or generations <= 0:
        return generations
    return max(generations // 6, round(generations * EVOLVE_FULL_NODES / nodes))


def dtfm_placement(job: Job, net: Network, nodes=None, *, seed: int = 0,
                   generations: int = DEFAULT_GENERATIONS, finalists: int = 2
                   ) -> tuple[Placement, Estimate]:
    """DT-FM-style placement of one job on ``nodes`` (default: all). Raises PlanningError when
    no partition can hold the model."""
    rng = np.random.default_rng(seed)
    nodes = np.arange(net.n) if nodes is None else np.unique(np.asarray(list(nodes), dtype=np.int64))
    labels = network_clusters(net)[nodes]
    clusters = ordered_clusters(net, nodes, labels)
    ordered = np.concatenate(clusters) if clusters else np.zeros(0, dtype=np.int64)
    n = ordered.size
    # Device pools: the whole fleet, and every growing set of nearby clusters that can hold the
    # model (DT-FM partitions the devices it is given; a peer that may leave far ones out is
    # the stronger, fairer comparison).
    pools = [clusters]
    if len(clusters) > 1:
        dist = cluster_distance(net, clusters)
        per_seed: dict[int, int] = {}
        for seed_cluster, chosen in growth_sets(job, net, clusters, dist, 2):
            per_seed[seed_cluster] = per_seed.get(seed_cluster, 0) + 1
            if per_seed[seed_cluster] > MAX_POOLS_PER_SEED:
                continue
            path = [chosen[i] for i in open_path(dist[np.ix_(chosen, chosen)])]
            pools.append([clusters[i] for i in path])
    # Screen every (pool, D, chunking) at the job's own micro-batch, then give the best few every
    # micro-batch size.
    screened = []
    for pool in pools:
        pool_nodes = np.concatenate(pool)
        max_d = max(1, min(pool_nodes.size, max_replicas(job, net.mem[pool_nodes].sum()),
                           job.global_batch))
        ds = sorted({d for d in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if d <= max_d})
        for d in ds:
            for variant in (True, False):
                groups = stage_grid(pool, d, variant)
                if groups is None:
                    continue
                if groups.shape[0] > job.layers:
                    keep = np.argsort(-net.thr[groups].min(axis=1), kind="stable")[:job.layers]
                    groups = groups[np.sort(keep)]
                b0 = min(job.micro_batch, micro_batches(job, d)[-1])
                # Screening keeps the groups in cluster path order (stage_grid builds them so);
                # the open-path ordering is applied to the SCREENED best below.
                p, e = _score(job, net, groups, b0, reorder=False)
                screened.append((e.iteration_s, len(screened), d, b0, groups))
                if d == 1:
                    break  # both variants coincide
    screened.sort(key=lambda r: (r[0], r[1]))
    scored = []
    for t0, _, d, b0, groups in screened[:SCREENED]:
        spare = np.setdiff1d(ordered, groups.ravel())
        for b in micro_batches(job, d):
            p, e = _score(job, net, groups, b)
            if p is not None:
                scored.append((e.iteration_s, len(scored), d, b, groups, spare, p, e))
    if not scored:
        raise PlanningError(f"DT-FM: job {job.name} fits no partition of the {count(n, 'node')}")
    scored.sort(key=lambda r: (r[0], r[1]))
    best: tuple[Placement, Estimate] | None = None
    for _, _, d, b, groups, spare, p, e in scored[:finalists]:
        p, e = _evolve(job, net, groups, spare, b, p, e, rng, generations)
        if best is None or e.iteration_s < best[1].iteration_s:
            best = (p, e)
    return best


def plan_dtfm(jobs: list[Job], net: Network, *, seed: int = 0,
              generations: int = DEFAULT_GENERATIONS,
              progress: Callable[[int, int], None] | None = None) -> Plan:
    """Every job alone on the whole fleet with the DT-FM-style search, jobs one after another
    (shortest first). Jobs that fit on no connected component are listed as unplaced."""
    if net.n == 0:
        raise PlanningError("the fleet has no nodes")
    comps = alg1.component_labels(net)
    results: list[tuple[float, Placement]] = []
    unplaced: list[Unplaced] = []
    for idx, job in enumerate(jobs):
        if progress is not None:
            progress(idx, len(jobs))
        options = [np.flatnonzero(comps == c) for c in np.unique(comps)]
        options = [o for o in options if alg1.fits(job, net, o)]
        if not options:
            unplaced.append(Unplaced(job.name, "DT-FM: no connected group of nodes holds the model"))
            continue
        home = max(options, key=lambda o: (net.thr[o].sum(), -int(o[0])))
        try:
            p, e = dtfm_placement(job, net, home, seed=seed + idx, generations=generations)
        except PlanningError as err:
            unplaced.append(Unplaced(job.name, str(err)))
            continue
        results.append((e.job_s, p))
    if progress is not None:
        progress(len(jobs), len(jobs))
    results.sort(key=lambda r: (r[0], r[1].job.name))
    placements = [Placement(p.job, p.stages, p.micro_batch, phase=k)
                  for k, (_, p) in enumerate(results)]
    return Plan("dtfm", placements, unplaced,
                notes=["DT-FM-style: each job alone on the whole fleet; jobs one after another, "
                       "shortest first"])
