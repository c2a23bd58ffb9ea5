"""Recovery and growth: a node that goes silent loses its role; only its jobs are re-planned.

Pure decisions (plain values in, plain values out):

- :func:`down_nodes`: nodes whose last heartbeat is older than the timeout.
- :func:`jobs_using`: the jobs of a plan that have a role on any of those nodes.
- :func:`replan_jobs`: keep every other job's placement as it is; plan the affected jobs with the
  search planner on a sub-network of the *free* nodes (neither down nor used by a kept job), and
  map the result back to the full network's indices.

Growth: a node that registers joins the store's fleet and is used by the next plan (``plan
--push`` or the next recovery's free nodes); a running plan is not reshuffled for a newcomer,
since that would restart jobs that are fine.

:class:`Replanner` is the serve runtime's background task: each check reads the current plan
from the broker's retained summary (so plans pushed by ``hulk-planner plan --push`` are covered
too), the heartbeat times from the store, and when a node of the plan is down, re-plans, pushes
the changed nodes' placements and the new summary, and logs the time from detection to push.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hulk.errors import HulkError, PlanningError
from hulk.wire.broker import plan_topic
from hulk.wire.placement import parse_summary
from planner.core.costmodel import Placement, Stage
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, Unplaced
from planner.service.publisher import Publisher, new_plan_id, push_plan
from planner.core.placements import (build_node_placements, build_summary, job_from_spec,
                                     plan_from_summary)

log = logging.getLogger(__name__)

SearchFn = Callable[..., Plan]


def down_nodes(last_seen_ms: Mapping[str, int | None], now_ms: int, timeout_s: float) -> set[str]:
    """Nodes not heard from for longer than ``timeout_s`` (never heard from counts as down)."""
    limit = now_ms - timeout_s * 1000.0
    return {node for node, seen in last_seen_ms.items() if seen is None or seen < limit}


def jobs_using(plan: Plan, net: Network, node_ids: Iterable[str]) -> set[str]:
    """Names of the plan's jobs with a role on any of ``node_ids``."""
    wanted = {net.index[n] for n in node_ids if n in net.index}
    return {p.job.name for p in plan.placements if wanted.intersection(p.nodes)}


def sub_network(net: Network, keep: list[int]) -> Network:
    """The network restricted to node indices ``keep`` (in that order)."""
    return Network(tuple(net.nodes[i] for i in keep), net.rtt_ms[keep][:, keep], net.bw[keep][:, keep],
                   net.imputed[keep][:, keep])


@dataclass
class Replan:
    plan: Plan                     # over the full network's indices
    replanned: list[str]           # jobs placed again (new roles)
    kept: list[str]                # jobs whose placement did not change
    lost: list[str]                # affected jobs that could not be placed again
    free_nodes: list[str] = field(default_factory=list)


def replan_jobs(plan: Plan, net: Network, affected: Iterable[Job], down: Iterable[str], *,
                search: SearchFn | None = None, seed: int = 0) -> Replan:
    """Re-plan ``affected`` jobs on the nodes that are neither ``down`` nor used by the others.

    ``plan`` holds the placements to keep (affected jobs in it are dropped first); its unplaced
    jobs stay unplaced.
    """
    affected = list(affected)
    names = {j.name for j in affected}
    kept = [p for p in plan.placements if p.job.name not in names]
    used = {i for p in kept for i in p.nodes}
    down_idx = {net.index[n] for n in down if n in net.index}
    free = [i for i in range(net.n) if i not in used and i not in down_idx]
    unplaced = list(plan.unplaced)
    placed: list[Placement] = []
    if affected:
        if not free:
            unplaced += [Unplaced(j.name, "no free nodes left after a node failure") for j in affected]
        else:
            if search is None:
                from planner.search import plan_search as search
            try:
                sub_plan = search(affected, sub_network(net, free), seed=seed)
            except PlanningError as exc:
                unplaced += [Unplaced(j.name, f"re-plan after a node failure: {exc}") for j in affected]
            else:
                for p in sub_plan.placements:
                    stages = tuple(Stage(st.lo, st.hi, tuple(free[i] for i in st.nodes)) for st in p.stages)
                    placed.append(Placement(job=p.job, stages=stages, micro_batch=p.micro_batch,
                                            phase=p.phase))
                unplaced += list(sub_plan.unplaced)
    new_plan = Plan(method=plan.method, placements=kept + placed, unplaced=unplaced,
                    notes=plan.notes + [f"re-planned {sorted(names)} without {sorted(set(down))}"])
    placed_names = {p.job.name for p in placed}
    return Replan(plan=new_plan, replanned=sorted(placed_names), kept=sorted(p.job.name for p in kept),
                  lost=sorted(names - placed_names), free_nodes=[net.ids[i] for i in free])


