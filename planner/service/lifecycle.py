"""The job lifecycle in `serve --mqtt`: thin I/O around planner/core/lifecycle.py.

Each round (a ``BackgroundTask``) reads the unretired job records (``JobStore``) and the nodes'
launch states (``NodeDirectory``), moves placed and running jobs on (running, succeeded,
failed), then, when a job is to be retired or queued jobs wait, reads the current plan
(``CurrentPlan``, verified), keeps the placements of every other job, plans the queued jobs on
the nodes no active job uses, and replaces the placements of the nodes it touched only (a
finished or cancelled job's nodes, as the current plan names them, are cleared, so its processes
stop; nodes of jobs that keep running are sent nothing). The summary is replaced with one naming
every active job, so recovery re-plans them when a node goes silent; the job records are then
updated to match (planner/service/seams.py: the current plan is the summary, records a view).

It shares the Replanner's lock, current plan and collaborators, so the two never push over each
other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hulk.errors import HulkError, InputError
from planner.core.lifecycle import (PLACED, QUEUED, JobRecord, next_state, place_queued,
                                    to_retire)
from planner.core.placements import build_node_placements, build_summary, plan_from_summary
from planner.core.plan import Plan
from planner.core.recovery import down_nodes
from planner.service.metrics import NO_EVENTS, ServeEvents, plan_makespan_s
from planner.service.node_rows import NodeRecord
from planner.service.publisher import new_plan_id
from planner.service.recovery import Replanner, default_planner, now_ms
from planner.service.runtime import BackgroundTask
from planner.service.seams import CurrentPlan, JobStore, NodeDirectory, ServeOptions

if TYPE_CHECKING:
    from planner.methods import Planner

log = logging.getLogger(__name__)


@dataclass
class LifecycleRound:
    moved: dict[str, str] = field(default_factory=dict)      # job -> its new state
    retired: list[str] = field(default_factory=list)
    placed: dict[str, list[str]] = field(default_factory=dict)
    plan_id: str | None = None


class JobLifecycle:
    """One round per call of :meth:`run_once` over the current ``plan``, the ``nodes`` and the
    ``jobs``; queued jobs are placed by ``planner`` (default: serve's, as recovery's)."""

    def __init__(self, plan: CurrentPlan, nodes: NodeDirectory, jobs: JobStore, *,
                 options: ServeOptions, planner: Planner | None = None,
                 lock: asyncio.Lock | None = None, clock_ms: Callable[[], int] = now_ms,
                 events: ServeEvents = NO_EVENTS):
        self.plan, self.nodes, self.jobs = plan, nodes, jobs
        self.options = options
        self._planner = planner
        self.lock = lock or asyncio.Lock()
        self.clock_ms = clock_ms
        self.events = events   # metrics: state changes, pushes, failed rounds

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = default_planner()
        return self._planner

    async def run_once(self) -> LifecycleRound | None:
        try:
            async with self.lock:
                return await self.round()
        except HulkError as exc:
            self.events.push_failed("jobs")
            log.warning("job lifecycle round failed: %s", exc)
            return None

    async def round(self) -> LifecycleRound:
        out = LifecycleRound()
        records = await self.jobs.unretired_jobs()
        nodes = await self.nodes.nodes()
        ranks = {n.id: n.launch for n in nodes if n.launch is not None}
        current: list[JobRecord] = []
        for record in records:
            state, detail = next_state(record, ranks)
            if state != record.state:
                await self.jobs.update_job(record.id, state=state, detail=detail)
                log.info("job %s: %s -> %s %s", record.name, record.state, state, detail)
                out.moved[record.name] = state
                self.events.job_moved(state)
                record = await self.jobs.job(record.id)
            current.append(record)
        retire = to_retire(current)
        queued = [r for r in current if r.state == QUEUED]
        if not retire and not queued:
            return out
        await self.replan(current, retire, queued, nodes, out)
        return out

    async def replan(self, records: list[JobRecord], retire: list[JobRecord], queued: list[JobRecord],
                     nodes: list[NodeRecord], out: LifecycleRound) -> None:
        """Drop the retired jobs from the current plan, place queued ones, push the touched nodes."""
        net = await self.nodes.network()
        now = self.clock_ms()
        try:
            summary = await self.plan.summary()
        except InputError as exc:
            log.error("jobs: leaving the plan alone, its retained summary does not verify: %s", exc)
            return
        kept, plan_ids = Plan(method="search", placements=[]), {}
        summary_nodes: dict[str, list[str]] = {}
        if summary is not None:
            kept, plan_ids, missing = plan_from_summary(summary, net)
            if missing:   # a node left the fleet: recovery re-plans first
                log.info("jobs: waiting for recovery to re-plan %s", ", ".join(missing))
                return
            summary_nodes = {j.name: j.node_ids for j in summary.jobs}
        gone = {r.name for r in retire}
        kept = Plan(method=kept.method, placements=[p for p in kept.placements if p.job.name not in gone])
        heard = {n.id: n.last_seen_ms for n in nodes if n.monitored}
        silent = down_nodes({n: heard.get(n) for n in net.ids}, now, self.options.node_timeout_s)
        # Off the event loop: a plan takes up to the portfolio's budget.
        placing = await asyncio.to_thread(place_queued, kept, net, [r.job for r in queued], silent,
                                          search=self.planner, seed=self.options.seed)
        if not retire and not placing.placed:
            return
        plan_id = new_plan_id(now)
        job_plan_ids = {p.job.name: plan_ids[p.job.name] for p in kept.placements}
        fleet = self.options.fleet
        placements = build_node_placements(placing.plan, net, fleet=fleet, plan_id=plan_id,
                                           addresses={n.id: n.address for n in nodes if n.address},
                                           job_plan_ids=job_plan_ids,
                                           restart_counts={r.name: r.restarts
                                                           for r in [*records, *queued]})
        # A retired job's node that still holds another job's (later phase) role keeps its
        # retained placement: re-sending fewer roles would restart the process running there.
        retired_nodes = {n for r in retire for n in summary_nodes.get(r.name, ())}
        new_nodes = {n for nodes in placing.placed.values() for n in nodes}
        sent = {n: placements[n] for n in new_nodes}
        clear = sorted(n for n in retired_nodes if n not in placements)
        if placing.plan.placements:
            summary_doc = build_summary(placing.plan, net, fleet=fleet, plan_id=plan_id,
                                        issued_at_ms=now, node_placements=placements,
                                        job_plan_ids=job_plan_ids)
            count = await self.plan.replace(sent, summary_doc, issued_at_ms=now, clear=clear)
            self.events.plan_pushed("jobs", count, plan_makespan_s(placing.plan, net))
        else:   # nothing runs any more: clear the nodes and the summary
            await self.plan.replace({}, None, issued_at_ms=now, clear=clear)
        for record in retire:
            await self.jobs.update_job(record.id, retired=True)
            out.retired.append(record.name)
        by_name = {r.name: r for r in queued}
        for name, nodes in placing.placed.items():
            await self.jobs.update_job(by_name[name].id, state=PLACED, plan_id=plan_id,
                                       nodes=nodes, estimate_s=placing.estimates.get(name),
                                       stages=placing.stages.get(name), detail="")
            self.events.job_moved(PLACED)
        out.placed, out.plan_id = placing.placed, plan_id
        log.info("jobs: plan %s: placed %s, retired %s, cleared %d node(s); waiting: %s", plan_id,
                 placing.placed or "nothing", out.retired or "nothing", len(clear),
                 placing.waiting or "none")


def add_to_runtime(runtime: Any, replanner: Replanner, *, interval_s: float,
                   planner: Planner | None = None) -> JobLifecycle:
    """Run the job lifecycle as serve's background task ``jobs``, every ``interval_s``, with the
    Replanner's current plan, nodes, job records, options and lock."""
    lifecycle = JobLifecycle(replanner.plan, replanner.nodes, replanner.jobs,
                             options=replanner.options, planner=planner, lock=replanner.lock,
                             events=getattr(runtime, "events", NO_EVENTS))
    runtime.add_task(BackgroundTask("jobs", lifecycle.run_once, interval_s, in_store_thread=False))
    log.info("jobs: starting queued jobs and retiring finished ones every %.1f s", interval_s)
    return lifecycle
