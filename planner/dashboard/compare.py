"""The last plan's comparison: the methods' makespans for its jobs on the current fleet.

``compare_methods`` plans the jobs with Hulk's default method as serve plans with it
(planner.methods.serve_planner's budget, in one process) and with the methods `hulk-planner plan`
compares it with (Systems A/B/C, the DT-FM-style peer), and judges every plan by the reference
cost model (docs/COSTMODEL.md), as `plan` does.
``ComparisonWorker`` runs it again only when the jobs or the fleet's nodes change, or when the last
result is older than ``max_age_s`` (RTTs drift), waiting on a thread of its own for a child
process (``ChildComparer``) that does the planning: it takes seconds on a large fleet and must hold
neither the store's thread nor serve's interpreter.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hulk.errors import HulkError
from planner.core.fleet import Fleet, complete
from planner.core.jobs import Job
from planner.dashboard.view import number
from planner.methods import DEFAULT_METHOD, SERVE_BUDGET_S, compared_methods, label, plan_with

log = logging.getLogger(__name__)


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


def run_method(method: str, jobs: list[Job], net, seed: int,
               made: dict[str, object] | None = None) -> MethodOutcome:
    """``method``'s outcome; with ``made``, the plan is also kept there under its name, and the
    plans already there are given as ``baselines`` to a method that takes them."""
    from planner.core.evaluate import evaluate

    name = label(method)
    t0 = time.perf_counter()
    try:
        # Options a method does not take are not passed to it (planner.methods.planner_for).
        baselines = list(made.items()) if made else None
        plan = plan_with(method, jobs, net, seed=seed, budget_s=SERVE_BUDGET_S, workers=1,
                         baselines=baselines)
        if made is not None:
            made[method] = plan
        report = evaluate(plan, net)
    except HulkError as exc:
        return MethodOutcome(method, name, None, None, time.perf_counter() - t0, error=str(exc))
    except Exception as exc:   # one method's failure must not hide the others' makespans
        log.exception("dashboard: %s failed", method)
        return MethodOutcome(method, name, None, None, time.perf_counter() - t0,
                             error=f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    unplaced = tuple(u.name for u in report.unplaced)
    if unplaced:
        return MethodOutcome(method, name, None, None, seconds, unplaced)
    return MethodOutcome(method, name, report.makespan_s, report.sum_jct_s, seconds)


def dashboard_methods(n_nodes: int) -> list[str]:
    """Hulk's default method, then those `plan --compare` runs on a fleet of ``n_nodes``."""
    from planner.search.scale import SCALE_NODE_LIMIT

    return [DEFAULT_METHOD] + compared_methods(DEFAULT_METHOD, n_nodes, SCALE_NODE_LIMIT)[0]


def compare_methods(jobs: list[Job], fleet: Fleet, *, seed: int = 0,
                    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> Comparison:
    """Every method's plan of ``jobs`` on ``fleet``, judged by the reference cost model."""
    from planner.core.costmodel import compute_bound_s

    net = complete(fleet)
    bound = None
    if net.n and float(net.thr.sum()) > 0:
        bound = compute_bound_s(jobs, net)
    # The baselines first: the default takes their plans as candidates, not making them again.
    first, *others = dashboard_methods(net.n)
    made: dict[str, object] = {}
    compared = [run_method(m, jobs, net, seed, made) for m in others]
    outcomes = (run_method(first, jobs, net, seed, made), *compared)
    return Comparison(tuple(j.name for j in jobs), net.n, clock_ms(), bound, outcomes)


def comparison_json(comparison: Comparison | None, *, computing: bool,
                    plan: dict[str, Any]) -> dict[str, Any]:
    """The /api/plan document: the last plan (ids, jobs, estimates) and the methods' makespans,
    each also as a multiple of Hulk's (the default method's, named by ``hulk``) makespan."""
    status = "computing" if computing else ("ready" if comparison else "none")
    out: dict[str, Any] = {"status": status, "plan": plan, "comparison": None}
    if comparison is None:
        return out
    hulk = next((m.makespan_s for m in comparison.methods if m.method == DEFAULT_METHOD), None)
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
                         "hulk": DEFAULT_METHOD, "methods": methods}
    return out


