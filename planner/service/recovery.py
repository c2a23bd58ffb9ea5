"""Recovery in the serve process: re-plan and push when a node of the current plan goes silent.

:class:`Replanner` is the serve runtime's background task: each check reads the current plan
from the broker's retained summary (so plans pushed by ``hulk-planner plan --push`` are covered
too), the heartbeat times from the store, and when a node of the plan is down, re-plans (the
decisions are planner/core/recovery.py's), pushes the changed nodes' placements and the new
summary, and logs the time from detection to push. The affected jobs are first repaired from
their running placements (planner/search/repair.py: a free node in the lost one's slot, or a
smaller pipeline, then a bounded local search; well under a second at 1,000 servers); a job that
cannot be repaired, or whose placement is unknown, is re-planned in full with ``search``.

Only what is signed by the planner's own key is acted on: a summary that fails verification is
logged and left alone (never re-planned from, never re-signed), and re-signing reads back each
node's retained placement and re-signs only those that verify. While nodes are healthy, a
summary with less than ``RESIGN_BEFORE_MS`` of validity left is re-signed together with its
placements (same roles, fresh times), so retained placements never expire under a running serve.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hulk.errors import HulkError, InputError
from hulk.wire.broker import BrokerAddress, placement_topic, plan_topic
from hulk.wire.placement import NodePlacement, PlanSummary, parse_placement, parse_summary
from hulk.wire.signing import SIGNATURE_FIELD, Signer
from planner.core.fleet import Network, complete
from planner.core.placements import (build_node_placements, build_summary, job_from_spec,
                                     plan_from_summary)
from planner.core.plan import Plan, Unplaced
from planner.core.recovery import Replan, SearchFn, down_nodes, jobs_using
from planner.search import plan_search
from planner.search.repair import repair_jobs
from planner.service.graph import fleet_from_store
from planner.service.metrics import NO_EVENTS, ServeEvents, plan_makespan_s
from planner.service.publisher import (RESIGN_BEFORE_MS, VALIDITY_MS, MqttPublisher, Publisher, new_plan_id,
                                       push_plan)
from planner.service.runtime import BackgroundTask

log = logging.getLogger(__name__)


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
    ``addresses()`` -> node id -> registered address (rendezvous addresses). ``replan`` decides
    the new plan (default: :func:`repair_jobs`, the warm-started repair); ``search`` plans the
    affected jobs it cannot repair (serve passes the GNN when it has a model dir).

    A restarted planner knows only heartbeats from before it went down: every node gets a full
    ``timeout_s`` after ``started_ms`` (when serve started) to reach it before it can be called
    silent, so a planner down for an hour stops no running job.
    """

    def __init__(self, publisher: Publisher, *, fleet: str, signer: Signer,
                 last_seen: Callable[[], Awaitable[Mapping[str, int | None]]],
                 network: Callable[[], Awaitable[Network]],
                 addresses: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
                 timeout_s: float = 30.0, search: SearchFn = plan_search, seed: int = 0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic, read_wait_s: float = 0.3,
                 started_ms: int | None = None,
                 finished_jobs: Callable[[], Awaitable[set[str]]] | None = None,
                 on_replanned: Callable[..., Awaitable[None]] | None = None,
                 restart_counts: Callable[[], Awaitable[Mapping[str, int]]] | None = None,
                 events: ServeEvents = NO_EVENTS,
                 replan: Callable[..., Replan] = repair_jobs):
        self.publisher = publisher
        self.fleet = fleet
        self.signer = signer
        self.verifier = signer.verifier()
        self.last_seen = last_seen
        self.network = network
        self.addresses = addresses
        self.timeout_s = timeout_s
        self.search = search
        self.replan = replan
        self.seed = seed
        self.clock_ms = clock_ms
        self.monotonic = monotonic
        self.read_wait_s = read_wait_s
        self.started_ms = clock_ms() if started_ms is None else started_ms
        # Job records (serve's lifecycle): finished jobs are never re-planned; a re-plan counts
        # a restart. The lock is shared with the lifecycle task so their pushes never interleave.
        self.finished_jobs = finished_jobs
        self.on_replanned = on_replanned
        self.restart_counts = restart_counts
        self.lock = asyncio.Lock()
        self.events = events   # metrics: re-plans, pushes, failed rounds

    async def check(self) -> RecoveryReport | None:
        """One round; None when nothing had to change."""
        raw = await self.publisher.read_retained(plan_topic(self.fleet), self.read_wait_s)
        if not raw:
            return None
        try:
            summary = parse_summary(raw, source=plan_topic(self.fleet), verifier=self.verifier)
        except InputError as exc:
            log.error("recovery: ignoring the retained plan summary, it does not verify: %s", exc)
            return None
        seen = await self.last_seen()
        now = self.clock_ms()
        planned = {n for job in summary.jobs for n in job.node_ids}
        # Only nodes the store monitors can be declared down (a plan made from a fleet file may
        # name nodes that have no agent); none before it had a full timeout to reach this planner.
        heard = {n: max(seen[n] or 0, self.started_ms) for n in planned if n in seen}
        down = sorted(down_nodes(heard, now, self.timeout_s))
        if not down:
            if summary.expires_at_ms - now < RESIGN_BEFORE_MS:
                await self.resign(summary, now)
            return None
        t0 = self.monotonic()
        silent_for = max((now - (seen[n] or 0)) / 1000.0 for n in down)
        log.warning("recovery: node(s) %s silent for more than %.0f s", ", ".join(down), self.timeout_s)

        net = await self.network()
        plan, plan_ids, missing = plan_from_summary(summary, net)
        affected_names = jobs_using(plan, net, down) | set(missing)
        if self.finished_jobs is not None:
            affected_names -= await self.finished_jobs()
        specs = {j.name: j for j in summary.jobs}
        affected = [job_from_spec(n, specs[n].spec) for n in sorted(affected_names)]
        plan = Plan(method=summary.method, placements=plan.placements,
                    unplaced=[Unplaced(name, reason) for name, reason, _ in summary.unplaced])
        result = self.replan(plan, net, affected, down, search=self.search, seed=self.seed)
        for note in result.plan.notes:   # how each job was repaired or re-planned
            log.info("recovery: %s", note)

        plan_id = new_plan_id(now)
        job_plan_ids = {n: plan_ids[n] for n in result.kept}
        addresses = dict(await self.addresses()) if self.addresses else {}
        # Re-placed jobs start again (HULK_RESTART_COUNT): the count the job record will hold.
        restarts = dict(await self.restart_counts()) if self.restart_counts else {}
        restarts.update({n: restarts.get(n, 0) + 1 for n in result.replanned})
        placements = build_node_placements(result.plan, net, fleet=self.fleet, plan_id=plan_id,
                                           addresses=addresses, job_plan_ids=job_plan_ids,
                                           restart_counts=restarts)
        new_summary = build_summary(result.plan, net, fleet=self.fleet, plan_id=plan_id,
                                    issued_at_ms=self.clock_ms(), node_placements=placements,
                                    job_plan_ids=job_plan_ids)
        # Touch only nodes of the affected jobs (old and new) and the down nodes: nodes that run
        # kept jobs alone are not sent anything, so nothing there restarts.
        old_nodes = {n for job in summary.jobs if job.name in affected_names for n in job.node_ids}
        new_nodes = {n for n, np_ in placements.items() if any(r.job in affected_names for r in np_.roles)}
        touched = old_nodes | new_nodes | set(down)
        sent = {n: placements[n] for n in touched if n in placements}
        count, _ = await push_plan(self.publisher, self.fleet, sent, new_summary, signer=self.signer,
                                   issued_at_ms=now, clear=[n for n in touched if n not in placements])
        if self.on_replanned is not None:
            nodes = {p.job.name: [net.ids[i] for i in p.nodes] for p in result.plan.placements
                     if p.job.name in result.replanned}
            await self.on_replanned(plan_id, nodes, result.lost)
        self.events.replanned(len(result.replanned), len(result.lost))
        self.events.plan_pushed("recovery", count, plan_makespan_s(result.plan, net))
        elapsed = self.monotonic() - t0
        report = RecoveryReport(down=down, replanned=result.replanned, lost=result.lost,
                                kept=result.kept, plan_id=plan_id, messages=count,
                                detect_to_push_s=elapsed, silent_for_s=silent_for)
        log.warning("recovery: re-planned %s (kept %s, lost %s) as plan %s; pushed %d message(s) "
                    "%.2f s after detecting the loss (%.1f s after the last heartbeat)",
                    result.replanned or "nothing", result.kept or "none", result.lost or "none",
                    plan_id, count, elapsed, silent_for + elapsed)
        return report

    async def resign(self, summary: PlanSummary, now: int) -> int:
        """Re-sign the (verified) summary and every node placement of it that verifies, with
        fresh times; the roles are unchanged, so agents keep their processes. Returns the
        number of messages pushed."""
        nodes = sorted({n for job in summary.jobs for n in job.node_ids})
        placements: dict[str, NodePlacement] = {}
        for node in nodes:
            topic = placement_topic(self.fleet, node)
            raw = await self.publisher.read_retained(topic, self.read_wait_s)
            if not raw:
                continue
            try:
                placement = parse_placement(raw, source=topic, verifier=self.verifier)
                if placement.node != node or placement.fleet != self.fleet:
                    raise InputError(f"expected node {node!r} of fleet {self.fleet!r}", path=topic)
            except InputError as exc:
                log.error("re-signing: leaving %s alone, it does not verify: %s", topic, exc)
                continue
            placements[node] = placement
        body = {k: v for k, v in summary.document.items() if k != SIGNATURE_FIELD}
        count, _ = await push_plan(self.publisher, self.fleet, placements, body, signer=self.signer,
                                   issued_at_ms=now)
        self.events.plan_pushed("resign", count)
        log.info("re-signed plan %s: the summary and %d placement(s), valid for %.0f more days",
                 summary.plan_id, len(placements), VALIDITY_MS / 86_400_000)
        return count

    async def run_once(self) -> RecoveryReport | None:
        """For the serve runtime's periodic task: failures are logged and the loop goes on."""
        try:
            async with self.lock:
                return await self.check()
        except HulkError as exc:
            self.events.push_failed("recovery")
            log.warning("recovery check failed: %s", exc)
            return None


