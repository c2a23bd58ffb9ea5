"""Warm-started repair of a running plan after nodes are lost (serve's first try at recovery).

A full re-plan of the affected jobs (planner.core.recovery.replan_jobs) starts the search from
nothing on the free nodes. A repair starts from the job's own placement instead, which is
already a refined solution, and changes only what the lost nodes force:

1. **Substitute** (:func:`substitutes`): each lost node's slot (stage k, replica p) gets the
   free node that the cost model likes best among a short list: the free nodes nearest to the
   slot's neighbours (the other nodes of stage k's ring and replica p's previous and next
   stage; worst RTT to any of them) and the fastest free nodes within ``CLUSTER_RTT_MS`` of
   them. Layer ranges are kept, and also re-balanced for the new node (:func:`evaluate_grid`).
2. **Shrink**: without a good spare, drop the lost nodes' replicas (D smaller) or stages (K
   smaller, layers re-balanced within memory), every micro-batch size tried.
3. **Refine** (bounded, :func:`refine_pools`): from the best of those, the search's per-group
   solver (:func:`solve_group`, NORMAL effort, the start's (D, b) as the hint) on the job's
   nodes, plus its clusters' free nodes, plus the 1 and 2 nearest clusters, and on each of the
   largest free clusters; then the search's dense re-solve (:func:`deep_solve`) on the job's
   neighbourhood, the largest free clusters and the most promising other pool.

Every candidate is judged by the reference cost model (costmodel.estimate); the fastest wins,
ties to the least change (substitute, shrink, refine, in that order). Other jobs keep their
placements, a repaired job keeps its phase, and no down node or node of another job (of any
phase) is ever used. Deterministic: the work is fixed (no wall-clock cap) and ties are broken
by node index. At 1,000 servers a repair takes 0.1-0.4 s of CPU (bench/replan_bench.py).

:func:`repair_jobs` repairs every affected job that has a placement and hands the rest (and
any it cannot repair) to the full re-plan, with the same result type.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.core.costmodel import Placement, Stage, estimate, stage_memory_bytes
from planner.core.costmodel import micro_batches as num_micro_batches
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.core.recovery import Replan, replan_jobs
from planner.search.clusters import CLUSTER_RTT_MS, network_clusters
from planner.search.groups import (GridCache, Solved, deep_solve, evaluate_grid, micro_batches,
                                   solve_group)
from planner.search.islands import uses_islands
from planner.search.options import Effort
from planner.search.grow import neighbourhood_pools

if TYPE_CHECKING:
    from planner.methods import Planner

NEAREST_SPARES = 16        # free nodes nearest to a lost slot's neighbours that are tried
FASTEST_SPARES = 8         # plus the fastest free nodes within CLUSTER_RTT_MS of them
MIGRATE_CLUSTERS = 2       # largest free clusters elsewhere, tried on their own
STEPS = ("substitute", "shrink", "refine")   # least change first: wins ties
# A substitute within this share of the job's old time restored it: its neighbourhood (already
# refined by the search) gets no dense re-solve, the costliest step for a large job.
RESTORED_WITHIN = 0.01
DEEP_NODE_BUDGET = 200     # servers over all dense re-solves beyond the ones always made


@dataclass(frozen=True)
class JobRepair:
    """One job's repair: the new placement (full network indices, same phase) and the step
    that gave it, or None and why not."""

    placement: Placement | None
    step: str
    job_s: float
    before_s: float            # the job's time before the loss (its old placement)


def free_nodes(plan: Plan, net: Network, job_name: str, down: Iterable[int]) -> np.ndarray:
    """Nodes neither down nor used by another placement of ``plan`` (any phase), sorted."""
    busy = np.zeros(net.n, dtype=bool)
    for p in plan.placements:
        if p.job.name != job_name:
            busy[p.nodes] = True
    busy[list(down)] = True
    return np.flatnonzero(~busy)


def _slot_neighbours(grid: np.ndarray, alive: np.ndarray, k: int, p: int) -> np.ndarray:
    """Surviving nodes a node in slot (k, p) talks to: stage k's ring, replica p's hops."""
    out = [grid[k, q] for q in range(grid.shape[1]) if q != p and alive[k, q]]
    out += [grid[s, p] for s in (k - 1, k + 1) if 0 <= s < grid.shape[0] and alive[s, p]]
    return np.array(out, dtype=np.int64)


def _shortlist(net: Network, spares: np.ndarray, neighbours: np.ndarray, lost: int,
               need_bytes: float) -> np.ndarray:
    """Free nodes worth trying in a lost slot: enough memory, nearest to the slot's neighbours
    (worst RTT to any; the lost node itself when it had none), and the fastest close ones."""
    spares = spares[net.mem[spares] >= need_bytes]
    if spares.size == 0:
        return spares
    anchors = neighbours if neighbours.size else np.array([lost])
    far = net.rtt_ms[np.ix_(spares, anchors)].max(axis=1)
    nearest = spares[np.lexsort((spares, -net.thr[spares], far))[:NEAREST_SPARES]]
    close = spares[far <= max(CLUSTER_RTT_MS, float(far.min()))]
    fastest = close[np.lexsort((close, -net.thr[close]))[:FASTEST_SPARES]]
    return np.unique(np.concatenate([nearest, fastest]))


def substitutes(placement: Placement, net: Network, lost: set[int], free: np.ndarray
                ) -> Solved | None:
    """The placement with every lost node replaced by a free one, slot by slot (stage order),
    each time the spare that gives the shortest iteration; None when a slot has no spare with
    enough memory."""
    grid = placement.node_matrix()
    alive = ~np.isin(grid, list(lost))
    job, b = placement.job, placement.micro_batch
    m = num_micro_batches(job, placement.replicas, b)
    spares = free.copy()
    current = placement
    for k, p in zip(*np.nonzero(~alive)):
        st = current.stages[k]
        need = stage_memory_bytes(job, st.layers, b, m, len(current.stages))
        cands = _shortlist(net, spares, _slot_neighbours(grid, alive, k, p), int(grid[k, p]), need)
        best = None
        for c in cands.tolist():
            trial_grid = grid.copy()
            trial_grid[k, p] = c
            trial = _with_grid(current, trial_grid)
            e = estimate(trial, net)
            # Slots still holding lost nodes are priced as if those nodes were fine: they are
            # filled in the next steps, and the comparison here is between candidates only.
            if e.feasible and (best is None or e.iteration_s < best[1] * (1 - 1e-12)):
                best = (c, e.iteration_s)
        if best is None:
            return None
        grid[k, p] = best[0]
        alive[k, p] = True
        spares = spares[spares != best[0]]
        current = _with_grid(current, grid)
    est = estimate(current, net)
    return Solved(current, est) if est.feasible else None


def _faster(found: Solved | None, best: Solved | None) -> Solved | None:
    """``found`` when it is a placement and clearly faster than ``best`` (None: nothing yet),
    else ``best``."""
    if found is not None and found.placement is not None and (
            best is None
            or found.estimate.iteration_s < best.estimate.iteration_s * (1 - 1e-12)):
        return found
    return best


def _with_grid(placement: Placement, grid: np.ndarray) -> Placement:
    """The placement with the same layer ranges on the nodes of ``grid`` (K x D)."""
    stages = tuple(Stage(st.lo, st.hi, tuple(int(i) for i in row))
                   for st, row in zip(placement.stages, grid.tolist()))
    return Placement(placement.job, stages, placement.micro_batch, placement.phase)


def _rebalanced(job: Job, net: Network, grid: np.ndarray, b: int | None, cache: GridCache
                ) -> Solved | None:
    """The grid's best placement with layers balanced anew: micro-batch ``b``, or every size
    when None."""
    best = None
    for size in ([b] if b is not None else micro_batches(job, grid.shape[1])):
        best = _faster(evaluate_grid(job, net, grid, size, cache=cache), best)
    return best


def _shrunk(placement: Placement, net: Network, lost: set[int], cache: GridCache
            ) -> Solved | None:
    """The best of: the grid without the lost nodes' replicas (columns), or without their
    stages (rows); layers re-balanced, every micro-batch size."""
    grid = placement.node_matrix()
    hit = np.isin(grid, list(lost))
    best = None
    for keep in (grid[:, ~hit.any(axis=0)], grid[~hit.any(axis=1), :]):
        if keep.size == 0:
            continue
        best = _faster(_rebalanced(placement.job, net, keep, None, cache), best)
    return best


def refine_pools(net: Network, labels: np.ndarray, group: np.ndarray, free: np.ndarray
                 ) -> tuple[list[np.ndarray], list[int]]:
    """Node pools the refinement tries, most local first (the search's
    :func:`~planner.search.grow.neighbourhood_pools`): the job's nodes; plus the free nodes of
    its clusters; plus those of the 1 and 2 nearest other clusters; and the
    ``MIGRATE_CLUSTERS`` largest free clusters elsewhere on their own (a job that wants many
    nodes joined by fast links may do better there). Also the indices of the pools that get
    the dense re-solve whatever their first score: its own neighbourhood and the migrations."""
    pools, own, moves = neighbourhood_pools(net, labels, group, free, nearest=(1, 2),
                                            migrate=MIGRATE_CLUSTERS, larger_than_own=False)
    return pools, [own] + moves


def _refined(start: Placement, net: Network, free: np.ndarray, labels: np.ndarray,
             restored: bool, cache: GridCache) -> Solved | None:
    """A bounded local search from ``start``: every pool of :func:`refine_pools` re-solved at
    the search's NORMAL effort with the start's (D, b) as the hint, then the search's dense
    re-solve (:func:`deep_solve`) on the job's own neighbourhood, the migrations and the most
    promising other pool (the costly step: 0.01-0.4 s each at 1,000 servers), and the other
    pools while the servers of all dense re-solves stay within ``DEEP_NODE_BUDGET``. ``restored``: a spare made the job about as fast as before the loss
    (``RESTORED_WITHIN``); its neighbourhood is then the one the search already refined, and
    gets no dense re-solve.
    The best placement found, or None when nothing beats ``start``."""
    job = start.job
    hint = (start.replicas, start.micro_batch)
    group = np.unique(np.array(start.nodes, dtype=np.int64))
    pools, deep = refine_pools(net, labels, group, free)
    best: Solved | None = None
    scored = []
    for k, pool in enumerate(pools):
        solved = solve_group(job, net, pool, Effort.NORMAL, hint, labels[pool], cache=cache)
        scored.append((solved.estimate.iteration_s, k))
        best = _faster(solved, best)
    promising = min(scored)[1]
    if promising > deep[0]:   # the job's own nodes alone are inside its neighbourhood's pool
        deep.append(promising)
    if restored:
        deep = deep[1:]
    # The other pools too while the dense re-solves stay small: their first scores often tie,
    # and for a small job the dense re-solve of a wider pool can find what NORMAL does not.
    size = sum(pools[k].size for k in set(deep))
    for k in range(len(pools)):
        if k not in deep and k > 0 and size + pools[k].size <= DEEP_NODE_BUDGET:
            deep.append(k)
            size += pools[k].size
    for k in sorted(set(deep)):
        pool = pools[k]
        best = _faster(deep_solve(job, net, pool, labels[pool], hint, cache=cache), best)
    return best


def repair_job(placement: Placement, net: Network, lost: set[int], free: np.ndarray, *,
               refine: bool = True, labels: np.ndarray | None = None) -> JobRepair:
    """Repair one job whose ``placement`` lost the nodes ``lost`` (full network indices) using
    only ``free`` nodes (neither down nor another job's) besides its surviving ones.
    ``labels``: the network's locality clusters (:func:`network_clusters`), when the caller
    has them. The solver's answers are kept for this call only (a GridCache of its own)."""
    lost = {i for i in lost if i in set(placement.nodes)}
    before = estimate(placement, net).job_s
    if not lost:
        return JobRepair(placement, "unchanged", before, before)
    survivors = np.array(sorted(set(placement.nodes) - lost), dtype=np.int64)
    # Spares: free nodes that are not the job's own (the lost ones included).
    free = np.setdiff1d(np.asarray(free, dtype=np.int64), np.array(placement.nodes, dtype=np.int64))
    cache = GridCache(net)
    found: dict[str, Solved] = {}
    sub = substitutes(placement, net, lost, free)
    if sub is not None:
        balanced = _rebalanced(placement.job, net, sub.placement.node_matrix(),
                               placement.micro_batch, cache)
        if balanced and balanced.estimate.iteration_s < sub.estimate.iteration_s * (1 - 1e-9):
            sub = balanced
        found["substitute"] = sub
    shrunk = _shrunk(placement, net, lost, cache)
    if shrunk is not None:
        found["shrink"] = shrunk
    if refine and found:
        start = min(found.values(), key=lambda f: f.estimate.iteration_s).placement
        # Survivors a shrink left out are free again for the refinement.
        spare = np.setdiff1d(np.union1d(free, survivors), np.array(start.nodes, dtype=np.int64))
        labels = network_clusters(net) if labels is None else labels
        restored = ("substitute" in found
                    and found["substitute"].estimate.job_s <= before * (1 + RESTORED_WITHIN))
        refined = _refined(start, net, spare, labels, restored, cache)
        if refined is not None:
            found["refine"] = refined
    if not found:
        return JobRepair(None, "no spare node has the memory and the surviving nodes cannot "
                               "hold the job", float("inf"), before)
    step = min(found, key=lambda s: (found[s].estimate.iteration_s, STEPS.index(s)))
    p, e = found[step]
    return JobRepair(Placement(p.job, p.stages, p.micro_batch, placement.phase), step, e.job_s,
                     before)


def repair_jobs(plan: Plan, net: Network, affected: Iterable[Job], down: Iterable[str], *,
                search: Planner, seed: int = 0, refine: bool = True) -> Replan:
    """:func:`replan_jobs` with a warm start: each affected job with a placement in ``plan`` is
    repaired (:func:`repair_job`, in name order, each on the nodes the others leave free); the
    others, and any that cannot be repaired, are re-planned in full with ``search``."""
    affected = sorted(affected, key=lambda j: j.name)
    down = sorted(set(down))
    down_idx = {net.index[n] for n in down if n in net.index}
    by_name = {p.job.name: p for p in plan.placements}
    placements = list(plan.placements)
    labels = network_clusters(net) if any(j.name in by_name for j in affected) else None
    repaired, notes, rest = [], [], []
    for job in affected:
        old = by_name.get(job.name)
        if old is None or uses_islands(job):   # islands are placed by the full search only
            rest.append(job)
            continue
        result = repair_job(Placement(job, old.stages, old.micro_batch, old.phase), net,
                            down_idx & set(old.nodes),
                            free_nodes(Plan(plan.method, placements), net, job.name, down_idx),
                            refine=refine, labels=labels)
        if result.placement is None:
            rest.append(job)
            notes.append(f"repair of {job.name} failed ({result.step}): re-planned in full")
            continue
        if result.step == "unchanged":   # no lost node: it keeps its roles
            continue
        placements = [result.placement if p.job.name == job.name else p for p in placements]
        repaired.append(job.name)
        gone = sorted(net.ids[i] for i in down_idx & set(old.nodes))
        notes.append(f"repaired {job.name} without {gone} ({result.step}): "
                     f"{result.before_s:.0f} s -> {result.job_s:.0f} s")
    base = Plan(plan.method, placements, list(plan.unplaced), notes=plan.notes + notes)
    full = replan_jobs(base, net, rest, down, search=search, seed=seed) if rest else \
        Replan(base, [], [], [])
    changed = set(repaired) | {j.name for j in rest}
    return Replan(plan=full.plan, replanned=sorted(repaired + full.replanned),
                  kept=sorted(p.job.name for p in plan.placements if p.job.name not in changed),
                  lost=full.lost)
