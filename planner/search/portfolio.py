"""A portfolio of starts for the search (``--method portfolio``, the default of `plan`): where
the refinement starts decides where it ends, so several starts are refined and the best plan wins;
the built-in baselines' plans are candidates too, so the default never returns a plan one of them
beats under the same cost model.

The starts, in this order (the index breaks ties between equal makespans):

0. ``heuristic``: the search's own heuristic scores (planner.search.heuristics), so the
   portfolio's plan is never worse than ``plan_search``'s;
1. ``greedy-flops`` and ``greedy-memory``: groupings built one job at a time, each job taking
   the best placement the solver finds on the nodes still free, most FLOPs first and largest
   memory threshold first (planner.search.starts): cheap, and on fleets spread over many
   regions or of a few servers often the best;
2. ``uniform``: every class equal and "idle" winning the tie: Algorithm 1 grows every job from
   nothing, hardest first, and the refinement spreads them out;
3. ``random-1``, ``random-2`` ...: seeded random class scores, alternately per node and per
   locality cluster (planner.search.clusters);
4. after those, caller-supplied class scores (``extra_starts``, e.g. the GNN's), in the order
   given. They only add: the built-in starts, their number and their order are the same with
   or without them, and a tie goes to the lower index, so an extra start changes the plan only
   by beating every built-in start (with a budget, extra starts run after the built-in ones).

Each start is its grouping (Algorithm 1 on its scores, or the constructive one) and then the
search's refinement (plan_search with ``initial=``), whose work is counted (rounds of moves and
the solver's efforts, planner.search.options), never timed. After the starts come the
baselines, Systems A/B/C and the DT-FM-style peer as `plan --compare` runs them
(planner.search.starts.baseline_plan; the caller's ``baselines`` where given, as `plan` gives
those it computes for its comparison): finished plans, judged like the starts. The winner is the
lowest (makespan by the cost model of ``net``, index), so a tie goes to a start.

Two modes:

- the default (no ``budget_s``): :data:`DEFAULT_STARTS` starts (``starts`` for another number)
  plus the caller's extra starts, and the baselines. The heuristic start runs to its end, every
  other one to its end or its work budget: as many of the solver's grid evaluations as the
  heuristic start asked for (planner.search.portfolio_run), so each costs about a plain search.
  The plan depends only on the inputs, ``seed``, ``starts`` and ``search``: never on the
  machine's load, its cores or ``workers``, which only decide how soon it comes. ``workers``
  processes share the work (by
  default every core this process may use, ``os.sched_getaffinity``): this one runs the
  heuristic start and then takes queued work like the forked ones (planner.search.workers, at
  normal priority: the planner waits for them); with ``workers=1`` (or where there is no fork)
  everything runs here, one after another, and a forked process that dies leaves its work to
  this one;
- anytime (``budget_s``, `plan --time-budget`): the heuristic start runs here to its end, the
  others in forked workers at the lowest CPU priority (nice 19, SCHED_IDLE) until ``budget_s``
  after the start, or sooner when every start has finished; a stopped start gives the best plan
  it had sent by then (a snapshot of its refinement between two rounds; a constructive start
  whose grouping was not complete gives none) and one not begun is dropped. Unless ``starts``
  is given, as many starts as fit the budget by a size-based estimate (:func:`start_cost_s`,
  :func:`start_count`). No start has a work budget, and baselines are candidates only where the
  caller gives them. When no start is stopped the plan depends only on the inputs too; when one
  is, it may depend on the machine's load, and a note says so.

A worker whose planner process is gone stops too.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hulk.errors import PlanningError
from hulk.plural import count as plural
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, PlanFacts
from planner.search.options import SearchOptions
from planner.search.portfolio_run import (Start, StartResult, Work, run_baseline, run_forked,
                                          run_here, run_start)
from planner.search.starts import GREEDY_ORDERS, baseline_names
from planner.search.workers import can_fork

_run_start = run_start   # the name tests and callers of one start use
MIN_STARTS = 3       # with a budget given: heuristic and the two greedy starts at least
# By default: the heuristic and greedy-flops starts. On the portfolio benchmark's fleets the
# other starts beat the better of these two by at most 0.2%, and each start costs about a plain
# search: two keep the default at about the plain search's wall time on two cores.
DEFAULT_STARTS = 2
MAX_STARTS = 32
REFERENCE_CORES = 2  # the start count for a given budget assumes a host with this many cores


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
    """The first ``count`` built-in starts in portfolio order, then ``extra_starts`` (see the
    module docstring)."""
    from planner.search.clusters import network_clusters

    n, width = net.n, len(jobs) + 1
    starts = [Start(0, "heuristic", None)]
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
    starts = starts[:max(1, count)]
    for name, scores in check_extra_starts(extra_starts, n, width):
        starts.append(Start(len(starts), name, scores))
    return starts


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class PortfolioRun:
    """Every start's and baseline's result (in order; those not begun or not back by the stop
    are left out), how many starts and baselines were queued, the budget (None: the default,
    every start to its end), the seconds the run took and the processes it ran in (the
    caller's included)."""

    results: tuple[StartResult, ...]
    total: int
    budget_s: float | None
    seconds: float
    workers: int = 1
    baselines: int = 0

    @property
    def dropped(self) -> int:
        """Starts that gave no result: not begun before the stop, or not back in time."""
        return self.total - len(self.results)

    def best(self) -> StartResult:
        """The winner: lowest (makespan, index) among the starts and baselines that gave a
        plan."""
        usable = [r for r in self.results if r.plan is not None]
        if not usable:
            raise PlanningError("no start of the portfolio produced a plan")
        return min(usable, key=lambda r: (r.makespan_s, r.index))


def resolve_defaults(n_nodes: int, n_jobs: int, *, budget_s: float | None = None,
                     starts: int | None = None) -> tuple[int, float | None]:
    """(number of built-in starts, budget in seconds or None for the default mode) for a fleet
    of ``n_nodes`` and ``n_jobs`` jobs, as the module docstring says; a caller's extra starts
    come on top and never change it. A pure function of its arguments: never of the machine."""
    if budget_s is not None and not budget_s > 0:
        raise PlanningError(f"the time budget must be positive, got {budget_s}")
    if starts is not None:
        count = starts
    elif budget_s is None:
        count = DEFAULT_STARTS
    else:
        count = start_count(n_nodes, n_jobs, budget_s)
    return max(1, count), budget_s


def refine_starts(jobs: list[Job], net: Network, *, seed: int = 0,
                  budget_s: float | None = None, workers: int | None = None,
                  starts: int | None = None, search: SearchOptions = SearchOptions(),
                  extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                  baselines: Sequence[tuple[str, Plan]] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> PortfolioRun:
    """Refine every start of the portfolio and judge the baselines (arguments as
    :func:`plan_portfolio`)."""
    count, budget_s = resolve_defaults(net.n, len(jobs), budget_s=budget_s, starts=starts)
    t0 = time.monotonic()
    check_extra_starts(extra_starts, net.n, len(jobs) + 1)   # here, not in a worker
    made = tuple(baseline_names(net.n)) if baselines is None and budget_s is None else ()
    work = Work(jobs, net, search, seed, lambda: portfolio_starts(
        jobs, net, seed=seed, count=count, extra_starts=extra_starts),
        count + len(extra_starts), made,
        budgeted=budget_s is None)
    workers = max(1, min(workers or default_workers(), work.total))

    def tick(done: int) -> None:
        if progress is not None:
            progress(min(done, work.total), work.total)

    budget_at = None if budget_s is None else t0 + budget_s
    if workers > 1 and can_fork():
        results = run_forked(work, workers, budget_at, tick)
    else:
        results = run_here(work, budget_at, tick)
    heuristic = next((r for r in results if r.index == 0), None)
    if heuristic is not None and heuristic.error is not None:
        raise PlanningError(heuristic.error)
    given = [run_baseline(work.total + k, name, jobs, net, seed, plan)
             for k, (name, plan) in enumerate(baselines or ())]
    tick(work.total)
    returned = sorted((r for r in results + given if r.started), key=lambda r: r.index)
    return PortfolioRun(tuple(returned), work.total + len(given), budget_s,
                        time.monotonic() - t0, workers, len(made) + len(given))


def plan_portfolio(jobs: list[Job], net: Network, *, seed: int = 0,
                   budget_s: float | None = None, workers: int | None = None,
                   starts: int | None = None, search: SearchOptions = SearchOptions(),
                   extra_starts: Sequence[tuple[str, np.ndarray]] = (),
                   baselines: Sequence[tuple[str, Plan]] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> Plan:
    """Plan ``jobs`` on ``net`` with the best of a portfolio of refined starts and the built-in
    baselines' plans (module docstring).

    ``budget_s``: None (default) runs the heuristic start to its end and the others to their
    end or work budget, so the plan depends only on the inputs, ``seed``, ``starts`` and
    ``search``; given, the starts other than the heuristic stop then (anytime) and it also sets
    the number of starts unless ``starts`` does. ``starts``: how
    many (default :data:`DEFAULT_STARTS`). ``workers``: processes (default: every usable core);
    the plan does not depend on it unless ``budget_s`` stops a start. ``search``: the options
    every start's search runs with (planner.search.options). ``extra_starts``: (name, class
    scores n x (jobs + 1)) tried after the built-in starts, e.g. the GNN's: they can only
    shorten the plan. ``baselines``:
    (method, plan) of the baselines made on ``net`` by the caller (`plan` gives those of its
    comparison); None: by default they are made here, with a budget none are judged.
    ``progress(done, total)`` is called as work finishes. The plan's ``facts`` name the winner
    and say whether the budget cut any start short.
    """
    jobs = list(jobs)
    if net.n == 0:
        raise PlanningError("the fleet has no nodes")
    if not jobs:
        return Plan("portfolio", [])
    run = refine_starts(jobs, net, seed=seed, budget_s=budget_s, workers=workers, starts=starts,
                        search=search, extra_starts=extra_starts, baselines=baselines,
                        progress=progress)
    best = run.best()
    heuristic = run.results[0] if run.results and run.results[0].index == 0 else None
    notes = list(best.plan.notes)
    split = len(run.results) - run.baselines
    refined = sum(r.plan is not None for r in run.results[:split])
    judged = sum(r.plan is not None for r in run.results[split:])
    capped = sum(r.capped for r in run.results)
    also = f" and {plural(judged, 'baseline plan')}" if run.baselines else ""
    notes.append(f"portfolio: best of {plural(refined, 'refined start')}{also} is {best.name!r}"
                 + (f" ({heuristic.makespan_s / best.makespan_s:.2f}x shorter than the "
                    f"heuristic start)" if heuristic is not None and best.index != 0
                    and best.makespan_s > 0 else "")
                 + (f"; {plural(capped, 'start')} ended at their work budget" if capped else ""))
    cut = sum(r.cut_short for r in run.results)
    budget_ran_out = run.budget_s is not None and bool(run.dropped or cut)
    if budget_ran_out:
        notes.append(f"portfolio: the time budget ran out after {run.seconds:.1f} s (budget "
                     f"{run.budget_s:.1f} s; {plural(cut, 'start')} cut short, {run.dropped} dropped); "
                     "the plan is valid but may differ between runs: raise --time-budget or "
                     "lower --starts")
    facts = PlanFacts(cut_short=best.cut_short or budget_ran_out, winner=best.name,
                      unscored_jobs=best.plan.facts.unscored_jobs)
    return Plan("portfolio", best.plan.placements, list(best.plan.unplaced),
                dict(best.plan.job_s_override), dict(best.plan.estimate_override), notes, facts)
