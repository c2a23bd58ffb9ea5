"""The job lifecycle in `serve --mqtt`: thin I/O around planner/core/lifecycle.py.

Each round (a ``BackgroundTask``) reads the unretired job records (``JobStore``) and the nodes'
launch states (``NodeDirectory``), moves placed and running jobs on (running, succeeded,
failed), restarts those whose own processes failed (within their budget, after a back-off: the
same nodes get the job's roles again under a new plan id, with the restart count one higher,
so every rank starts again from the latest checkpoint) and those of which a rank was fenced
(its node's lease lapsed: the same restart, counted in ``restarts`` and ``fences`` but never in
the ``failures`` the budget limits), then, when a job is to be retired or
queued jobs wait, reads the current plan
(``CurrentPlan``, verified), keeps the placements of every other job, plans the queued jobs on
the nodes no active job uses, and replaces the placements of the nodes it touched only (a
finished or cancelled job's nodes, as the current plan names them, are cleared, so its processes
stop; nodes of jobs that keep running are sent nothing). The summary is replaced with one naming
every active job, so recovery re-plans them when a node goes silent; the job records are then
updated to match (planner/service/seams.py: the current plan is the summary, records a view).

It shares the Replanner's lock, current plan and collaborators, so the two never push over each
other. One job's trouble stays that job's: a record whose spec is no Job, or that the planner
cannot carry, fails alone with its reason; a waiting job's detail says why it waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hulk.errors import HulkError, InputError
from planner.core.lifecycle import (CANCELLED, FAILED, FENCED_RESTART, GIVE_UP, PLACED, QUEUED,
                                    RESTART, RUNNING, JobRecord, give_up_wait, next_state,
                                    place_queued, restart_turn, restart_wait, running_since_ms,
                                    to_retire)
from planner.core.placements import build_node_placements, build_summary, plan_from_summary
from planner.core.plan import Plan
from planner.core.jobs import Job
from planner.core.recovery import down_nodes
from planner.service.metrics import NO_EVENTS, ServeEvents, plan_makespan_s
from planner.service.node_rows import NodeRecord
from planner.service.publisher import UntrustedSummary, new_plan_id
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
    restarted: list[str] = field(default_factory=list)


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
        # (job id, plan id) -> (when its failure was first seen, its cause, whether a rank was
        # fenced): the back-off's start
        self.failures: dict[tuple[int, str | None], tuple[int, str, bool]] = {}
        self._round_errors: set[str] = set()

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
        except Exception as exc:   # noqa: BLE001 - the loop goes on; a traceback once per kind
            self.events.push_failed("jobs")
            key = f"{type(exc).__name__}: {exc}"
            if key in self._round_errors:
                log.warning("job lifecycle round failed again: %s", key)
            else:
                self._round_errors.add(key)
                log.exception("job lifecycle round failed")
        return None

    async def round(self) -> LifecycleRound:
        out = LifecycleRound()
        records = await self.jobs.unretired_jobs()
        nodes = await self.nodes.nodes()
        now = self.clock_ms()
        ranks = {n.id: n.launch for n in nodes if n.launch is not None}
        heard = {n.id: n.last_seen_ms for n in nodes if n.monitored}
        silent = down_nodes(heard, now, self.options.node_timeout_s)
        current: list[JobRecord] = []
        due: list[tuple[JobRecord, str, bool]] = []
        pending = (RESTART, FENCED_RESTART, GIVE_UP)
        for record in records:
            state, detail = next_state(record, ranks, silent)
            if state in pending:
                fenced = state == FENCED_RESTART
                key = (record.id, record.plan_id)
                failed_at, cause, was_fenced = self.failures.setdefault(key, (now, detail, fenced))
                if fenced and not was_fenced:
                    # A peer's exit came first (its connection to the fenced rank broke); the
                    # fence is the cause, from when the failure was first seen.
                    cause = detail
                    self.failures[key] = (failed_at, cause, True)
                if state == GIVE_UP:   # fails once every node is heard from: a fence may follow
                    wait = give_up_wait(record, detail, failed_at_ms=failed_at, now_ms=now,
                                        last_seen_ms=heard)
                    if wait is None:
                        state = FAILED
                else:
                    wait = restart_wait(record, cause, failed_at_ms=failed_at, now_ms=now,
                                        last_seen_ms=heard, fenced=fenced)
                    if wait is None:
                        due.append((record, cause, fenced))
                if wait is not None and wait != record.detail:
                    await self.jobs.update_job(record.id, detail=wait)
            if state not in pending and state != record.state:
                started = running_since_ms(record, ranks) if state == RUNNING else None
                if started is None:
                    await self.jobs.update_job(record.id, state=state, detail=detail)
                else:
                    await self.jobs.update_job(record.id, state=state, detail=detail,
                                               started_ms=started)
                log.info("job %s: %s -> %s %s", record.name, record.state, state, detail)
                out.moved[record.name] = state
                self.events.job_moved(state)
                record = await self.jobs.job(record.id)
            current.append(record)
        live = {(r.id, r.plan_id) for r in current}
        self.failures = {k: v for k, v in self.failures.items() if k in live}
        if due:
            restarted = await self.restart(due, current, nodes, out)
            current = [restarted.get(r.id, r) for r in current]
        retire = to_retire(current)
        queued = [r for r in current if r.state == QUEUED]
        if not retire and not queued:
            return out
        await self.replan(current, retire, queued, nodes, out)
        return out

    async def restart(self, due: list[tuple[JobRecord, str, bool]], records: list[JobRecord],
                      nodes: list[NodeRecord], out: LifecycleRound) -> dict[int, JobRecord]:
        """Send each ``due`` (record, cause, fenced) job's roles again to its nodes in the current
        plan, under a new plan id and a restart count one higher (a job the plan no longer names
        is queued again); a fenced one spends no failure of its budget. Returns the updated
        records by id."""
        net = await self.nodes.network()
        now = self.clock_ms()
        try:
            summary = await self.plan.summary()
        except UntrustedSummary:     # logged once where it was read
            return {}
        except InputError as exc:
            log.error("jobs: not restarting %s, the retained summary does not verify: %s",
                      ", ".join(r.name for r, _, _ in due), exc)
            return {}
        plan, plan_ids, missing = (plan_from_summary(summary, net) if summary is not None
                                   else (Plan(method="search", placements=[]), {}, []))
        if missing:   # a node left the fleet: recovery re-plans first
            log.info("jobs: restarts wait for recovery to re-plan %s", ", ".join(missing))
            return {}
        names = {r.name for r, _, _ in due}
        plan_id = new_plan_id(now)
        counts = {r.name: r.restarts + (r.name in names) for r in records}
        placements = build_node_placements(
            plan, net, fleet=self.options.fleet, plan_id=plan_id,
            addresses={n.id: n.address for n in nodes if n.address},
            job_plan_ids={j: p for j, p in plan_ids.items() if j not in names},
            restart_counts=counts)
        in_plan = {p.job.name: [net.ids[i] for i in p.nodes] for p in plan.placements}
        sent = {n: placements[n] for name in names & set(in_plan) for n in in_plan[name]}
        if sent:
            summary_doc = build_summary(plan, net, fleet=self.options.fleet, plan_id=plan_id,
                                        issued_at_ms=now, node_placements=placements,
                                        job_plan_ids={j: p for j, p in plan_ids.items()
                                                      if j not in names})
            count = await self.plan.replace(sent, summary_doc, issued_at_ms=now)
            self.events.plan_pushed("jobs", count, plan_makespan_s(plan, net))
        updated: dict[int, JobRecord] = {}
        for record, cause, fenced in due:
            event = f"{restart_turn(record, fenced=fenced)}: {cause}"
            if record.name in in_plan:
                await self.jobs.update_job(record.id, state=PLACED, plan_id=plan_id,
                                           restart=True, failure=not fenced, fenced=fenced,
                                           detail=event)
            else:
                await self.jobs.update_job(record.id, state=QUEUED, nodes=[], restart=True,
                                           failure=not fenced, fenced=fenced,
                                           detail=f"{event} (no longer in the plan: queued again)")
            self.events.job_moved(PLACED if record.name in in_plan else QUEUED)
            log.warning("job %s: %s", record.name, event)
            out.restarted.append(record.name)
            updated[record.id] = await self.jobs.job(record.id)
        return updated

    async def replan(self, records: list[JobRecord], retire: list[JobRecord], queued: list[JobRecord],
                     nodes: list[NodeRecord], out: LifecycleRound) -> None:
        """Drop the retired jobs from the current plan, place queued ones, push the touched nodes."""
        net = await self.nodes.network()
        now = self.clock_ms()
        try:
            summary = await self.plan.summary()
        except UntrustedSummary:     # logged once where it was read
            return
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
        jobs, queued = await self._jobs_of(queued, out)
        # Off the event loop: a plan takes up to the portfolio's budget.
        placing = await asyncio.to_thread(place_queued, kept, net, jobs, silent,
                                          search=self.planner, seed=self.options.seed,
                                          node_timeout_s=self.options.node_timeout_s)
        await self._fail_or_explain(queued, placing.failed, placing.why, out)
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
            if record.state == CANCELLED:   # cancelled elsewhere (`jobs cancel`): counted once, here
                self.events.job_moved(CANCELLED)
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

    async def _jobs_of(self, queued: list[JobRecord], out: LifecycleRound
                       ) -> tuple[list[Job], list[JobRecord]]:
        """The queued records' jobs; a record whose spec is no Job (a record from an older
        version, edited by hand) fails here with its reason, alone."""
        jobs, kept = [], []
        for record in queued:
            try:
                jobs.append(record.job)
            except Exception as exc:   # noqa: BLE001 - whatever the spec holds
                await self._fail(record, f"cannot be planned: its spec is not a job: {exc}", out)
            else:
                kept.append(record)
        return jobs, kept

    async def _fail_or_explain(self, queued: list[JobRecord], failed: dict[str, str],
                               why: dict[str, str], out: LifecycleRound) -> None:
        """Fail the queued jobs that can never be planned; tell the waiting ones why they wait."""
        for record in queued:
            if record.name in failed:
                await self._fail(record, failed[record.name], out)
            elif record.name in why and why[record.name] != record.detail:
                await self.jobs.update_job(record.id, detail=why[record.name])

    async def _fail(self, record: JobRecord, reason: str, out: LifecycleRound) -> None:
        reason = " ".join(reason.split())[:500]
        # A queued job holds no node: nothing to clear, so it is retired at once.
        await self.jobs.update_job(record.id, state=FAILED, detail=reason,
                                   retired=not record.nodes)
        log.warning("job %s: %s -> failed: %s", record.name, record.state, reason)
        out.moved[record.name] = FAILED
        self.events.job_moved(FAILED)


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
