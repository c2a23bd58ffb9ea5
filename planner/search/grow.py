"""Step 6 of the search: growing the job that sets the makespan.

The bottleneck job is re-solved over a dense range of replica counts (:func:`deep_solve`: stage
groups per cluster and per city, trimmed to the fastest rows when extra rows only add hops,
bubble and all-reduce) on its own nodes, plus the idle nodes of its clusters, plus those of the
1, 2 and 4 nearest clusters, or on a larger idle cluster; failing that, a job sharing its
clusters moves to idle clusters and leaves it the nodes. Each step is kept only when the
makespan drops.
"""

from __future__ import annotations

import numpy as np

from planner.core.fleet import Network
from planner.search import algorithm1 as alg1
from planner.search.groups import Solved
from planner.search.options import Effort
from planner.search.state import JobState, SearchRun

GROW_ROUNDS = 6
RELOCATE_NEIGHBOURS = 3     # jobs sharing the bottleneck's clusters that may move out
MIGRATE_CLUSTERS = 2        # larger idle clusters the bottleneck job may move to
RELOCATE_HOMES = 3          # roomiest idle clusters tried as their new home


def grow_bottleneck(run: SearchRun, states: dict[str, JobState]) -> bool:
    """Give idle nodes to the job that sets the makespan and re-solve its configuration over a
    dense range of replica counts (:func:`deep_solve`): first the idle nodes of its own
    clusters (more replicas D inside a cluster), then those of the nearest clusters (longer
    pipelines, or replicas across clusters where the ring S / (D bw) pays). Repeats while the
    makespan drops; True when anything changed."""
    changed = False
    for _ in range(GROW_ROUNDS):
        if run.out_of_time() or not states:
            break
        crit, times, free = run.critical(states)
        cs = states[crit]
        makespan, total = times[crit], sum(times.values())
        best = None
        for pool in _grow_pools(run, cs.group, free):
            if run.out_of_time():
                break
            p, e = run.deep(cs.job, pool, cs.hint)
            if p is None or e.job_s >= makespan * (1 - 1e-9):
                continue
            key = (e.job_s, len(p.nodes))
            if best is None or key < best[0]:
                best = (key, Solved(p, e))
        if best is not None:
            upd = {crit: best[1]}
        elif run.out_of_time():
            break
        else:
            upd = _relocate(run, states, crit, free, makespan)
            if upd is None:
                break
        new_times = dict(times)
        for k, (p, e) in upd.items():
            new_times[k] = e.job_s
        if not (max(new_times.values()) < makespan * (1 - 1e-9)
                or (max(new_times.values()) <= makespan and sum(new_times.values()) < total)):
            break
        for k, (p, e) in upd.items():
            states[k] = JobState.of(states[k].job, p, e)
        changed = True
    return changed


def _relocate(run: SearchRun, states: dict[str, JobState], crit: str, free: np.ndarray,
              makespan: float):
    """Move a job that shares the bottleneck job's clusters onto idle clusters, and give the
    bottleneck job the nodes it leaves there. Returns {job: Solved} for the best such pair that lowers the makespan, else None."""
    net = run.net
    cs = states[crit]
    mine = np.unique(run.labels[cs.group])
    in_mine = np.isin(run.labels, mine)
    outside = free[~in_mine[free]]
    if outside.size == 0:
        return None
    same = free[in_mine[free]]
    neighbours = [k for k in states if k != crit and in_mine[states[k].group].any()]
    neighbours.sort(key=lambda k: (-int(in_mine[states[k].group].sum()), k))
    lab = run.labels[outside]
    free_clusters = sorted(np.unique(lab),
                           key=lambda c: (-float(net.thr[outside[lab == c]].sum()), int(c)))
    best = None
    for name in neighbours[:RELOCATE_NEIGHBOURS]:
        if run.out_of_time():
            break
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
            p, e = run.solve(ds.job, home, Effort.FAST, ds.hint)
            if p is None or e.job_s >= makespan * (1 - 1e-9):
                continue
            if moved is None or (e.job_s, len(p.nodes)) < (moved.estimate.job_s,
                                                           len(moved.placement.nodes)):
                moved = Solved(p, e)
        if moved is None:
            continue
        pool = np.setdiff1d(np.union1d(np.union1d(cs.group, same), ds.group[in_mine[ds.group]]),
                            moved.placement.nodes)
        p, e = run.deep(cs.job, pool, cs.hint)
        if p is None or e.job_s >= makespan * (1 - 1e-9):
            continue
        key = max(e.job_s, moved.estimate.job_s)
        if best is None or key < best[0]:
            best = (key, {crit: Solved(p, e), name: moved})
    return None if best is None else best[1]


def _grow_pools(run: SearchRun, group: np.ndarray, free: np.ndarray) -> list[np.ndarray]:
    """Node pools for the bottleneck job: its group plus the idle nodes of its clusters, then
    plus the idle nodes of the 1, 2 and 4 nearest other clusters, or an idle cluster larger
    than its own (communication-bound jobs want many nodes joined by fast links)."""
    return neighbourhood_pools(run.net, run.labels, group, free, nearest=(1, 2, 4),
                               migrate=MIGRATE_CLUSTERS, larger_than_own=True)[0]


def neighbourhood_pools(net: Network, labels: np.ndarray, group: np.ndarray, free: np.ndarray,
                        *, nearest: tuple[int, ...], migrate: int, larger_than_own: bool
                        ) -> tuple[list[np.ndarray], int, list[int]]:
    """Node pools around ``group``, most local first: the group; plus the free nodes of its
    clusters; plus those of the ``nearest`` (counts) nearest other clusters; then up to
    ``migrate`` of the largest free clusters elsewhere, each on its own (with
    ``larger_than_own`` only those larger than the largest of the group's clusters). Returns
    (pools, the index of the group's own neighbourhood, the indices of the migrations)."""
    mine = np.unique(labels[group])
    same = free[np.isin(labels[free], mine)]
    own = np.union1d(group, same)
    pools = [group] + ([own] if same.size else [])
    own_index = len(pools) - 1
    others = free[~np.isin(labels[free], mine)]
    if others.size == 0:
        return pools, own_index, []
    lab = labels[others]
    dist = net.rtt_ms[np.ix_(others, group)].min(axis=1)
    ranked = sorted(np.unique(lab).tolist(), key=lambda c: (float(dist[lab == c].min()), c))
    for count in nearest:
        if count <= len(ranked):
            pools.append(np.union1d(own, others[np.isin(lab, ranked[:count])]))
    sizes = {c: int((lab == c).sum()) for c in ranked}
    floor = max(int((labels == c).sum()) for c in mine) if larger_than_own else 0
    moves = []
    for c in sorted((c for c in ranked if sizes[c] > floor), key=lambda c: (-sizes[c], c))[:migrate]:
        moves.append(len(pools))
        pools.append(others[lab == c])
    return pools, own_index, moves
