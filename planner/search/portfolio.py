"""A portfolio of starts for the search (``--method portfolio``): where the refinement starts
decides where it ends, so several starts are refined and the best plan wins.

The starts, in this order (the index breaks ties between equal makespans):

0. ``heuristic``: the search's own heuristic scores (planner.search.heuristics), so the
   portfolio's plan is never worse than ``plan_search``'s;
1. caller-supplied class scores (``extra_starts``, e.g. the GNN's), in the order given;
2. ``uniform``: every class equal and "idle" winning the tie: Algorithm 1 grows every job from
   nothing, hardest first, and the refinement spreads them out;
3. ``random-1``, ``random-2`` ...: seeded random class scores, alternately per node and per
   locality cluster (planner.search.clusters).

Each start is Algorithm 1 on its scores and then the search's refinement (plan_search with
``initial=scores``). The heuristic start runs in the calling process, the others in worker
processes (``workers`` processes in all, the caller's included; default every core this process
may use, ``os.sched_getaffinity``); with ``workers=1`` they run one after another here. The winner is the lowest (makespan by the reference cost model,
start index).

How many starts (decided before anything runs):

- ``starts`` given: that many;
- ``budget_s`` given: as many as fit it by a size-based estimate of one start's seconds
  (:func:`start_cost_s`, :func:`start_count`);
- neither (the default of `hulk-planner plan`): one start per usable core, at least
  :data:`DEFAULT_MIN_STARTS` (heuristic and uniform), plus the caller's extra starts
  (:func:`default_start_count`). On a 2-core machine the heuristic and uniform starts run side
  by side, so with both cores free the portfolio takes about the plain search's wall time (on a
  busy machine the starts share what is left: up to twice as long).

The stop. The heuristic start is never stopped: it is the plain search, so the portfolio always
returns a valid plan at least as good as ``plan_search``'s. Every other start is stopped where
it is (between refinement rounds, keeping its best plan so far, valid) once the stop time has
passed: with an explicit ``budget_s``, ``budget_s`` after the start; with the default budget,
the later of :func:`default_budget_s` (the size-based estimate of one start) and :data:`STRETCH`
times the heuristic start's own seconds, and never before the heuristic start has finished;
both are multiplied by the number of waves the other starts need on the processes left for
them (1 with the default number of starts; 3 for ``starts=4, workers=2``).
Stops are checked between refinement rounds and between candidate moves; a start still busy
:data:`GRACE` times the stop time later is dropped.

Determinism. The starts are fixed by the inputs, ``seed`` and their number (which, by default,
follows the number of usable cores: pass ``starts`` to fix it across machines). When no start
is stopped, the plan depends only on those, never on ``workers`` or the machine's load. When a
start is stopped or dropped, a note on the plan says so and the plan may differ between runs
(it is still never worse than the plain search's).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hulk.errors import HulkError, PlanningError
from planner.core.costmodel import estimate_plan
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan

MIN_STARTS = 3       # with a budget given: heuristic, uniform, one random at least
DEFAULT_MIN_STARTS = 2   # by default: heuristic and uniform at least
MAX_STARTS = 32
REFERENCE_CORES = 2  # the start count for a given budget assumes a host with this many cores
# With the default budget, the stop comes this many times the heuristic start's own seconds
# (the plain search's time) after the start when that is later than the size-based estimate.
STRETCH = 1.5
DEFAULT_BUDGET_FACTOR = 0.25
GRACE = 0.1          # a stopped start may take this fraction of the stop time more to return
POLL_S = 0.05


@dataclass(frozen=True)
class Start:
    """One start of the portfolio: its name and class scores (None: the heuristic's)."""

    index: int
    name: str
    scores: np.ndarray | None


@dataclass(frozen=True)
class StartResult:
    """What one refined start gave: its plan, that plan's makespan, the seconds it took and
    whether the safety stop cut it short."""

    index: int
    name: str
    makespan_s: float
    plan: Plan | None
    seconds: float
    cut_short: bool
    error: str | None = None


def start_cost_s(n_nodes: int, n_jobs: int) -> float:
    """A rough, size-based estimate of one start's seconds on one core of a 2-core development
    machine: plan_search's times at 47-5,000 nodes, doubled because starts other than the
    heuristic often take up to twice as long. The number of starts (explicit budget) and the
    default stop depend on it, never the plan of a start that is not stopped."""
    jobs = max(1, n_jobs)
    return 2 * (0.25 * math.sqrt(jobs) + 3.4e-4 * max(1, n_nodes) ** 1.31 * math.sqrt(jobs / 8))


def default_budget_s(n_nodes: int, n_jobs: int) -> float:
    """The default budget: :data:`DEFAULT_BUDGET_FACTOR` times the size-based estimate of one
    start's seconds (:func:`start_cost_s`, which is generous on an idle machine). With it the other starts may also run to :data:`STRETCH` times the
    heuristic start's own seconds (module docstring)."""
    return DEFAULT_BUDGET_FACTOR * start_cost_s(n_nodes, n_jobs)


def start_count(n_nodes: int, n_jobs: int, budget_s: float, extra: int = 0) -> int:
    """How many starts fit an explicit ``budget_s`` on :data:`REFERENCE_CORES` cores
    (MIN_STARTS..MAX_STARTS, plus the caller's extra starts)."""
    fit = int(budget_s * REFERENCE_CORES / start_cost_s(n_nodes, n_jobs))
    return extra + max(MIN_STARTS, min(MAX_STARTS, fit))


def default_start_count(cores: int, extra: int = 0) -> int:
    """The default number of starts: one per usable core, at least :data:`DEFAULT_MIN_STARTS`
    (heuristic and uniform), at most :data:`MAX_STARTS`, plus the caller's extra starts."""
    return extra + max(DEFAULT_MIN_STARTS, min(MAX_STARTS, cores))


def portfolio_starts(jobs: list[Job], net: Network, *, seed: int, count: int,
                     extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                     labels: np.ndarray | None = None) -> list[Start]:
    """The first ``count`` starts in portfolio order (see the module docstring)."""
    from planner.search.clusters import network_clusters

    n, width = net.n, len(jobs) + 1
    starts = [Start(0, "heuristic", None)]
    for name, scores in extra_starts:
        scores = np.asarray(scores, dtype=float)
        if scores.shape != (n, width):
            raise PlanningError(f"start {name!r}: scores must have shape ({n}, {width}), "
                                f"got {scores.shape}")
        starts.append(Start(len(starts), name, scores))
    uniform = np.zeros((n, width))
    uniform[:, -1] = 1e-9   # idle wins the tie
    starts.append(Start(len(starts), "uniform", uniform))
    if labels is None and count > len(starts):
        labels = network_clusters(net)
    k = 0
    while len(starts) < count:
        k += 1
        rng = np.random.default_rng([seed, k])
        if k % 2:
            scores = rng.random((n, width))
        else:
            scores = rng.random((int(labels.max()) + 1, width))[labels]
        starts.append(Start(len(starts), f"random-{k}", scores))
    return starts[:max(1, count)]


# ----------------------------------------------------------------------------------- workers

_WORKER: dict = {}


class _Cell:
    """The stop time when starts run in this process (a shared RawValue in workers): the
    time.monotonic (system-wide on Linux) after which starts other than the heuristic stop."""

    def __init__(self, value: float):
        self.value = value


def _init_worker(jobs: list[Job], net: Network, max_rounds: int | None, stop_cell) -> None:
    """Pool initializer: the inputs every start shares (inherited, not copied, under fork)."""
    _WORKER.update(jobs=jobs, net=net, max_rounds=max_rounds, stop=stop_cell)


def _run_start(start: Start) -> StartResult:
    """Refine one start (in a worker, or in the caller's process when workers=1)."""
    from planner.search.refine import plan_search

    jobs, net, stop = _WORKER["jobs"], _WORKER["net"], _WORKER["stop"]
    t0 = time.monotonic()
    # The heuristic start is the plain search and always runs to its end: the portfolio is
    # never worse than `search`, however busy the machine.
    should_stop = None if start.index == 0 else (lambda: time.monotonic() >= stop.value)
    try:
        plan = plan_search(jobs, net, max_rounds=_WORKER["max_rounds"], initial=start.scores,
                           should_stop=should_stop)
    except HulkError as exc:
        return StartResult(start.index, start.name, math.inf, None, time.monotonic() - t0,
                           False, str(exc))
    makespan = estimate_plan(plan.placements, net).makespan_s if plan.placements else 0.0
    cut = any("safety cap" in note for note in plan.notes)
    return StartResult(start.index, start.name, makespan, plan, time.monotonic() - t0, cut)


def _pool_context():
    """fork where the platform has it (workers inherit the network without copying it; they
    import nothing new, so torch is never loaded by them); spawn elsewhere."""
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not on Linux
        return max(1, os.cpu_count() or 1)


def _stop_after_heuristic(t0: float, budget_at: float, stretch: float | None,
                          heuristic_s: float) -> float:
    """The stop once the heuristic start is done: the budget's time, or with the default budget
    the later of that and ``stretch`` times the heuristic start's seconds."""
    return budget_at if stretch is None else max(budget_at, t0 + stretch * heuristic_s)


def _run_all(starts: list[Start], jobs, net, max_rounds, workers: int, budget_at: float,
             stretch: float | None, tick: Callable[[int], None]
             ) -> tuple[list[StartResult], int]:
    """Every start refined until the stop (module docstring); returns the results that came
    back and how many starts were dropped."""
    results: list[StartResult] = []
    t0 = time.monotonic()
    # With the default budget the stop is unknown until the heuristic start is done, and it
    # allows one start's time per wave of the other starts on the processes left for them.
    first_stop = budget_at if stretch is None else math.inf
    if stretch is not None:
        others = sum(st.index != 0 for st in starts)
        waves = max(1, math.ceil(others / max(1, workers - 1))) if workers > 1 else max(1, others)
        budget_at, stretch = t0 + (budget_at - t0) * waves, stretch * waves
    if workers <= 1:
        stop_cell = _Cell(first_stop)
        _init_worker(jobs, net, max_rounds, stop_cell)
        try:
            for st in starts:
                if st.index > 0 and time.monotonic() >= stop_cell.value:
                    break
                results.append(_run_start(st))
                if st.index == 0:
                    stop_cell.value = _stop_after_heuristic(t0, budget_at, stretch,
                                                            results[-1].seconds)
                tick(len(results))
        finally:
            _WORKER.clear()
        return results, len(starts) - len(results)
    # The heuristic start runs here (no copy of its plan, no pool in its way), the others in
    # worker processes.
    ctx = _pool_context()
    stop_cell = ctx.RawValue("d", first_stop)
    others = [st for st in starts if st.index != 0]
    pool = ctx.Pool(processes=max(1, min(workers - 1, len(others))), initializer=_init_worker,
                    initargs=(jobs, net, max_rounds, stop_cell))
    try:
        pending = {st.index: pool.apply_async(_run_start, (st,)) for st in others}
        if len(others) < len(starts):
            _init_worker(jobs, net, max_rounds, stop_cell)
            try:
                results.append(_run_start(starts[0]))
            finally:
                _WORKER.clear()
            stop_cell.value = _stop_after_heuristic(t0, budget_at, stretch, results[-1].seconds)
        while pending:
            for index in sorted(pending):
                if pending[index].ready():
                    results.append(pending.pop(index).get())
            tick(len(results))
            # The others are told to stop at the stop time and get GRACE more to hand back
            # their best plan so far.
            stop = stop_cell.value
            if not pending or time.monotonic() >= stop + GRACE * max(stop - t0, 1.0):
                break
            pending[min(pending)].wait(POLL_S)
        return results, len(pending)
    finally:
        pool.terminate()
        pool.join()


@dataclass(frozen=True)
class PortfolioRun:
    """Every refined start's result (in start order), how many starts were dropped at the
    safety stop, the budget and the seconds the run took."""

    results: tuple[StartResult, ...]
    dropped: int
    budget_s: float
    seconds: float

    def best(self) -> StartResult:
        """The winner: lowest (makespan, start index) among the starts that gave a plan."""
        usable = [r for r in self.results if r.plan is not None]
        if not usable:
            raise PlanningError("no start of the portfolio produced a plan")
        return min(usable, key=lambda r: (r.makespan_s, r.index))


def resolve_defaults(n_nodes: int, n_jobs: int, *, budget_s: float | None = None,
                     starts: int | None = None, extra: int = 0,
                     cores: int | None = None) -> tuple[int, float, bool]:
    """(number of starts, budget in seconds, whether the budget is the default) for a fleet of
    ``n_nodes`` and ``n_jobs`` jobs, as the module docstring says; ``cores`` defaults to
    :func:`default_workers`. A pure function of its arguments."""
    default_budget = budget_s is None
    if default_budget:
        budget_s = default_budget_s(n_nodes, n_jobs)
    if not budget_s > 0:
        raise PlanningError(f"the time budget must be positive, got {budget_s}")
    if starts is not None:
        count = starts
    elif default_budget:
        count = default_start_count(cores if cores is not None else default_workers(), extra)
    else:
        count = start_count(n_nodes, n_jobs, budget_s, extra=extra)
    return max(1, count), budget_s, default_budget


def refine_starts(jobs: list[Job], net: Network, *, seed: int = 0,
                  budget_s: float | None = None, workers: int | None = None,
                  starts: int | None = None, max_rounds: int | None = None,
                  extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                  progress: Callable[[int, int], None] | None = None) -> PortfolioRun:
    """Refine every start of the portfolio (arguments as :func:`plan_portfolio`)."""
    count, budget_s, default_budget = resolve_defaults(net.n, len(jobs), budget_s=budget_s,
                                                       starts=starts, extra=len(extra_starts))
    t0 = time.monotonic()
    deadline = t0 + budget_s
    plan_starts = portfolio_starts(jobs, net, seed=seed, count=count, extra_starts=extra_starts)
    workers = min(workers or default_workers(), len(plan_starts))
    total = len(plan_starts)

    def tick(done: int) -> None:
        if progress is not None:
            progress(done, total)

    results, dropped = _run_all(plan_starts, jobs, net, max_rounds, workers, deadline,
                                STRETCH if default_budget else None, tick)
    heuristic = next((r for r in results if r.index == 0), None)
    if heuristic is not None and heuristic.error is not None:
        raise PlanningError(heuristic.error)
    tick(total)
    return PortfolioRun(tuple(sorted(results, key=lambda r: r.index)), dropped, budget_s,
                        time.monotonic() - t0)


def plan_portfolio(jobs: list[Job], net: Network, *, seed: int = 0,
                   budget_s: float | None = None, workers: int | None = None,
                   starts: int | None = None, max_rounds: int | None = None,
                   extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                   progress: Callable[[int, int], None] | None = None) -> Plan:
    """Plan ``jobs`` on ``net`` with the best of a portfolio of refined starts (module docstring).

    ``budget_s``: when the starts other than the heuristic stop (default: see the module
    docstring); given, it also sets the number of starts unless ``starts`` does. ``starts``:
    how many (default one per usable core, at least 2). ``workers``: processes (default all
    usable cores; the plan does not depend on it). ``extra_starts``: (name, class scores
    n x (jobs + 1)) tried right after the heuristic, e.g. the GNN's. ``progress(done, total)``
    is called as starts finish.
    """
    jobs = list(jobs)
    if net.n == 0:
        raise PlanningError("the fleet has no nodes")
    if not jobs:
        return Plan("portfolio", [])
    run = refine_starts(jobs, net, seed=seed, budget_s=budget_s, workers=workers, starts=starts,
                        max_rounds=max_rounds, extra_starts=extra_starts, progress=progress)
    best = run.best()
    heuristic = run.results[0] if run.results and run.results[0].index == 0 else None
    # Algorithm 1's remarks on where a start's scores put nobody say nothing about the plan.
    notes = [note for note in best.plan.notes
             if best.index == 0 or "got no node by score" not in note]
    usable = sum(r.plan is not None for r in run.results)
    notes.append(f"portfolio: best of {usable} refined starts is {best.name!r}"
                 + (f" ({heuristic.makespan_s / best.makespan_s:.2f}x shorter than the "
                    f"heuristic start)" if heuristic is not None and best.index != 0
                    and best.makespan_s > 0 else ""))
    cut = sum(r.cut_short for r in run.results)
    if run.dropped or cut:
        notes.append(f"portfolio: the time budget ran out after {run.seconds:.1f} s (budget "
                     f"{run.budget_s:.1f} s; {cut} start(s) cut short, {run.dropped} dropped); "
                     "the plan is valid but may differ between runs: raise --time-budget or "
                     "lower --starts")
    return Plan("portfolio", best.plan.placements, list(best.plan.unplaced),
                dict(best.plan.job_s_override), dict(best.plan.estimate_override), notes)
