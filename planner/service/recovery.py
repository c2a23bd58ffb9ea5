"""Recovery in the serve process: re-plan and push when a node of the current plan goes silent.

:class:`Replanner` is the serve runtime's background task: each check reads the current plan
(``planner.service.seams.CurrentPlan``: the broker's retained summary, so plans pushed by
``hulk-planner plan --push`` are covered too) and the nodes' heartbeats (``NodeDirectory``), and
when a node of the plan is down, re-plans (the decisions are planner/core/recovery.py's), replaces
the changed nodes' placements and the summary, and logs the time from detection to push. The
affected jobs are first repaired from their running placements (planner/search/repair.py: a free
node in the lost one's slot, or a smaller pipeline, then a bounded local search; well under a
second at 1,000 servers); a job that cannot be repaired, or whose placement is unknown, is
re-planned in full by the planner (serve's default: ``planner.methods.serve_planner``). With job
records (``JobStore``), finished jobs are never re-planned and each re-plan counts a restart.

Only what is signed by the planner's own key (or one it replaced, ``--previous-placement-key``:
the current plan re-signs that) is acted on: a summary that fails verification is logged once
and left alone (never re-planned from, never re-signed), and re-signing reads back each
node's retained placement and re-signs only those that verify. While nodes are healthy, a
summary with less than ``RESIGN_BEFORE_MS`` of validity left is re-signed together with its
placements (same roles, fresh times), so retained placements never expire under a running serve.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hulk.errors import HulkError, InputError
from hulk.wire.broker import BrokerAddress
from hulk.wire.placement import PlanSummary
from hulk.wire.signing import SIGNATURE_FIELD, Signer
from planner.core.costmodel import estimate
from planner.core.lifecycle import FINAL, PLACED, QUEUED, RUNNING
from planner.core.placements import (build_node_placements, build_summary, job_from_spec,
                                     plan_from_summary, stages_doc)
from planner.core.plan import Plan, Unplaced
from planner.core.recovery import Replan, down_nodes, jobs_using
from planner.search.repair import repair_jobs
from planner.service.metrics import NO_EVENTS, ServeEvents, plan_makespan_s
from planner.service.placement_seq import StoreSequence
from planner.service.broker_session import BrokerSession, keepalive_for
from planner.service.publisher import (RESIGN_BEFORE_MS, VALIDITY_MS, RetainedPlan,
                                       UntrustedSummary, new_plan_id)
from planner.service.runtime import BackgroundTask
from planner.service.seams import CurrentPlan, JobStore, NodeDirectory, ServeOptions, StoreDirectory

if TYPE_CHECKING:
    from planner.core.fleet import Network
    from planner.core.lifecycle import JobRecord
    from planner.methods import Planner
    from planner.service.node_rows import NodeRecord

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


def default_planner() -> Planner:
    """The planner serve re-plans and places jobs with: ``plan``'s default method on serve's
    time budget."""
    from planner.methods import serve_planner

    return serve_planner()


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
    """Periodic check: a node of the current plan is silent past ``options.node_timeout_s`` ->
    re-plan, push.

    ``plan`` is the current plan, ``nodes`` the nodes and network, ``jobs`` the job records
    (None: no lifecycle, every job of the plan is re-planned); ``planner`` plans the affected
    jobs the repair cannot place (default :func:`default_planner`). ``lock`` is shared with the
    job lifecycle, so their pushes never interleave.

    A restarted planner knows only heartbeats from before it went down: every node gets a full
    timeout after ``started_ms`` (when serve started) to reach it before it can be called
    silent. With a broker ``session`` (planner/service/broker_session.py) the timeout also
    counts from when serve's presence was last acknowledged online, and nobody is silent while
    it is not: agents renew their leases from the broker while serve is offline
    (agent/presence.py), so a planner down for an hour stops no job whose node reaches the
    broker, and none is ever re-placed while its old copy may still run.
    """

    def __init__(self, plan: CurrentPlan, nodes: NodeDirectory, jobs: JobStore | None = None, *,
                 options: ServeOptions, planner: Planner | None = None,
                 clock_ms: Callable[[], int] = now_ms,
                 monotonic: Callable[[], float] = time.monotonic, started_ms: int | None = None,
                 events: ServeEvents = NO_EVENTS, session: Any = None):
        self.plan, self.nodes, self.jobs = plan, nodes, jobs
        self.session = session     # has online_since_ms (BrokerSession); None: no presence
        self.options = options
        self._planner = planner
        self.clock_ms, self.monotonic = clock_ms, monotonic
        self.started_ms = clock_ms() if started_ms is None else started_ms
        self.events = events   # metrics: re-plans, pushes, failed rounds
        self.lock = asyncio.Lock()

    def silence_base_ms(self) -> int | None:
        """From when a node may be counted silent: serve's start and, with a broker session, its
        last acknowledged ``online`` (None: serve is not online, so no node is silent)."""
        if self.session is None:
            return self.started_ms
        since = self.session.online_since_ms
        return None if since is None else max(self.started_ms, since)

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = default_planner()
        return self._planner

    async def check(self) -> RecoveryReport | None:
        """One round; None when nothing had to change."""
        try:
            summary = await self.plan.summary()
        except UntrustedSummary:     # logged once where it was read
            return None
        except InputError as exc:
            log.error("recovery: ignoring the retained plan summary, it does not verify: %s", exc)
            return None
        if summary is None:
            return None
        nodes = await self.nodes.nodes()
        seen = {n.id: n.last_seen_ms for n in nodes if n.monitored}
        now = self.clock_ms()
        down = self._down(summary, seen, now, {n.id for n in nodes if n.revoked})
        if not down:
            if summary.expires_at_ms - now < RESIGN_BEFORE_MS:
                await self.resign(summary, now)
            return None
        t0 = self.monotonic()
        silent_for = max((now - (seen.get(n) or 0)) / 1000.0 for n in down)
        log.warning("recovery: node(s) %s revoked or silent for more than %.0f s", ", ".join(down),
                    self.options.node_timeout_s)
        net = await self.nodes.network()
        result, plan_ids, affected, records = await self._repair(summary, net, down)
        plan_id, count = await self._push(summary, net, nodes, down, result, plan_ids, affected,
                                          records, now)
        self.events.replanned(len(result.replanned), len(result.lost))
        self.events.plan_pushed("recovery", count, plan_makespan_s(result.plan, net))
        elapsed = self.monotonic() - t0
        log.warning("recovery: re-planned %s (kept %s, lost %s) as plan %s; pushed %d message(s) "
                    "%.2f s after detecting the loss (%.1f s after the last heartbeat)",
                    result.replanned or "nothing", result.kept or "none", result.lost or "none",
                    plan_id, count, elapsed, silent_for + elapsed)
        return RecoveryReport(down=down, replanned=result.replanned, lost=result.lost,
                              kept=result.kept, plan_id=plan_id, messages=count,
                              detect_to_push_s=elapsed, silent_for_s=silent_for)

    def _down(self, summary: PlanSummary, seen: Mapping[str, int | None], now: int,
              revoked: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """The plan's nodes silent past the timeout, and its revoked nodes (a revoked agent on a
        fleet without TLS may go on calling, but it is never planned on). Only nodes the store
        monitors can be silent (a plan made from a fleet file may name nodes that have no agent);
        none before it had a full timeout to reach this planner."""
        planned = {n for job in summary.jobs for n in job.node_ids}
        revoked_planned = planned & set(revoked)
        base = self.silence_base_ms()
        if base is None:
            return sorted(revoked_planned)
        heard = {n: max(seen[n] or 0, base) for n in planned if n in seen}
        return sorted(down_nodes(heard, now, self.options.node_timeout_s) | revoked_planned)

    async def _repair(self, summary: PlanSummary, net: Network, down: list[str]):
        """The plan with the jobs on ``down`` nodes repaired or re-planned: (the repair, each
        kept job's plan id, the affected jobs' names, the job records)."""
        plan, plan_ids, missing = plan_from_summary(summary, net)
        affected_names = jobs_using(plan, net, down) | set(missing)
        records = await self.jobs.unretired_jobs() if self.jobs is not None else []
        affected_names -= {r.name for r in records if r.state in FINAL}
        specs = {j.name: j for j in summary.jobs}
        affected = [job_from_spec(n, specs[n].spec) for n in sorted(affected_names)]
        plan = Plan(method=summary.method, placements=plan.placements,
                    unplaced=[Unplaced(name, reason) for name, reason, _ in summary.unplaced])
        # Planning takes seconds (the portfolio's budget): off the event loop, so heartbeats,
        # registrations and reports go on meanwhile.
        result = await asyncio.to_thread(repair_jobs, plan, net, affected, down,
                                         search=self.planner, seed=self.options.seed)
        for note in result.plan.notes:   # how each job was repaired or re-planned
            log.info("recovery: %s", note)
        return result, plan_ids, affected_names, records

    async def _push(self, summary: PlanSummary, net: Network, nodes: list[NodeRecord],
                    down: list[str], result: Replan, plan_ids: Mapping[str, str],
                    affected_names: set[str], records: list[JobRecord], now: int
                    ) -> tuple[str, int]:
        """Sign and retain the repaired plan on the nodes it changes; (plan id, messages)."""
        plan_id = new_plan_id(now)
        job_plan_ids = {n: plan_ids[n] for n in result.kept}
        addresses = {n.id: n.address for n in nodes if n.monitored and n.address}
        # Re-placed jobs start again (HULK_RESTART_COUNT): the count the job record will hold.
        restarts = {r.name: r.restarts for r in records}
        restarts.update({n: restarts.get(n, 0) + 1 for n in result.replanned})
        fleet = self.options.fleet
        placements = build_node_placements(result.plan, net, fleet=fleet, plan_id=plan_id,
                                           addresses=addresses, job_plan_ids=job_plan_ids,
                                           restart_counts=restarts)
        new_summary = build_summary(result.plan, net, fleet=fleet, plan_id=plan_id,
                                    issued_at_ms=self.clock_ms(), node_placements=placements,
                                    job_plan_ids=job_plan_ids)
        # Touch only nodes of the affected jobs (old and new) and the down nodes: nodes that run
        # kept jobs alone are not sent anything, so nothing there restarts.
        old_nodes = {n for job in summary.jobs if job.name in affected_names for n in job.node_ids}
        new_nodes = {n for n, np_ in placements.items()
                     if any(r.job in affected_names for r in np_.roles)}
        touched = old_nodes | new_nodes | set(down)
        sent = {n: placements[n] for n in touched if n in placements}
        count = await self.plan.replace(sent, new_summary, issued_at_ms=now,
                                        clear=[n for n in touched if n not in placements])
        if self.jobs is not None:
            moved = [p for p in result.plan.placements if p.job.name in result.replanned]
            placed = {p.job.name: [net.ids[i] for i in p.nodes] for p in moved}
            # The new placement's estimate: `jobs show` compares measured step times with it.
            estimates = {p.job.name: estimate(p, net).job_s for p in moved}
            await self.record(plan_id, placed, result.lost, estimates,
                              {p.job.name: stages_doc(p, net) for p in moved})
        return plan_id, count

    async def record(self, plan_id: str, placed: dict[str, list[str]], lost: list[str],
                     estimates: Mapping[str, float] | None = None,
                     stages: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """The job records' view of a re-plan: each re-placed live job's new plan id, nodes,
        stages and estimated seconds, each lost one queued again; both count a restart."""
        live = {r.name: r for r in await self.jobs.unretired_jobs()
                if r.state in (PLACED, RUNNING)}
        for name, job_nodes in placed.items():
            if name in live:
                await self.jobs.update_job(live[name].id, state=PLACED, plan_id=plan_id,
                                           nodes=job_nodes, restart=True,
                                           estimate_s=(estimates or {}).get(name),
                                           stages=(stages or {}).get(name),
                                           detail="re-planned after a node went silent")
        for name in lost:
            if name in live:
                await self.jobs.update_job(live[name].id, state=QUEUED, nodes=[], restart=True,
                                           detail="lost its nodes; waiting for free ones")

    async def resign(self, summary: PlanSummary, now: int) -> int:
        """Re-sign the (verified) summary and every node placement of it that verifies, with
        fresh times; the roles are unchanged, so agents keep their processes. Returns the
        number of messages pushed."""
        placements = await self.plan.placements(sorted({n for job in summary.jobs
                                                        for n in job.node_ids}))
        body = {k: v for k, v in summary.document.items() if k != SIGNATURE_FIELD}
        count = await self.plan.replace(placements, body, issued_at_ms=now)
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


def add_to_runtime(runtime: Any, *, broker: BrokerAddress, signer: Signer, options: ServeOptions,
                   interval_s: float, planner: Planner | None = None,
                   calibrate: Callable[[Network], Network] | None = None,
                   links: Callable[[], Any] | None = None) -> Replanner:
    """Run a Replanner over the serve runtime's store as its background task ``recovery``: every
    ``interval_s`` it looks for nodes silent past the options' timeout and re-plans their jobs,
    pushing through ``broker``; ``calibrate`` makes the network it (and the job lifecycle that
    shares its directory) plans on calibrated, ``links`` gives the link prediction it is
    completed with."""
    # One connection for everything serve sends and reads: it carries serve's presence.
    publisher = BrokerSession(broker, fleet=options.fleet, signer=signer,
                              identifier=f"hulk-planner-serve-{runtime.fleet}-{os.getpid()}",
                              keepalive_s=keepalive_for(options.node_timeout_s))
    runtime.add_task(BackgroundTask("broker", publisher.run, 1.0, in_store_thread=False,
                                    run_at_start=True, retry_s=1.0))
    directory = StoreDirectory(runtime.store, runtime.in_store, fleet=runtime.fleet,
                               window_days=runtime.window_days, calibrate=calibrate,
                               links=links)
    # Sequence numbers kept in the store: they keep growing across restarts of serve.
    plan = RetainedPlan(publisher, fleet=options.fleet, signer=signer,
                        sequence=StoreSequence(runtime.store.database))
    replanner = Replanner(plan, directory,
                          directory, options=options, planner=planner,
                          events=getattr(runtime, "events", NO_EVENTS), session=publisher)
    runtime.add_task(BackgroundTask("recovery", replanner.run_once, interval_s,
                                    in_store_thread=False))
    log.info("recovery: nodes silent for %.0f s lose their roles; checking every %.1f s via %s",
             options.node_timeout_s, interval_s, publisher.broker)
    return replanner
