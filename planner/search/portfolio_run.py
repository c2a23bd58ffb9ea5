"""Running the portfolio's work (planner.search.portfolio): its starts and baselines, in this
process or in forked workers (planner.search.workers), and the work budget of the default mode.

The work budget. In the default mode every start other than the heuristic may have the solver
score at most :data:`START_WORK_SHARE` of the grid slots the heuristic start had it score, and
at least :data:`MIN_START_WORK`: a start then costs well under a plain search, so the default
takes about the plain search's wall time where a second core is free and not much more where
none is, and the budget is counted, never timed, so the plan does not depend on the machine.
The unit is one slot of a grid the solver scores (planner.search.groups.GridCache: a candidate
arrangement of K stages x D replicas counts K x D, answered from the table or not): its cost
grows with the grid, as the solver's does. A start is stopped at the first of its search's stop
checks past its budget (a valid plan: the refinement between two steps; a constructive start
whose grouping was not complete gives none). Where the heuristic start runs beside it, a start
that gets ahead of what the heuristic's count so far allows waits for it to go on or end, so it
stops where it would have stopped had the heuristic finished first.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hulk.errors import HulkError
from planner.core.costmodel import estimate_plan
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, PlanFacts
from planner.search import algorithm1 as alg1
from planner.search.groups import GridCache
from planner.search.options import SearchOptions
from planner.search.starts import baseline_plan, greedy_grouping
from planner.search.workers import Notice, StartWorkers

# Where a greedy start wins on the benchmark fleets it has its plan within a third of the
# heuristic start's work (the paper's 6 jobs on 90 servers: 18,774 of 60,958 grid slots).
START_WORK_SHARE = 0.4
# A constructive start finishes on a fleet of a few servers (the WAN lab's five: 3,297 grid
# slots, a tenth of a second), where the heuristic start may score only a hundred.
MIN_START_WORK = 4000
WAIT_S = 0.001   # a start ahead of the heuristic's count looks again this often


@dataclass(frozen=True)
class Start:
    """One start of the portfolio: its name and class scores (None: the heuristic's)."""

    index: int
    name: str
    scores: np.ndarray | None
    build: str | None = None    # a constructive start's order (planner.search.starts)


@dataclass(frozen=True)
class StartResult:
    """What one refined start (or baseline) gave: its plan, that plan's makespan, the seconds
    it took and whether a time stop cut it short (``started`` False: the stop came before it
    began; ``final`` False: the best plan so far of a start still being refined; ``capped``:
    its work budget ended it, which depends only on the inputs)."""

    index: int
    name: str
    makespan_s: float
    plan: Plan | None
    seconds: float
    cut_short: bool
    error: str | None = None
    started: bool = True
    final: bool = True   # False: a snapshot of a start still being refined
    capped: bool = False


class WorkGrids(GridCache):
    """A GridCache that counts the slots of the grids asked of it (the work budget's unit):
    every request but those the answers make themselves, whether the table holds the answer or
    not, so a start's count depends only on what it does."""

    def __init__(self, net: Network):
        super().__init__(net)
        self.asked = 0
        self._depth = 0

    def answer(self, table, fn, job, grid, b, trim):
        if self._depth == 0:
            self.asked += int(grid.size)
        self._depth += 1
        try:
            return super().answer(table, fn, job, grid, b, trim)
        finally:
            self._depth -= 1


class Budget:
    """The work budget of one start (module docstring): ``heuristic()`` gives the heuristic
    start's count so far and whether it has ended; ``stopped()`` is a stop for other reasons
    (a time budget, the planner gone)."""

    def __init__(self, grids: WorkGrids, heuristic: Callable[[], tuple[float, bool]],
                 stopped: Callable[[], bool] = lambda: False):
        self.grids, self.heuristic, self.stopped = grids, heuristic, stopped
        self.base = grids.asked
        self.reached = False

    def __call__(self) -> bool:
        used = self.grids.asked - self.base
        while True:
            count, ended = self.heuristic()
            if used <= max(MIN_START_WORK, START_WORK_SHARE * count):   # the count only grows
                return self.stopped()
            if ended or self.stopped():
                self.reached = ended
                return True
            time.sleep(WAIT_S)


def _snapshots(start: Start, jobs: list[Job], net: Network, t0: float,
               send: Callable[[StartResult], None]):
    """A plan_search ``snapshot`` callback that sends ``start``'s best plan so far (its phases'
    job states) whenever its makespan drops: what a stopped start gives."""
    from planner.search.refine import phase_placements, phases_makespan

    best = [math.inf]

    def snapshot(phase_states) -> None:
        quick = phases_makespan(phase_states)
        if not quick < best[0] * (1 - 1e-9):
            return
        best[0] = quick
        placements = phase_placements([x for x in phase_states if x], jobs)
        makespan = estimate_plan(placements, net).makespan_s
        send(StartResult(start.index, start.name, makespan,
                         Plan("search", placements, facts=PlanFacts(cut_short=True)),
                         time.monotonic() - t0, True, final=False))

    return snapshot


def run_start(start: Start, jobs: list[Job], net: Network, search: SearchOptions,
              should_stop: Callable[[], bool] | None,
              send: Callable[[StartResult], None] | None = None, *,
              grids: GridCache | None = None) -> StartResult:
    """Refine one start: its grouping, then the search's refinement (run with ``search``) until
    ``should_stop()`` (None: to its end; the heuristic start, the plain search, always runs to
    its end, so the portfolio is never worse than `search`). With ``send``, its best plan so far
    is also sent whenever it improves. A ``should_stop`` that is a :class:`Budget` marks the
    result ``capped`` when the budget ended it. Algorithm 1's remarks on jobs a start's scores
    gave no node say nothing about the plan and are left out. ``grids``: the solver's answers
    shared with the other starts run in this process."""
    from planner.search.refine import search_sharing

    t0 = time.monotonic()
    if should_stop is not None and should_stop():
        return StartResult(start.index, start.name, math.inf, None, 0.0, False, started=False)
    capped = isinstance(should_stop, Budget)
    try:
        initial = None
        if start.scores is not None:
            initial = dataclasses.replace(alg1.algorithm1(
                jobs, net, start.scores, labels=alg1.component_labels(net)), unscored=())
        if start.build is not None:
            initial = greedy_grouping(jobs, net, start.build, options=search,
                                      should_stop=should_stop, grids=grids)
            if initial is None:   # stopped before its grouping was complete: no plan
                return StartResult(start.index, start.name, math.inf, None,
                                   time.monotonic() - t0, not capped, capped=capped)
        plan = search_sharing(jobs, net, grids, options=search, initial=initial,
                              should_stop=should_stop, snapshot=None if send is None
                              else _snapshots(start, jobs, net, t0, send))
    except HulkError as exc:
        return StartResult(start.index, start.name, math.inf, None, time.monotonic() - t0,
                           False, str(exc))
    makespan = estimate_plan(plan.placements, net).makespan_s if plan.placements else 0.0
    if capped and should_stop.reached:   # stopped by its work budget: no time stop
        plan = dataclasses.replace(plan, notes=[n for n in plan.notes if "budget_s" not in n],
                                   facts=dataclasses.replace(plan.facts, cut_short=False))
    return StartResult(start.index, start.name, makespan, plan, time.monotonic() - t0,
                       plan.facts.cut_short, capped=capped and should_stop.reached)


def run_baseline(index: int, name: str, jobs: list[Job], net: Network, seed: int,
                 plan: Plan | None = None) -> StartResult:
    """Baseline ``name``'s plan as a finished candidate (``plan``: the caller's, else made
    now); a plan that leaves a job out is no candidate."""
    from planner.core.evaluate import evaluate

    t0 = time.monotonic()
    if plan is None:
        plan = baseline_plan(name, jobs, net, seed)
    if plan is None or plan.unplaced:
        return StartResult(index, name, math.inf, None, time.monotonic() - t0, False,
                           f"{name}: no plan of every job")
    if any(p.job.sync.mode == "diloco" and p.outer is None for p in plan.placements):
        return StartResult(index, name, math.inf, None, time.monotonic() - t0, False,
                           f"{name}: synchronous placements of a sync: diloco job")
    makespan = evaluate(plan, net).makespan_s
    return StartResult(index, name, makespan, plan if math.isfinite(makespan) else None,
                       time.monotonic() - t0, False)


@dataclass(frozen=True)
class Work:
    """What one portfolio run refines and judges: its starts (built lazily: a forked worker
    builds them itself), the baselines made during the run (by name), and whether the starts
    other than the heuristic have a work budget (the default mode)."""

    jobs: list[Job]
    net: Network
    search: SearchOptions
    seed: int
    build_starts: Callable[[], list[Start]]
    count: int
    baselines: tuple[str, ...]
    budgeted: bool

    @property
    def total(self) -> int:
        return self.count + len(self.baselines)

    def run(self, index: int, starts: list[Start], grids: GridCache,
            should_stop: Callable[[], bool] | None = None, send=None) -> StartResult:
        """Work item ``index``: a start (below ``count``) or a baseline."""
        if index >= self.count:
            return run_baseline(index, self.baselines[index - self.count], self.jobs,
                                self.net, self.seed)
        if not starts:
            starts.extend(self.build_starts())
        return run_start(starts[index], self.jobs, self.net, self.search, should_stop, send,
                         grids=grids)


def run_here(work: Work, budget_at: float | None, tick: Callable[[int], None]
             ) -> list[StartResult]:
    """Every work item one after another in this process (``workers=1``, or no fork)."""
    results: list[StartResult] = []
    starts: list[Start] = []
    grids = WorkGrids(work.net)
    stop_at = math.inf if budget_at is None else budget_at
    results.append(work.run(0, starts, grids))
    tick(1)
    done = (grids.asked, True)   # the heuristic's count, final
    for index in range(1, work.total):
        stop = (Budget(grids, lambda: done) if work.budgeted
                else lambda: time.monotonic() >= stop_at)
        results.append(work.run(index, starts, grids, stop))
        tick(len(results))
    return results


def run_forked(work: Work, workers: int, budget_at: float | None,
               tick: Callable[[int], None]) -> list[StartResult]:
    """The heuristic start here, the other work in ``workers - 1`` forked processes
    (planner.search.workers) that build the starts themselves (this process goes straight to
    the plain search). Anytime (``budget_at``): they stream their best plans at the lowest
    priority and at the stop this process takes what has arrived and kills them. Default:
    this process publishes the heuristic's count as it grows (their work budget), then takes
    queued work too, waits for every result and runs here whatever a worker that died left
    undone (planner.search.portfolio's docstring)."""
    anytime = budget_at is not None
    net, total = work.net, work.total
    latest: dict[int, StartResult] = {}
    finished = 0

    def collect(items) -> None:
        nonlocal finished
        for res in items:
            old = latest.get(res.index)
            if old is None or not old.final:
                latest[res.index] = res
                finished += res.final
        if items:
            tick(finished)

    child: list = []   # a worker's starts and grids, made once in each
    notice = Notice()   # the heuristic start's count of grid evaluations so far

    def run_one(index: int, send, should_stop) -> None:
        if not child:
            child.extend(([], WorkGrids(net)))
        stop = (Budget(child[1], notice.read, should_stop)
                if work.budgeted and index < work.count else should_stop)
        send(work.run(index, child[0], child[1], stop, send if anytime else None))

    starts: list[Start] = []
    grids = WorkGrids(net)

    def publish() -> bool:   # the heuristic start's stop check: never stops it
        notice.publish(grids.asked)
        return False

    # The baselines first: the workers take them while this process runs the heuristic start,
    # and the other starts then find this process's table of answers warm.
    queue = list(range(work.count, total)) + list(range(1, work.count))
    try:
        pool = StartWorkers(max(1, min(workers - 1, total - 1)), queue, run_one,
                            budget_at if anytime else math.inf, low_priority=anytime)
    except BaseException:
        notice.close()
        raise
    try:
        collect([work.run(0, starts, grids, publish if work.budgeted else None)])
        done = (grids.asked, True)
        notice.publish(*done)
        while not anytime and (index := pool.take()) is not None:
            stop = Budget(grids, lambda: done) if work.budgeted and index < work.count else None
            collect(pool.poll(0.0) + [work.run(index, starts, grids, stop)])
        stop_at = budget_at if anytime else math.inf
        while pool.running and finished < total and time.monotonic() < stop_at:
            collect(pool.poll(min(stop_at - time.monotonic(), 1.0)))
    finally:
        pool.close()
        notice.close()
    if not anytime:   # a worker that died (killed, out of memory) left these undone
        collect([work.run(i, starts, grids, Budget(grids, lambda: done)
                          if work.budgeted and i < work.count else None)
                 for i in range(1, total) if i not in latest or not latest[i].final])
    return [r for r in latest.values() if r.started]
