"""What one search run carries between its steps: each job's current solution, and the context
(the fleet's components and clusters, the round budget, the wall-clock cap, progress)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.core.costmodel import Estimate, Placement
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.search import algorithm1 as alg1
from planner.search.clusters import network_clusters
from planner.search.groups import EFFORTS, solve_group


@dataclass
class JobState:
    """A job's current solution: its node group, its placement there and the (D, b) it used."""

    job: Job
    group: np.ndarray            # nodes reserved for the job (its placement's nodes)
    placement: Placement
    est: Estimate
    hint: tuple[int, int]

    @classmethod
    def of(cls, job: Job, placement: Placement, est: Estimate) -> JobState:
        """The state of ``job`` placed by ``placement``: its group is the placement's nodes."""
        return cls(job, np.array(sorted(placement.nodes), dtype=np.int64), placement, est,
                   (placement.replicas, placement.micro_batch))


class SearchRun:
    """The context of one plan_search call: jobs, fleet, connected components and locality
    clusters, rounds allowed for moves, the wall-clock safety cap and the progress callback."""

    def __init__(self, jobs: list[Job], net: Network, budget_s: float | None = None,
                 max_rounds: int | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None):
        self.jobs, self.net = jobs, net
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.should_stop = should_stop
        self.max_rounds = max_rounds if max_rounds is not None else 12 + 6 * len(jobs)
        self.progress = progress
        self.components = alg1.component_labels(net)
        self.labels = network_clusters(net)
        self.cut_short = False
        self._solved: dict[tuple, tuple[Placement | None, Estimate]] = {}
        self.snapshot: Callable[[list[dict[str, JobState]]], None] | None = None
        self.chains = True   # step 7 (planner.search.chain) after growing the bottleneck

    def critical(self, states: dict[str, JobState]) -> tuple[str, dict[str, float], np.ndarray]:
        """The job that sets the makespan, every job's time, and the nodes no job uses in the
        critical job's connected component (where it may grow or move)."""
        used = np.zeros(self.net.n, dtype=bool)
        for s in states.values():
            used[s.group] = True
        times = {name: s.est.job_s for name, s in states.items()}
        crit = max(times, key=lambda k: (times[k], k))
        comp = self.components[states[crit].group[0]]
        return crit, times, np.flatnonzero(~used & (self.components == comp))

    def out_of_time(self) -> bool:
        """True once the safety cap has passed or the caller's ``should_stop()`` says so (and then
        remembers that the plan was cut short)."""
        if (self.deadline is not None and time.monotonic() > self.deadline) or \
                (self.should_stop is not None and self.should_stop()):
            self.cut_short = True
            return True
        return False

    def solve(self, job: Job, nodes: np.ndarray, effort: str = "fast",
              hint: tuple[int, int] | None = None) -> tuple[Placement | None, Estimate]:
        """The best placement of ``job`` on (a subset of) ``nodes`` at ``effort``. A pure
        function of its arguments: a repeat (one solve in ten on a 1,000-server fleet: moves
        tried again in a later round) is answered from this run's table."""
        nodes = np.unique(nodes)
        key = (job, nodes.tobytes(), effort, hint)
        answer = self._solved.get(key)
        if answer is None:
            answer = solve_group(job, self.net, nodes, EFFORTS[effort], hint, self.labels[nodes])
            self._solved[key] = answer
        return answer

    def state(self, job: Job, nodes: np.ndarray, effort: str = "normal") -> JobState | None:
        """:meth:`solve` as a JobState; None when ``nodes`` cannot hold the job."""
        p, e = self.solve(job, nodes, effort)
        if p is None:
            return None
        return JobState.of(job, p, e)
