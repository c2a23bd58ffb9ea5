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
process, the others in worker processes forked when the portfolio begins
(planner.search.workers: ``workers`` processes in all, the caller's included; by default one
more per core idle when planning begins, and with ``budget_s`` every core this process may use,
``os.sched_getaffinity``), each worker taking the next start in order
as it finishes one and sending back its best plan so far whenever it improves; with
``workers=1`` (or where there is no fork) they run one after another here. The winner is the
lowest (makespan by the reference cost model, start index).

The stop. The heuristic start is never stopped: it is the plain search, so the portfolio always
returns a valid plan at least as good as ``plan_search``'s. Every other start stops once the
stop time has passed; what it gives is the best plan it had sent by then (valid: a snapshot of
the refinement between two rounds; a constructive start whose grouping was not complete gives
none), and a start not begun by then is dropped. The planner does not wait for a stopped start
to return: it takes what has arrived and kills the workers.

- by default (the default of `hulk-planner plan`): when the heuristic start finishes, so the
  portfolio takes the plain search's wall time (plus forking the workers: a few milliseconds,
  and the copy-on-write of the memory this process then writes, a few percent);
  the other starts get what the other cores have free meanwhile (workers run at the lowest CPU
  priority, nice 19 and SCHED_IDLE, so they do not slow the plain search down, and unless
  ``workers`` is given, one is forked only per core idle when planning begins: on a busy
  machine they would get nothing and only cost the fork).
  :data:`DEFAULT_STARTS` starts are queued (or one per usable core where that is more), plus
  the caller's extra starts; with ``workers=1`` the plan is the plain search's;
- with ``budget_s``: ``budget_s`` after the start (the heuristic start still runs to its end),
  or sooner when every start has finished; unless ``starts`` is given, as many starts as fit it
  by a size-based estimate of one start's seconds (:func:`start_cost_s`, :func:`start_count`).

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

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hulk.errors import HulkError, PlanningError
from planner.core.costmodel import estimate_plan
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, PlanFacts
from planner.search import algorithm1 as alg1
from planner.search.groups import GridCache
from planner.search.options import SearchOptions
from planner.search.starts import GREEDY_ORDERS, greedy_grouping
from planner.search.workers import StartWorkers, can_fork, idle_cores

MIN_STARTS = 3       # with a budget given: heuristic and the two greedy starts at least
DEFAULT_STARTS = 8   # queued by default: heuristic, greedy x2, uniform, 4 random
MAX_STARTS = 32
REFERENCE_CORES = 2  # the start count for a given budget assumes a host with this many cores


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
    whether the stop cut it short (``started`` False: the stop came before it began; ``final``
    False: the best plan so far of a start still being refined)."""

    index: int
    name: str
    makespan_s: float
    plan: Plan | None
    seconds: float
    cut_short: bool
    error: str | None = None
    started: bool = True
    final: bool = True   # False: a snapshot of a start still being refined


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


def check_extra_starts(extra_starts: Sequence[tuple[str, np.ndarray]], n: int, width: int
                       ) -> list[tuple[str, np.ndarray]]:
    """The caller's starts as float arrays; PlanningError when one is not ``n`` x ``width``."""
    out = []
    for name, scores in extra_starts:
        scores = np.asarray(scores, dtype=float)
        if scores.shape != (n, width):
            raise PlanningError(f"start {name!r}: scores must have shape ({n}, {width}), "
                                f"got {scores.shape}")
        out.append((name, scores))
    return out


def portfolio_starts(jobs: list[Job], net: Network, *, seed: int, count: int,
                     extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                     labels: np.ndarray | None = None) -> list[Start]:
    """The first ``count`` starts in portfolio order (see the module docstring)."""
    from planner.search.clusters import network_clusters

    n, width = net.n, len(jobs) + 1
    starts = [Start(0, "heuristic", None)]
    for name, scores in check_extra_starts(extra_starts, n, width):
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


# ------------------------------------------------------------------------------ running starts

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


