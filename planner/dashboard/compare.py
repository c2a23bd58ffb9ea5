"""The last plan's comparison: the methods' makespans for its jobs on the current fleet.

``compare_methods`` plans the jobs with Hulk's search, Systems A/B/C and the DT-FM-style peer and
judges every plan by the reference cost model (docs/COSTMODEL.md), as `hulk-planner plan` does.
``ComparisonWorker`` runs it on a thread of its own (planning takes seconds on a large fleet and
must not hold the store's thread), again only when the jobs or the fleet's nodes change, or when
the last result is older than ``max_age_s`` (RTTs drift).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hulk.errors import HulkError
from planner.core.fleet import Fleet, complete
from planner.core.jobs import Job
from planner.dashboard.view import number

log = logging.getLogger(__name__)

# method -> (module, function, label); planners are imported when first used.
METHODS: dict[str, tuple[str, str, str]] = {
    "search": ("planner.search", "plan_search", "Hulk (search)"),
    "system-a": ("planner.baselines.systems", "plan_system_a", "System A (data parallel)"),
    "system-b": ("planner.baselines.systems", "plan_system_b", "System B (GPipe)"),
    "system-c": ("planner.baselines.systems", "plan_system_c", "System C (Megatron TP)"),
    "dtfm": ("planner.baselines.dtfm", "plan_dtfm", "DT-FM-style peer"),
}
SEARCH_BUDGET_S = 30.0


@dataclass(frozen=True)
class MethodOutcome:
    method: str
    label: str
    makespan_s: float | None          # None: it failed, or left jobs unplaced
    sum_jct_s: float | None
    planning_s: float
    unplaced: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Comparison:
    jobs: tuple[str, ...]
    nodes: int
    computed_ms: int
    compute_bound_s: float | None
    methods: tuple[MethodOutcome, ...]


def run_method(method: str, jobs: list[Job], net, seed: int) -> MethodOutcome:
    from planner.files.plan import evaluate

    module, function, label = METHODS[method]
    fn = getattr(importlib.import_module(module), function)
    kwargs: dict[str, Any] = {"seed": seed} if method in ("search", "dtfm") else {}
    if method == "search":
        kwargs["budget_s"] = SEARCH_BUDGET_S
    t0 = time.perf_counter()
    try:
        report = evaluate(fn(jobs, net, **kwargs), net)
    except (HulkError, ValueError) as exc:
        return MethodOutcome(method, label, None, None, time.perf_counter() - t0, error=str(exc))
    seconds = time.perf_counter() - t0
    unplaced = tuple(u.name for u in report.unplaced)
    if unplaced:
        return MethodOutcome(method, label, None, None, seconds, unplaced)
    return MethodOutcome(method, label, report.makespan_s, report.sum_jct_s, seconds)


def compare_methods(jobs: list[Job], fleet: Fleet, *, seed: int = 0,
                    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> Comparison:
    """Every method's plan of ``jobs`` on ``fleet``, judged by the reference cost model."""
    from planner.core.costmodel import compute_bound_s

    net = complete(fleet)
    bound = None
    if net.n and float(net.thr.sum()) > 0:
        bound = compute_bound_s(jobs, net)
    outcomes = tuple(run_method(m, jobs, net, seed) for m in METHODS)
    return Comparison(tuple(j.name for j in jobs), net.n, clock_ms(), bound, outcomes)


def comparison_json(comparison: Comparison | None, *, computing: bool,
                    plan: dict[str, Any]) -> dict[str, Any]:
    """The /api/plan document: the last plan (ids, jobs, estimates) and the methods' makespans,
    each also as a multiple of Hulk's (search) makespan."""
    status = "computing" if computing else ("ready" if comparison else "none")
    out: dict[str, Any] = {"status": status, "plan": plan, "comparison": None}
    if comparison is None:
        return out
    hulk = next((m.makespan_s for m in comparison.methods if m.method == "search"), None)
    methods = []
    for m in comparison.methods:
        ratio = m.makespan_s / hulk if m.makespan_s is not None and hulk else None
        methods.append({"method": m.method, "label": m.label, "makespan_s": number(m.makespan_s, 1),
                        "sum_jct_s": number(m.sum_jct_s, 1), "vs_hulk": number(ratio),
                        "planning_s": number(m.planning_s, 2), "unplaced": list(m.unplaced),
                        "error": m.error})
    out["comparison"] = {"jobs": list(comparison.jobs), "nodes": comparison.nodes,
                         "computed_ms": comparison.computed_ms,
                         "compute_bound_s": number(comparison.compute_bound_s, 1),
                         "methods": methods}
    return out


class ComparisonWorker:
    """Runs ``compare`` on its own thread when offered inputs whose key differs from the last
    computed one (or when that result is older than ``max_age_s``). One run at a time; an offer
    made during a run is kept and run next, earlier waiting offers are dropped."""

    def __init__(self, compare: Callable[[list[Job], Fleet], Comparison] = compare_methods, *,
                 max_age_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        self._compare, self.max_age_s, self._clock = compare, max_age_s, clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-compare")
        self._lock = threading.Lock()
        self._running: Any = None          # the key being computed, None when idle
        self._waiting: tuple[Any, list[Job], Fleet] | None = None
        self._key: Any = None
        self._done_at = 0.0
        self.result: Comparison | None = None

    @property
    def computing(self) -> bool:
        with self._lock:
            return self._running is not None

    def offer(self, key: Any, jobs: Sequence[Job], fleet: Fleet) -> None:
        with self._lock:
            if not jobs:
                self._key, self.result, self._waiting = key, None, None
                return
            fresh = self._clock() - self._done_at < self.max_age_s
            if key == self._key and fresh and self.result is not None:
                return
            if self._running is not None:
                if key != self._running:
                    self._waiting = (key, list(jobs), fleet)
                return
            self._running = key
            self._executor.submit(self._run, key, list(jobs), fleet)

    def _run(self, key: Any, jobs: list[Job], fleet: Fleet) -> None:
        while True:
            try:
                result = self._compare(jobs, fleet)
            except Exception:   # a background job logs and goes on
                log.exception("dashboard: comparing the methods failed")
                result = None
            with self._lock:
                self._key, self.result, self._done_at = key, result, self._clock()
                if self._waiting is None:
                    self._running = None
                    return
                key, jobs, fleet = self._waiting
                self._running, self._waiting = key, None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
