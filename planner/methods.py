"""The planning methods: one registry, one calling convention.

Every method is a :class:`Method` in :data:`METHODS` (its label is written here and nowhere
else); :func:`planner_for` turns one into a :class:`Planner`, a function
``(jobs, net, *, seed=0, progress=None, **options) -> Plan``. The CLI (`plan --method`), serve
(:func:`serve_planner`), the dashboard's comparison, the plots and the benchmarks all go through
it. A method's module is imported when it is first used, so only the GNN methods load torch.

The default method (``portfolio``) also takes ``baselines``: the baselines' plans a caller has
made anyway (`plan` passes those of its comparison), judged with its own instead of made again.

The placement GNN only ever adds a start: ``--method gnn`` is the default portfolio with the
GNN's scores as one more start (planner.gnn.starts.plan_with_gnn_start), and serve does the same
(:func:`serve_planner`); the built-in starts run as they would without it, so its plan is never
longer than the portfolio's. ``gnn-raw``, the GNN's grouping decoded without any search, is a
diagnostic for the benchmarks (:data:`DIAGNOSTIC_METHODS`): :func:`planner_for` knows it, `plan`
does not offer it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from planner.core.fleet import Network
    from planner.core.jobs import Job
    from planner.core.plan import Plan

log = logging.getLogger(__name__)

PLAN_OPTIONS = frozenset({"budget_s", "workers", "starts"})   # options `plan` has flags for
# serve re-plans when jobs are submitted and when nodes go silent, while their jobs wait: 20 s
# bounds that wait (below the default --node-timeout of 30 s) and still refines about a dozen
# starts one after another on a 90-server, 4-job fleet (the plain search alone: about 3 s), the
# starts that let the portfolio beat the plain search.
SERVE_BUDGET_S = 20.0


class Planner(Protocol):
    def __call__(self, jobs: Sequence[Job], net: Network, *, seed: int = 0,
                 progress: Callable[..., None] | None = None, **options: Any) -> Plan: ...


@dataclass(frozen=True)
class Method:
    """A planning method: where its function lives and how it is called.

    ``fixed``: keyword arguments always passed; ``seeded``: it takes ``seed``; ``options``: the
    options among :data:`PLAN_OPTIONS` it takes (others are not passed); ``views``: above the
    scale limit it plans on planner.search.scale.SEARCH_VIEWS views of the fleet, else on one
    (that module is not imported here: it loads the whole search); ``compared``: `plan
    --compare` runs it; ``slow_at_scale``: left out of that comparison above the scale limit."""

    name: str
    label: str
    module: str
    function: str
    fixed: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    seeded: bool = False
    options: frozenset[str] = frozenset()
    views: bool = False
    compared: bool = False
    slow_at_scale: bool = False

    def load(self) -> Callable[..., Plan]:
        """The planning function itself (its module is imported now)."""
        return getattr(importlib.import_module(self.module), self.function)


def _methods(*methods: Method) -> dict[str, Method]:
    return {m.name: m for m in methods}


METHODS: dict[str, Method] = _methods(
    Method("portfolio", "Hulk (portfolio)", "planner.search.portfolio", "plan_portfolio",
           seeded=True, options=PLAN_OPTIONS | {"baselines"}, views=True),
    Method("search", "Hulk (search)", "planner.search", "plan_search", views=True),
    Method("system-a", "System A (data parallel)", "planner.baselines.systems", "plan_system_a",
           compared=True),
    Method("system-b", "System B (GPipe)", "planner.baselines.systems", "plan_system_b",
           compared=True),
    Method("system-c", "System C (Megatron TP)", "planner.baselines.systems", "plan_system_c",
           compared=True),
    Method("dtfm", "DT-FM-style peer", "planner.baselines.dtfm", "plan_dtfm", seeded=True,
           compared=True, slow_at_scale=True),
    Method("gnn", "Hulk (portfolio + GNN start)", "planner.gnn.starts", "plan_with_gnn_start",
           seeded=True, options=PLAN_OPTIONS | {"baselines", "checkpoint"}, views=True),
)
DEFAULT_METHOD = "portfolio"
# The exact search improves or certifies these (small fleets): both are the portfolio.
EXACT_IMPROVED = frozenset({DEFAULT_METHOD, "gnn"})
# Known to planner_for (benchmarks, golden set) but no method `plan` offers: it plans without
# the search.
DIAGNOSTIC_METHODS: dict[str, Method] = _methods(
    Method("gnn-raw", "GNN raw (diagnostic)", "planner.gnn.infer", "plan_gnn",
           fixed=MappingProxyType({"refine": False})),
)


def label(name: str) -> str:
    """The method's label, or ``name`` itself for a name that is no method."""
    method = METHODS.get(name) or DIAGNOSTIC_METHODS.get(name)
    return method.label if method is not None else name