def store_sources(runtime: Any, window_days: int) -> dict[str, Any]:
    """The Replanner's inputs from a serve runtime's store (each read on the store's thread)."""
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


def add_to_runtime(runtime: Any, *, broker: BrokerAddress, node_timeout_s: float,
                   interval_s: float, window_days: int, search: SearchFn, signer: Signer,
                   hooks: Mapping[str, Any] | None = None) -> Replanner:
    """Run a Replanner as the serve runtime's background task ``recovery``: every ``interval_s``
    it looks for nodes silent past ``node_timeout_s`` and re-plans their jobs with ``search``,
    pushing through ``broker``."""
    publisher = MqttPublisher(broker, identifier=f"hulk-planner-serve-{runtime.fleet}-{os.getpid()}")
    replanner = Replanner(publisher, fleet=runtime.fleet, signer=signer, timeout_s=node_timeout_s,
                          search=search, events=getattr(runtime, "events", NO_EVENTS), **(hooks or {}),
                          **store_sources(runtime, window_days))
    runtime.add_task(BackgroundTask("recovery", replanner.run_once, interval_s,
                                    in_store_thread=False))
    log.info("recovery: nodes silent for %.0f s lose their roles; checking every %.1f s via %s",
             node_timeout_s, interval_s, publisher.broker)
    return replanner