# ------------------------------------------------------------------------------ the service

@dataclass
class RecoveryReport:
    down: list[str]
    replanned: list[str]
    lost: list[str]
    kept: list[str]
    plan_id: str
    messages: int
    detect_to_push_s: float
    silent_for_s: float            # how long the first down node had been silent when detected


class Replanner:
    """Periodic check: a node of the current plan is silent past ``timeout_s`` -> re-plan, push.

    Inputs are callables (the serve runtime passes store reads run on the store's thread):
    ``last_seen()`` -> node id -> last heartbeat (epoch ms); ``network()`` -> the live Network;
    ``addresses()`` -> node id -> registered address (rendezvous addresses).
    """

    def __init__(self, publisher: Publisher, *, fleet: str,
                 last_seen: Callable[[], Awaitable[Mapping[str, int | None]]],
                 network: Callable[[], Awaitable[Network]],
                 addresses: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
                 timeout_s: float = 30.0, search: SearchFn | None = None, seed: int = 0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic, read_wait_s: float = 0.3):
        self.publisher = publisher
        self.fleet = fleet
        self.last_seen = last_seen
        self.network = network
        self.addresses = addresses
        self.timeout_s = timeout_s
        self.search = search
        self.seed = seed
        self.clock_ms = clock_ms
        self.monotonic = monotonic
        self.read_wait_s = read_wait_s
        self.reports: list[RecoveryReport] = []

    async def check(self) -> RecoveryReport | None:
        """One round; None when nothing had to change."""
        raw = await self.publisher.read_retained(plan_topic(self.fleet), self.read_wait_s)
        if not raw:
            return None
        summary = parse_summary(raw, source=plan_topic(self.fleet))
        seen = await self.last_seen()
        now = self.clock_ms()
        planned = {n for job in summary.jobs for n in job.node_ids}
        # Only nodes the store monitors can be declared down (a plan made from a fleet file may
        # name nodes that have no agent).
        down = sorted(down_nodes({n: seen[n] for n in planned if n in seen}, now, self.timeout_s))
        if not down:
            return None
        t0 = self.monotonic()
        silent_for = max((now - (seen[n] or 0)) / 1000.0 for n in down)
        log.warning("recovery: node(s) %s silent for more than %.0f s", ", ".join(down), self.timeout_s)

        net = await self.network()
        plan, plan_ids, missing = plan_from_summary(summary, net)
        affected_names = jobs_using(plan, net, down) | set(missing)
        specs = {j.name: j for j in summary.jobs}
        affected = [job_from_spec(n, specs[n].spec) for n in sorted(affected_names)]
        plan = Plan(method=summary.method, placements=plan.placements,
                    unplaced=[Unplaced(name, reason) for name, reason, _ in summary.unplaced])
        result = replan_jobs(plan, net, affected, down, search=self.search, seed=self.seed)

        plan_id = new_plan_id(now)
        job_plan_ids = {n: plan_ids[n] for n in result.kept}
        addresses = dict(await self.addresses()) if self.addresses else {}
        placements = build_node_placements(result.plan, net, fleet=self.fleet, plan_id=plan_id,
                                           addresses=addresses, job_plan_ids=job_plan_ids)
        new_summary = build_summary(result.plan, net, fleet=self.fleet, plan_id=plan_id,
                                    issued_at_ms=self.clock_ms(), node_placements=placements,
                                    job_plan_ids=job_plan_ids)
        # Touch only nodes of the affected jobs (old and new) and the down nodes: nodes that run
        # kept jobs alone are not sent anything, so nothing there restarts.
        old_nodes = {n for job in summary.jobs if job.name in affected_names for n in job.node_ids}
        new_nodes = {n for n, np_ in placements.items() if any(r.job in affected_names for r in np_.roles)}
        touched = old_nodes | new_nodes | set(down)
        sent = {n: placements[n] for n in touched if n in placements}
        count = await push_plan(self.publisher, self.fleet, sent, new_summary,
                                clear=[n for n in touched if n not in placements])
        elapsed = self.monotonic() - t0
        report = RecoveryReport(down=down, replanned=result.replanned, lost=result.lost,
                                kept=result.kept, plan_id=plan_id, messages=count,
                                detect_to_push_s=elapsed, silent_for_s=silent_for)
        self.reports.append(report)
        log.warning("recovery: re-planned %s (kept %s, lost %s) as plan %s; pushed %d message(s) "
                    "%.2f s after detecting the loss (%.1f s after the last heartbeat)",
                    result.replanned or "nothing", result.kept or "none", result.lost or "none",
                    plan_id, count, elapsed, silent_for + elapsed)
        return report

    async def run_once(self) -> RecoveryReport | None:
        """For the serve runtime's periodic task: failures are logged and the loop goes on."""
        try:
            return await self.check()
        except HulkError as exc:
            log.warning("recovery check failed: %s", exc)
            return None