def _compare_and_send(jobs: list[Job], fleet: Fleet, conn) -> None:
    """The child process's work: the comparison, or the error's text, back through ``conn``."""
    try:
        conn.send(compare_methods(jobs, fleet))
    except BaseException as exc:   # the parent logs it; a child's traceback helps nobody
        conn.send(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


class ChildComparer:
    """``compare_methods`` in a child process, spawned (a fresh interpreter that inherits none of
    serve's threads), so planning never competes with serve's event loop for the interpreter;
    ``close`` kills a run in progress, so stopping serve never waits for a plan."""

    def __init__(self, timeout_s: float = 900.0):
        self.timeout_s = timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._process = None
        self._closed = False

    def __call__(self, jobs: list[Job], fleet: Fleet) -> Comparison:
        receiver, sender = self._context.Pipe(duplex=False)
        process = self._context.Process(target=_compare_and_send, args=(jobs, fleet, sender),
                                        name="hulk-dashboard-compare", daemon=True)
        with self._lock:
            if self._closed:
                raise RuntimeError("closed")
            process.start()
            self._process = process
        sender.close()
        try:
            if not receiver.poll(self.timeout_s):
                raise TimeoutError(f"no comparison after {self.timeout_s:.0f} s")
            result = receiver.recv()
        except EOFError:
            raise RuntimeError(f"the comparison process ended with {process.exitcode}") from None
        finally:
            receiver.close()
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
            with self._lock:
                self._process = None
        if isinstance(result, str):
            raise RuntimeError(result)
        return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            process = self._process
        if process is not None and process.is_alive():
            process.kill()


class ComparisonWorker:
    """Runs ``compare`` on a thread of its own when offered inputs whose key differs from the last
    computed one, or when that result is older than ``max_age_s`` (a failed run is tried again
    after ``retry_s``). One run at a time; an offer made during a run is kept and run next, earlier
    waiting offers are dropped. The default ``compare`` plans in a child process (ChildComparer)."""

    def __init__(self, compare: Callable[[list[Job], Fleet], Comparison] | None = None, *,
                 max_age_s: float = 600.0, retry_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self._compare = compare or ChildComparer()
        self.max_age_s, self.retry_s, self._clock = max_age_s, retry_s, clock
        self._lock = threading.Lock()
        self._running: Any = None          # the key being computed, None when idle
        self._waiting: tuple[Any, list[Job], Fleet] | None = None
        self._drop_running = False         # the jobs went away during the run: drop its result
        self._key: Any = None
        self._done_at = -math.inf
        self.result: Comparison | None = None

    @property
    def computing(self) -> bool:
        with self._lock:
            return self._running is not None

    def offer(self, key: Any, jobs: Sequence[Job], fleet: Fleet) -> None:
        with self._lock:
            if not jobs:
                self._key, self.result, self._waiting = key, None, None
                self._drop_running = self._running is not None
                return
            age = self._clock() - self._done_at
            if key == self._key and age < (self.max_age_s if self.result else self.retry_s):
                return
            if self._running is not None:
                if key != self._running:
                    self._waiting = (key, list(jobs), fleet)
                self._drop_running = False
                return
            self._running = key
            threading.Thread(target=self._run, args=(key, list(jobs), fleet),
                             name="dashboard-compare", daemon=True).start()

    def _run(self, key: Any, jobs: list[Job], fleet: Fleet) -> None:
        while True:
            try:
                result = self._compare(jobs, fleet)
            except Exception as exc:   # a background job logs and goes on
                log.error("dashboard: comparing the methods failed: %s", exc)
                result = None
            with self._lock:
                if not self._drop_running:
                    self._key, self.result, self._done_at = key, result, self._clock()
                self._drop_running = False
                if self._waiting is None:
                    self._running = None
                    return
                key, jobs, fleet = self._waiting
                self._running, self._waiting = key, None

    def close(self) -> None:
        with self._lock:
            self._waiting = None
        closer = getattr(self._compare, "close", None)
        if closer is not None:
            closer()