def _run_start(start: Start, jobs: list[Job], net: Network, search: SearchOptions,
               should_stop: Callable[[], bool] | None,
               send: Callable[[StartResult], None] | None = None, *,
               grids: GridCache | None = None) -> StartResult:
    """Refine one start: its grouping, then the search's refinement (run with ``search``) until
    ``should_stop()`` (None for the heuristic start: the plain search always runs to its end,
    so the portfolio is never worse than `search`, however busy the machine). With ``send``,
    its best plan so far is also sent whenever it improves. Algorithm 1's remarks on jobs a
    start's scores gave no node say nothing about the plan and are left out. ``grids``: the
    solver's answers shared with the other starts run in this process."""
    from planner.search.refine import search_sharing

    t0 = time.monotonic()
    if should_stop is not None and should_stop():
        return StartResult(start.index, start.name, math.inf, None, 0.0, False, started=False)
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
                                   time.monotonic() - t0, True)
        plan = search_sharing(jobs, net, grids, options=search, initial=initial,
                              should_stop=should_stop, snapshot=None if send is None
                              else _snapshots(start, jobs, net, t0, send))
    except HulkError as exc:
        return StartResult(start.index, start.name, math.inf, None, time.monotonic() - t0,
                           False, str(exc))
    makespan = estimate_plan(plan.placements, net).makespan_s if plan.placements else 0.0
    return StartResult(start.index, start.name, makespan, plan, time.monotonic() - t0,
                       plan.facts.cut_short)


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not on Linux
        return max(1, os.cpu_count() or 1)


def _run_here(starts: list[Start], jobs, net, search: SearchOptions, budget_at: float | None,
              tick: Callable[[int], None]) -> list[StartResult]:
    """Every start one after another in this process (``workers=1``, or no fork)."""
    results: list[StartResult] = []
    stop_at = math.inf if budget_at is None else budget_at
    grids = GridCache(net)
    for st in starts:
        results.append(_run_start(st, jobs, net, search,
                                  None if st.index == 0 else lambda: time.monotonic() >= stop_at,
                                  grids=grids))
        if st.index == 0 and budget_at is None:
            stop_at = time.monotonic()   # the default stop: the heuristic start's end
        tick(len(results))
    return results


def _run_forked(build_starts: Callable[[], list[Start]], total: int, jobs, net,
                search: SearchOptions, workers: int, budget_at: float | None,
                tick: Callable[[int], None]) -> list[StartResult]:
    """The heuristic start here, the others in ``workers - 1`` forked processes
    (planner.search.workers) that build the starts themselves (the planner's process goes
    straight to the plain search) and stream their best plans; at the stop this process takes
    what has arrived and kills them (module docstring)."""
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
            tick(1 + finished)

    child_starts: list[Start] = []   # built once in each worker
    child_grids: list[GridCache] = []   # one per worker, for the starts it runs

    def run_one(index: int, send, should_stop) -> None:
        if not child_starts:
            child_starts.extend(build_starts())
            child_grids.append(GridCache(net))
        send(_run_start(child_starts[index], jobs, net, search, should_stop, send,
                        grids=child_grids[0]))

    pool = StartWorkers(max(1, min(workers - 1, total - 1)), list(range(1, total)), run_one,
                        math.inf if budget_at is None else budget_at)
    try:
        heuristic = _run_start(Start(0, "heuristic", None), jobs, net, search, None)
        stop_at = time.monotonic() if budget_at is None else budget_at
        pool.set_stop(stop_at)
        collect(pool.poll(0.0))
        while pool.running and finished < total - 1 and time.monotonic() < stop_at:
            collect(pool.poll(stop_at - time.monotonic()))
    finally:
        pool.close()
    return [heuristic] + [r for r in latest.values() if r.started]