def store_sources(runtime: Any, window_days: int = 90) -> dict[str, Any]:
    """The Replanner's inputs from a serve runtime's store (each read on the store's thread)."""
    from planner.core.fleet import complete
    from planner.service.graph import fleet_from_store

    def _rows() -> list[dict[str, Any]]:
        return [r for r in runtime.store.nodes() if r.get("source") != "import"]

    async def last_seen() -> dict[str, int | None]:
        return {r["id"]: r.get("last_seen_ms") for r in await runtime.in_store(_rows)}

    async def addresses() -> dict[str, str]:
        return {r["id"]: r["address"] for r in await runtime.in_store(_rows) if r.get("address")}

    async def network() -> Network:
        fleet = await runtime.in_store(fleet_from_store, runtime.store, window_days, runtime.fleet)
        return complete(fleet)

    return {"last_seen": last_seen, "addresses": addresses, "network": network}


def add_serve_arguments(p: Any) -> None:
    """``hulk-planner serve`` flags for recovery (planner/commands/serve.py calls this)."""
    from hulk.settings import env

    p.add_argument("--mqtt", metavar="URL", default=env("HULK_MQTT"),
                   help="broker mqtt://[user:pass@]HOST:PORT (HULK_MQTT): re-plan and push "
                        "placements when a node of the current plan goes silent")
    p.add_argument("--node-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a node silent this long is down; its jobs are re-planned (default 30)")
    p.add_argument("--recovery-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between checks for silent nodes (default: a third of --node-timeout)")


def add_to_runtime(runtime: Any, args: Any, *, search: SearchFn | None = None) -> Replanner | None:
    """With ``--mqtt``: run a Replanner as the serve runtime's background task ``recovery``.
    ``search`` plans the affected jobs (default: the search planner; serve passes the GNN when
    a model dir is given)."""
    if not getattr(args, "mqtt", None):
        return None
    from hulk.errors import ConfigError
    from hulk.wire.broker import parse_broker_url
    from planner.service.publisher import MqttPublisher
    from planner.service.runtime import BackgroundTask

    if not args.node_timeout > 0:
        raise ConfigError(f"expected seconds > 0, got {args.node_timeout}", field="--node-timeout")
    interval = args.recovery_interval or max(0.5, args.node_timeout / 3)
    publisher = MqttPublisher(parse_broker_url(args.mqtt, source="--mqtt"),
                              identifier=f"hulk-planner-serve-{runtime.fleet}-{os.getpid()}")
    replanner = Replanner(publisher, fleet=runtime.fleet, timeout_s=args.node_timeout,
                          search=search, **store_sources(runtime, getattr(args, "window_days", 90)))
    runtime.add_task(BackgroundTask("recovery", replanner.run_once, interval, in_store_thread=False))
    log.info("recovery: nodes silent for %.0f s lose their roles; checking every %.1f s via %s",
             args.node_timeout, interval, publisher.broker)
    return replanner
