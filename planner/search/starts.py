"""Constructive starts for the portfolio (planner.search.portfolio): groupings built one job at a
time, each job taking the best placement the per-group solver finds on the nodes still free.

Where Algorithm 1 cuts the fleet by class scores, these starts let the solver choose each job's
spot outright: the first job in the order gets the best spot of the whole fleet, the next one
the best of what is left, and so on. On fleets spread over many regions that often puts the job
that sets the makespan somewhere the heuristic grouping never reaches, and the refinement starts
close to its end (it takes less time than from the heuristic grouping). Two orders:

- ``greedy-flops``: most total FLOPs first (the job most likely to set the makespan);
- ``greedy-memory``: largest memory threshold first (the hardest job to fit, as Algorithm 1
  visits them).

A job that fits on none of the nodes left waits for the next phase, which starts with the whole
fleet free again. Deterministic: the order breaks ties by the job's place in the list and the
solver is deterministic.

The built-in baselines (:func:`baseline_names`, :func:`baseline_plan`: Systems A/B/C and the
DT-FM-style peer, as `plan --compare` runs them) are the portfolio's finished candidates, so its
plan is never one of theirs beats under the same cost model.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hulk.errors import HulkError, PlanningError
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.search import algorithm1 as alg1
from planner.search.groups import GridCache
from planner.search.options import Effort, SearchOptions
from planner.search.state import SearchRun

GREEDY_ORDERS = ("greedy-flops", "greedy-memory")
GREEDY_EFFORT = Effort.NORMAL   # FAST is cheaper but lands farther from the best spot


def greedy_order(jobs: list[Job], order: str) -> list[Job]:
    """``jobs`` in the order ``order`` (one of :data:`GREEDY_ORDERS`) places them."""
    rank = {id(j): k for k, j in enumerate(jobs)}
    if order == "greedy-flops":
        return sorted(jobs, key=lambda j: (-j.total_flops, rank[id(j)]))
    if order == "greedy-memory":
        return sorted(jobs, key=lambda j: (-alg1.memory_threshold(j), rank[id(j)]))
    raise ValueError(f"unknown greedy order {order!r}; expected one of {GREEDY_ORDERS}")


def _home(job: Job, net: Network, free: np.ndarray, components: np.ndarray) -> np.ndarray | None:
    """The free nodes of the connected component with the most free throughput among those
    where ``job`` fits; None when it fits in none."""
    best, best_thr = None, -1.0
    for c in np.unique(components[free]):
        members = free[components[free] == c]
        thr = float(net.thr[members].sum())
        if thr > best_thr and alg1.fits(job, net, members):
            best, best_thr = members, thr
    return best


def greedy_grouping(jobs: list[Job], net: Network, order: str, *,
                    options: SearchOptions = SearchOptions(),
                    should_stop: Callable[[], bool] | None = None,
                    grids: GridCache | None = None) -> alg1.Grouping | None:
    """A Grouping built job by job in ``order`` (module docstring), the solver run with
    ``options`` (``grids``: a GridCache shared with other runs on ``net``); None when
    ``should_stop()`` turned true before it was complete. Raises PlanningError when a job fits
    nowhere."""
    run = SearchRun(jobs, net, options, grids=grids)
    groups: dict[str, tuple[int, ...]] = {}
    phase_of: dict[str, int] = {}
    pending = greedy_order(jobs, order)
    phase = 0
    while pending:
        free = np.ones(net.n, dtype=bool)
        waiting = []
        for job in pending:
            if should_stop is not None and should_stop():
                return None
            home = _home(job, net, np.flatnonzero(free), run.components)
            placement = None if home is None else run.solve(job, home, GREEDY_EFFORT).placement
            if placement is None:
                waiting.append(job)
                continue
            nodes = np.array(sorted(placement.nodes), dtype=np.int64)
            free[nodes] = False
            groups[job.name] = tuple(int(i) for i in nodes)
            phase_of[job.name] = phase
        if len(waiting) == len(pending):   # the whole fleet was free: they can never fit
            raise PlanningError(f"jobs {[j.name for j in waiting]} fit on no connected part "
                                "of the fleet")
        pending, phase = waiting, phase + 1
    return alg1.Grouping(groups, phase_of, [])


def baseline_names(n_nodes: int) -> list[str]:
    """The baselines `plan --compare` runs on a fleet of ``n_nodes`` servers (planner.methods)."""
    from planner.methods import compared_methods
    from planner.search.scale import SCALE_NODE_LIMIT

    return compared_methods("portfolio", n_nodes, SCALE_NODE_LIMIT)[0]


def baseline_plan(name: str, jobs: list[Job], net: Network, seed: int) -> Plan | None:
    """Baseline ``name``'s plan of ``jobs`` on ``net`` (with ``seed`` where it takes one), as
    `plan --compare` makes it on a fleet within the scale limit; None where it plans nothing."""
    from planner.methods import METHODS

    method = METHODS[name]
    kwargs = dict(method.fixed, **({"seed": seed} if method.seeded else {}))
    try:
        return method.load()(list(jobs), net, **kwargs)
    except HulkError:
        return None
