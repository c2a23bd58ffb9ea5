"""Step 2 of the search: heuristic class scores that seed Algorithm 1.

Nodes in locality order (connected component, clusters along an open path from the one with
the most throughput, each cluster fastest first) are cut into contiguous segments, one per job,
sized by the job's share of all FLOPs so that jobs finish together, and never so large that the
jobs after it no longer fit in what is left.
"""

from __future__ import annotations

import numpy as np

from hulk.errors import PlanningError
from hulk.plural import count
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.search import algorithm1 as alg1
from planner.search.clusters import network_clusters, ordered_clusters


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
        for cl in ordered_clusters(net, members, labels[members], from_biggest=True):
            order_parts.append(cl)
    order = np.concatenate(order_parts)
    flops = np.array([j.total_flops for j in jobs])
    total_thr = float(net.thr[order].sum())
    mean_mem = float(net.mem[order].mean())
    if mean_mem <= 0:   # every need below is relative to it; and no node could hold a layer
        raise PlanningError(f"none of the {count(n, 'node')} has GPU memory: no job can be placed")
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
