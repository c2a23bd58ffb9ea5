"""What one search run carries between its steps: each job's current solution, and the context
(the fleet's components and clusters, the options, the round budget, the wall-clock cap,
progress) with the run's own tables of answers (solves, and the solver's grids)."""

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
from planner.search.groups import GridCache, Solved, cache_for, deep_solve, solve_group
from planner.search.islands import uses_islands, with_islands
from planner.search.options import Effort, SearchOptions


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
        # An island layout's hint is its largest island: the solver's synchronous placements
        # it guides are one island's size (planner.search.islands).
        replicas = max(placement.islands) if placement.islands else placement.replicas
        return cls(job, np.array(sorted(placement.nodes), dtype=np.int64), placement, est,
                   (replicas, placement.micro_batch))


class SearchRun:
    """The context of one plan_search call: jobs, fleet, connected components and locality
    clusters, the options (rounds allowed for moves, the wall-clock safety cap, the steps on),
    the callbacks, and the answers this run has computed (its own: nothing is kept on the
    network, so runs never share state)."""

    def __init__(self, jobs: list[Job], net: Network, options: SearchOptions = SearchOptions(),
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 snapshot: Callable[[list[dict[str, JobState]]], None] | None = None,
                 grids: GridCache | None = None):
        self.jobs, self.net, self.options = jobs, net, options
        self.deadline = None if options.budget_s is None else time.monotonic() + options.budget_s
        self.should_stop = should_stop
        self.max_rounds = options.max_rounds if options.max_rounds is not None \
            else 12 + 6 * len(jobs)
        self.progress = progress
        self.snapshot = snapshot
        self.components = alg1.component_labels(net)
        self.labels = network_clusters(net)
        self.cut_short = False
        self.grids = cache_for(net, grids)   # shareable: answers are pure
        self._solved: dict[tuple, Solved] = {}

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

    def solve(self, job: Job, nodes: np.ndarray, effort: Effort = Effort.FAST,
              hint: tuple[int, int] | None = None) -> Solved:
        """The best placement of ``job`` on (a subset of) ``nodes`` at ``effort``. A pure
        function of its arguments: a repeat (one solve in ten on a 1,000-server fleet: moves
        tried again in a later round) is answered from this run's table."""
        nodes = np.unique(nodes)
        key = (job, nodes.tobytes(), effort, hint)
        answer = self._solved.get(key)
        if answer is None:
            answer = solve_group(job, self.net, nodes, effort, hint, self.labels[nodes],
                                 options=self.options, cache=self.grids)
            if uses_islands(job):
                answer = with_islands(job, self.net, nodes, self.labels[nodes], answer,
                                      self.grids)
            self._solved[key] = answer
        return answer

    def deep(self, job: Job, nodes: np.ndarray, hint: tuple[int, int] | None = None) -> Solved:
        """The dense re-solve (planner.search.groups.deep_solve) of ``job`` on all of ``nodes``
        (for a low-communication job, against its island layouts: planner.search.islands)."""
        answer = deep_solve(job, self.net, nodes, self.labels[nodes], hint, options=self.options,
                            cache=self.grids)
        if uses_islands(job):
            nodes = np.unique(np.asarray(nodes, dtype=np.int64))
            answer = with_islands(job, self.net, nodes, self.labels[nodes], answer,
                                      self.grids)
        return answer

    def state(self, job: Job, nodes: np.ndarray, effort: Effort = Effort.NORMAL
              ) -> JobState | None:
        """:meth:`solve` as a JobState; None when ``nodes`` cannot hold the job."""
        p, e = self.solve(job, nodes, effort)
        if p is None:
            return None
        return JobState.of(job, p, e)