@dataclass(frozen=True)
class PortfolioRun:
    """Every start's result (in start order; those not begun or not back by the stop are left
    out), how many starts were queued, the budget (None: the default stop), the seconds the
    run took and the processes it ran in (the caller's included)."""

    results: tuple[StartResult, ...]
    total: int
    budget_s: float | None
    seconds: float
    workers: int = 1

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
                  starts: int | None = None, search: SearchOptions = SearchOptions(),
                  extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                  progress: Callable[[int, int], None] | None = None) -> PortfolioRun:
    """Refine every start of the portfolio (arguments as :func:`plan_portfolio`)."""
    count, budget_s = resolve_defaults(net.n, len(jobs), budget_s=budget_s, starts=starts,
                                       extra=len(extra_starts))
    t0 = time.monotonic()
    total = max(1, count)
    if workers is None and budget_s is None:
        # By default the other starts get only idle cores: where none is idle now, forking
        # workers would cost the planner time (the fork, copy-on-write) and give nothing.
        workers = 1 + idle_cores(default_workers())
    workers = min(workers or default_workers(), total)

    def build_starts() -> list[Start]:
        return portfolio_starts(jobs, net, seed=seed, count=count, extra_starts=extra_starts)

    def tick(done: int) -> None:
        if progress is not None:
            progress(done, total)

    budget_at = None if budget_s is None else t0 + budget_s
    if workers > 1 and can_fork():
        check_extra_starts(extra_starts, net.n, len(jobs) + 1)   # here, not in a worker
        results = _run_forked(build_starts, total, jobs, net, search, workers, budget_at, tick)
    else:
        results = _run_here(build_starts(), jobs, net, search, budget_at, tick)
    heuristic = next((r for r in results if r.index == 0), None)
    if heuristic is not None and heuristic.error is not None:
        raise PlanningError(heuristic.error)
    tick(total)
    returned = sorted((r for r in results if r.started), key=lambda r: r.index)
    return PortfolioRun(tuple(returned), total, budget_s, time.monotonic() - t0, workers)


def plan_portfolio(jobs: list[Job], net: Network, *, seed: int = 0,
                   budget_s: float | None = None, workers: int | None = None,
                   starts: int | None = None, search: SearchOptions = SearchOptions(),
                   extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                   progress: Callable[[int, int], None] | None = None) -> Plan:
    """Plan ``jobs`` on ``net`` with the best of a portfolio of refined starts (module docstring).

    ``budget_s``: when the starts other than the heuristic stop (default: when the heuristic
    start, the plain search, finishes); given, it also sets the number of starts unless
    ``starts`` does. ``starts``: how many (default :data:`DEFAULT_STARTS` or one per usable
    core). ``workers``: processes (default: with ``budget_s``, all usable cores; without, this
    one plus one per usable core idle when planning begins, planner.search.workers.idle_cores;
    when no start is stopped the plan does not depend on it). ``search``: the options every
    start's search runs with (planner.search.options). ``extra_starts``: (name, class scores
    n x (jobs + 1)) tried right after the heuristic, e.g. the GNN's. ``progress(done, total)``
    is called as starts finish. The plan's ``facts`` name the winning start and say whether
    the budget cut any start short.
    """
    jobs = list(jobs)
    if net.n == 0:
        raise PlanningError("the fleet has no nodes")
    if not jobs:
        return Plan("portfolio", [])
    run = refine_starts(jobs, net, seed=seed, budget_s=budget_s, workers=workers, starts=starts,
                        search=search, extra_starts=extra_starts, progress=progress)
    best = run.best()
    heuristic = run.results[0] if run.results and run.results[0].index == 0 else None
    notes = list(best.plan.notes)
    usable = sum(r.plan is not None for r in run.results)
    notes.append(f"portfolio: best of {usable} refined starts is {best.name!r}"
                 + (f" ({heuristic.makespan_s / best.makespan_s:.2f}x shorter than the "
                    f"heuristic start)" if heuristic is not None and best.index != 0
                    and best.makespan_s > 0 else ""))
    cut = sum(r.cut_short for r in run.results)
    budget_ran_out = run.budget_s is not None and bool(run.dropped or cut)
    if run.budget_s is None:
        if run.total > 1:
            finished = sum(r.plan is not None and not r.cut_short for r in run.results)
            idle = "" if run.workers > 1 else "; no idle core for the others"
            notes.append(f"portfolio: {finished} of {run.total} starts finished within the plain "
                         f"search's time ({run.seconds:.1f} s; {cut} cut short, {run.dropped} "
                         f"not begun or not back{idle}); the plan may differ between runs: give "
                         "--time-budget and --starts to fix it")
    elif budget_ran_out:
        notes.append(f"portfolio: the time budget ran out after {run.seconds:.1f} s (budget "
                     f"{run.budget_s:.1f} s; {cut} start(s) cut short, {run.dropped} dropped); "
                     "the plan is valid but may differ between runs: raise --time-budget or "
                     "lower --starts")
    facts = PlanFacts(cut_short=best.cut_short or budget_ran_out, winner=best.name,
                      unscored_jobs=best.plan.facts.unscored_jobs)
    return Plan("portfolio", best.plan.placements, list(best.plan.unplaced),
                dict(best.plan.job_s_override), dict(best.plan.estimate_override), notes, facts)
