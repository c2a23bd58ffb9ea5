"""A portfolio of starts for the search (``--method portfolio``, the default of `plan`): where
the refinement starts decides where it ends, so several starts are refined and the best plan wins.

The starts, in this order (the index breaks ties between equal makespans):

0. ``heuristic``: the search's own heuristic scores (planner.search.heuristics), so the
   portfolio's plan is never worse than ``plan_search``'s;
1. caller-supplied class scores (``extra_starts``, e.g. the GNN's), in the order given;
2. ``greedy-flops`` and ``greedy-memory``: groupings built one job at a time, each job taking
   the best placement the solver finds on the nodes still free, most FLOPs first and largest
   memory threshold first (planner.search.starts): cheap, and on fleets spread over many
   regions often the best;
3. ``uniform``: every class equal and "idle" winning the tie: Algorithm 1 grows every job from
   nothing, hardest first, and the refinement spreads them out;
4. ``random-1``, ``random-2`` ...: seeded random class scores, alternately per node and per
   locality cluster (planner.search.clusters).

Each start is its grouping (Algorithm 1 on its scores, or the constructive one) and then the
search's refinement (plan_search with ``initial=``). The heuristic start runs in the calling
process, the others in worker processes (``workers`` processes in all, the caller's included;
default every core this process may use, ``os.sched_getaffinity``), each worker taking the next
start in order as it finishes one; with ``workers=1`` they run one after another here. The
winner is the lowest (makespan by the reference cost model, start index).

The stop. The heuristic start is never stopped: it is the plain search, so the portfolio always
returns a valid plan at least as good as ``plan_search``'s. Every other start is stopped where
it is (between refinement rounds and candidate moves, keeping its best plan so far, valid; a
constructive start not yet complete gives none) once the stop time has passed, and a start not
begun by then is dropped:

- by default (the default of `hulk-planner plan`): when the heuristic start finishes, so the
  portfolio takes the plain search's wall time (plus the fork and the grace below); the other
  starts get what the other cores have free meanwhile (workers run at the lowest CPU priority,
  :data:`WORKER_NICE`, so they do not slow the plain search down). :data:`DEFAULT_STARTS`
  starts are queued (or one per usable core where that is more), plus the caller's extra
  starts; with ``workers=1`` the plan is the plain search's;
- with ``budget_s``: ``budget_s`` after the start (the heuristic start still runs to its end);
  unless ``starts`` is given, as many starts as fit it by a size-based estimate of one start's
  seconds (:func:`start_cost_s`, :func:`start_count`).

A stopped start still busy :data:`GRACE` times the stop time later (by default
:data:`DEFAULT_GRACE` times the heuristic start's seconds plus :data:`DEFAULT_GRACE_S`) is dropped.
A worker whose planner process is gone stops too.

Determinism. The starts are fixed by the inputs, ``seed`` and their number. When no start is
stopped or dropped (a budget no start reaches), the plan depends only on those, never on
``workers`` or the machine's load. By default the other starts are stopped when the heuristic
start finishes, so how far they got depends on the machine and its load: the plan is never
worse than the plain search's but may differ between runs, and a note on the plan says how
many starts finished. Pass ``budget_s`` (large) and ``starts`` for a plan that depends only on
the inputs and the seed.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hulk.errors import HulkError, PlanningError
from planner.core.costmodel import estimate_plan
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.search.starts import GREEDY_ORDERS, greedy_grouping

MIN_STARTS = 3       # with a budget given: heuristic and the two greedy starts at least
DEFAULT_STARTS = 8   # queued by default: heuristic, greedy x2, uniform, 4 random
MAX_STARTS = 32
REFERENCE_CORES = 2  # the start count for a given budget assumes a host with this many cores
WORKER_NICE = 19     # worker processes run at the lowest CPU priority (_init_pool_worker)
GRACE = 0.1          # a stopped start may take this fraction of the stop time more to return
# By default (stop at the heuristic start's end) a stopped start gets only this fraction of the
# heuristic start's seconds, plus DEFAULT_GRACE_S, to return (a stopped start answers after its
# current solve, usually within a few tens of milliseconds; less grace dropped the starts that
# had won), so the portfolio stays close to the plain search's wall time.
DEFAULT_GRACE = 0.08
DEFAULT_GRACE_S = 0.025


@dataclass(frozen=True)
class Start:
    """One start of the portfolio: its name and class scores (None: the heuristic's)."""

    index: int
    name: str
    scores: np.ndarray | None
    build: str | None = None    # a constructive start's order (planner.search.starts)


@dataclass(frozen=True)
class StartResult:
    """What one refined start gave: its plan, that plan's makespan, the seconds it took and
    whether the stop cut it short (``started`` False: the stop came before it began)."""

    index: int
    name: str
    makespan_s: float
    plan: Plan | None
    seconds: float
    cut_short: bool
    error: str | None = None
    started: bool = True


def start_cost_s(n_nodes: int, n_jobs: int) -> float:
    """A rough, size-based estimate of one start's seconds on one core of a 2-core development
    machine: plan_search's times at 47-5,000 nodes, doubled because starts other than the
    heuristic often take up to twice as long. The number of starts for an explicit budget
    depends on it, never the plan of a start that is not stopped."""
    jobs = max(1, n_jobs)
    return 2 * (0.25 * math.sqrt(jobs) + 3.4e-4 * max(1, n_nodes) ** 1.31 * math.sqrt(jobs / 8))


def start_count(n_nodes: int, n_jobs: int, budget_s: float, extra: int = 0) -> int:
    """How many starts fit an explicit ``budget_s`` on :data:`REFERENCE_CORES` cores
    (MIN_STARTS..MAX_STARTS, plus the caller's extra starts)."""
    fit = int(budget_s * REFERENCE_CORES / start_cost_s(n_nodes, n_jobs))
    return extra + max(MIN_STARTS, min(MAX_STARTS, fit))


def default_start_count(cores: int, extra: int = 0) -> int:
    """The default number of starts: :data:`DEFAULT_STARTS`, or one per usable core where that
    is more (at most :data:`MAX_STARTS`), plus the caller's extra starts."""
    return extra + max(DEFAULT_STARTS, min(MAX_STARTS, cores))


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
    for order in GREEDY_ORDERS:
        starts.append(Start(len(starts), order, None, build=order))
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


def _init_pool_worker(jobs: list[Job], net: Network, max_rounds: int | None, stop_cell) -> None:
    """Pool initializer of a worker process: the shared inputs, and the lowest CPU priority, so
    that on a busy machine the workers take only what the heuristic start (the plain search, in
    the caller's process) and other programs leave: the portfolio then takes the plain search's
    wall time however busy the machine is."""
    try:
        os.nice(WORKER_NICE)
    except (AttributeError, OSError):   # not on Unix, or not allowed: run at equal priority
        pass
    _init_worker(jobs, net, max_rounds, stop_cell)
    _WORKER["parent"] = os.getppid()


def _run_start(start: Start) -> StartResult:
    """Refine one start (in a worker, or in the caller's process when workers=1)."""
    from planner.search.refine import plan_search

    jobs, net, stop = _WORKER["jobs"], _WORKER["net"], _WORKER["stop"]
    t0 = time.monotonic()
    # The heuristic start is the plain search and always runs to its end: the portfolio is
    # never worse than `search`, however busy the machine.
    # A worker whose parent is gone (the planner was killed) stops too, instead of running on.
    parent = _WORKER.get("parent")
    should_stop = None if start.index == 0 else (
        lambda: time.monotonic() >= stop.value or (parent is not None and os.getppid() != parent))
    if should_stop is not None and should_stop():
        return StartResult(start.index, start.name, math.inf, None, 0.0, False, started=False)
    try:
        initial = start.scores
        if start.build is not None:
            initial = greedy_grouping(jobs, net, start.build, should_stop=should_stop)
            if initial is None:   # stopped before its grouping was complete: no plan
                return StartResult(start.index, start.name, math.inf, None,
                                   time.monotonic() - t0, True)
        plan = plan_search(jobs, net, max_rounds=_WORKER["max_rounds"], initial=initial,
                           should_stop=should_stop)
    except HulkError as exc:
        return StartResult(start.index, start.name, math.inf, None, time.monotonic() - t0,
                           False, str(exc))
    makespan = estimate_plan(plan.placements, net).makespan_s if plan.placements else 0.0
    cut = any("safety cap" in note for note in plan.notes)
    return StartResult(start.index, start.name, makespan, plan, time.monotonic() - t0, cut)


def _pool_context():
    """fork where the platform has it (workers inherit the network without copying it and
    start in milliseconds; they import nothing new, so torch is never loaded by them); spawn
    elsewhere."""
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not on Linux
        return max(1, os.cpu_count() or 1)


def _run_all(starts: list[Start], jobs, net, max_rounds, workers: int, budget_at: float | None,
             tick: Callable[[int], None]) -> list[StartResult]:
    """Every start refined until the stop (module docstring: ``budget_at`` None is the
    default, the heuristic start's end); returns the results that came back."""
    results: list[StartResult] = []
    t0 = time.monotonic()
    first_stop = math.inf if budget_at is None else budget_at

    def stop_after_heuristic() -> float:
        return time.monotonic() if budget_at is None else budget_at

    if workers <= 1:
        stop_cell = _Cell(first_stop)
        _init_worker(jobs, net, max_rounds, stop_cell)
        try:
            for st in starts:
                results.append(_run_start(st))
                if st.index == 0:
                    stop_cell.value = stop_after_heuristic()
                tick(len(results))
        finally:
            _WORKER.clear()
        return results
    # The heuristic start runs here (no copy of its plan, no pool in its way), the others in
    # worker processes, each taking the next start in order.
    ctx = _pool_context()
    stop_cell = ctx.RawValue("d", first_stop)
    others = [st for st in starts if st.index != 0]
    pool = ctx.Pool(processes=max(1, min(workers - 1, len(others))), initializer=_init_pool_worker,
                    initargs=(jobs, net, max_rounds, stop_cell))
    done: queue.SimpleQueue = queue.SimpleQueue()
    try:
        pending = set()
        for st in others:
            pool.apply_async(_run_start, (st,), callback=done.put,
                             error_callback=lambda exc, st=st: done.put(StartResult(
                                 st.index, st.name, math.inf, None, 0.0, False, str(exc))))
            pending.add(st.index)
        if len(others) < len(starts):
            _init_worker(jobs, net, max_rounds, stop_cell)
            try:
                results.append(_run_start(starts[0]))
            finally:
                _WORKER.clear()
            stop_cell.value = stop_after_heuristic()
        while pending:
            # The others are told to stop at the stop time and get GRACE more to hand back
            # their best plan so far; a start not begun by then returns at once.
            stop = stop_cell.value
            grace = (GRACE * max(stop - t0, 1.0) if budget_at is not None
                     else DEFAULT_GRACE * (stop - t0) + DEFAULT_GRACE_S)
            wait = stop + grace - time.monotonic()
            if wait <= 0:
                break
            try:
                res = done.get(timeout=min(wait, 3600.0))
            except queue.Empty:
                break
            pending.discard(res.index)
            results.append(res)
            tick(len(results))
        return results
    finally:
        pool.terminate()
        pool.join()


@dataclass(frozen=True)
class PortfolioRun:
    """Every start's result (in start order; those not begun or not back by the stop are left
    out), how many starts were queued, the budget (None: the default stop) and the seconds the
    run took."""

    results: tuple[StartResult, ...]
    total: int
    budget_s: float | None
    seconds: float

    @property
    def dropped(self) -> int:
        """Starts that gave no result: not begun before the stop, or not back in time."""
        return self.total - len(self.results)

    def best(self) -> StartResult:
        """The winner: lowest (makespan, start index) among the starts that gave a plan."""
        usable = [r for r in self.results if r.plan is not None]
        if not usable:
            raise PlanningError("no start of the portfolio produced a plan")
        return min(usable, key=lambda r: (r.makespan_s, r.index))


def resolve_defaults(n_nodes: int, n_jobs: int, *, budget_s: float | None = None,
                     starts: int | None = None, extra: int = 0,
                     cores: int | None = None) -> tuple[int, float | None]:
    """(number of starts, budget in seconds or None for the default stop) for a fleet of
    ``n_nodes`` and ``n_jobs`` jobs, as the module docstring says; ``cores`` defaults to
    :func:`default_workers`. A pure function of its arguments."""
    if budget_s is not None and not budget_s > 0:
        raise PlanningError(f"the time budget must be positive, got {budget_s}")
    if starts is not None:
        count = starts
    elif budget_s is None:
        count = default_start_count(cores if cores is not None else default_workers(), extra)
    else:
        count = start_count(n_nodes, n_jobs, budget_s, extra=extra)
    return max(1, count), budget_s


def refine_starts(jobs: list[Job], net: Network, *, seed: int = 0,
                  budget_s: float | None = None, workers: int | None = None,
                  starts: int | None = None, max_rounds: int | None = None,
                  extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                  progress: Callable[[int, int], None] | None = None) -> PortfolioRun:
    """Refine every start of the portfolio (arguments as :func:`plan_portfolio`)."""
    count, budget_s = resolve_defaults(net.n, len(jobs), budget_s=budget_s, starts=starts,
                                       extra=len(extra_starts))
    t0 = time.monotonic()
    plan_starts = portfolio_starts(jobs, net, seed=seed, count=count, extra_starts=extra_starts)
    workers = min(workers or default_workers(), len(plan_starts))
    total = len(plan_starts)

    def tick(done: int) -> None:
        if progress is not None:
            progress(done, total)

    results = _run_all(plan_starts, jobs, net, max_rounds, workers,
                       None if budget_s is None else t0 + budget_s, tick)
    heuristic = next((r for r in results if r.index == 0), None)
    if heuristic is not None and heuristic.error is not None:
        raise PlanningError(heuristic.error)
    tick(total)
    returned = sorted((r for r in results if r.started), key=lambda r: r.index)
    return PortfolioRun(tuple(returned), total, budget_s, time.monotonic() - t0)


def plan_portfolio(jobs: list[Job], net: Network, *, seed: int = 0,
                   budget_s: float | None = None, workers: int | None = None,
                   starts: int | None = None, max_rounds: int | None = None,
                   extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                   progress: Callable[[int, int], None] | None = None) -> Plan:
    """Plan ``jobs`` on ``net`` with the best of a portfolio of refined starts (module docstring).

    ``budget_s``: when the starts other than the heuristic stop (default: when the heuristic
    start, the plain search, finishes); given, it also sets the number of starts unless
    ``starts`` does. ``starts``: how many (default :data:`DEFAULT_STARTS` or one per usable
    core). ``workers``: processes (default all usable cores; when no start is stopped the plan
    does not depend on it). ``extra_starts``: (name, class scores n x (jobs + 1)) tried right
    after the heuristic, e.g. the GNN's. ``progress(done, total)`` is called as starts finish.
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
    if run.budget_s is None:
        if run.total > 1:
            finished = sum(r.plan is not None and not r.cut_short for r in run.results)
            notes.append(f"portfolio: {finished} of {run.total} starts finished within the plain "
                         f"search's time ({run.seconds:.1f} s; {cut} cut short, {run.dropped} "
                         "not begun or not back); the plan may differ between runs: give "
                         "--time-budget and --starts to fix it")
    elif run.dropped or cut:
        notes.append(f"portfolio: the time budget ran out after {run.seconds:.1f} s (budget "
                     f"{run.budget_s:.1f} s; {cut} start(s) cut short, {run.dropped} dropped); "
                     "the plan is valid but may differ between runs: raise --time-budget or "
                     "lower --starts")
    return Plan("portfolio", best.plan.placements, list(best.plan.unplaced),
                dict(best.plan.job_s_override), dict(best.plan.estimate_override), notes)