def compared_methods(chosen: str, n_nodes: int, limit: int) -> tuple[list[str], list[str]]:
    """(methods `plan --compare` runs beside ``chosen``, those it leaves out because the fleet
    has more than ``limit`` servers)."""
    skipped = [m.name for m in METHODS.values()
               if m.compared and m.slow_at_scale and n_nodes > limit and m.name != chosen]
    run = [m.name for m in METHODS.values() if m.compared and m.name not in skipped]
    return run, skipped


def _call(method: Method, fn: Callable[..., Plan], jobs, net, seed: int, progress,
          options: Mapping[str, Any]) -> Plan:
    from planner.search import exact
    from planner.search.scale import SCALE_NODE_LIMIT, SEARCH_VIEWS, plan_at_scale

    kwargs = dict(method.fixed)
    if method.seeded:
        kwargs["seed"] = seed
    kwargs.update({k: v for k, v in options.items() if v is not None and k in method.options})
    if net.n > SCALE_NODE_LIMIT:   # given baseline plans index the whole fleet, not a view
        kwargs.pop("baselines", None)
    # Above the scale limit every method plans on the best sites (a note says so); the search
    # methods also on larger views, up to the whole fleet, and keep the best.
    views = SEARCH_VIEWS if method.views else 1
    plan = plan_at_scale(fn, jobs, net, progress=progress, views=views, **kwargs)
    # Small fleets: the exact search (planner.search.exact) improves or certifies the default.
    return exact.improve(jobs, net, plan) if method.name in EXACT_IMPROVED else plan


def planner_for(name: str) -> Planner:
    """The :class:`Planner` of method ``name`` (its module is imported now). Options the method
    does not take, and those left at None, are not passed to it; nor is ``seed`` to a method
    that takes none."""
    method = METHODS[name] if name in METHODS else DIAGNOSTIC_METHODS[name]
    fn = method.load()

    def plan(jobs, net, *, seed=0, progress=None, **options):
        return _call(method, fn, jobs, net, seed, progress, options)

    return plan


def plan_with(name: str, jobs, net, **kwargs: Any) -> Plan:
    """``planner_for(name)(jobs, net, **kwargs)``."""
    return planner_for(name)(jobs, net, **kwargs)


def gnn_starts(jobs, net, checkpoint: str | Path) -> list[tuple[str, Any]]:
    """The GNN's class scores as one extra portfolio start, or none (with a logged warning)
    when the checkpoint cannot be loaded or scored: the GNN never stops planning."""
    try:
        from planner.gnn.infer import load_cached, node_scores

        return [("gnn", node_scores(list(jobs), net, load_cached(checkpoint)))]
    except Exception as exc:   # a missing, damaged or foreign checkpoint: plan without it
        log.warning("GNN start left out, planning without it (%s): %s", checkpoint, exc)
        return []


def _portfolio_with_gnn(fn: Callable[..., Plan], checkpoint: Path, jobs, net,
                        **kwargs: Any) -> Plan:
    # Scored on the network planned, which above the scale limit is a view of the fleet.
    return fn(jobs, net, extra_starts=gnn_starts(jobs, net, checkpoint), **kwargs)


def serve_planner(*, budget_s: float = SERVE_BUDGET_S,
                  checkpoint: Path | None = None) -> Planner:
    """The planner of serve's lifecycle and recovery: the default method with ``budget_s``
    and its starts refined in serve's own process (``workers=1``: forking a process that runs
    gRPC threads and then running Python in the child can abort it). With ``checkpoint`` the
    GNN's scores are one more start (:func:`gnn_starts`); the search's own starts always run,
    so the plan is never longer than the plain search's. ``options`` a caller passes override
    these defaults."""
    method = METHODS[DEFAULT_METHOD]
    defaults = {"budget_s": budget_s, "workers": 1}

    def plan(jobs, net, *, seed=0, progress=None, **options):
        fn = method.load()
        if checkpoint is not None:
            fn = partial(_portfolio_with_gnn, fn, Path(checkpoint))
        return _call(method, fn, jobs, net, seed, progress, {**defaults, **options})

    return plan
