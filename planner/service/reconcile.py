"""Reconciliation in `serve --mqtt`: thin I/O around planner/core/reconcile.py.

Each round (a ``BackgroundTask``, under the lock recovery and the lifecycle share) reads the
verified plan summary (``CurrentPlan``), the nodes' last launch reports (``NodeDirectory``) and
the job records (``JobStore``), and re-sends (``CurrentPlan.resend``: a new sequence number and
fresh times) the placement of each node that has run the wrong thing for longer than the grace:

- a node the plan gives a job it does not report (lost): its retained placement when that one
  still gives it exactly what the summary does, else one rebuilt from the summary (a deleted or
  stale retained message is never trusted);
- a node the plan gives a job whose retained placement is gone (deleted, or lost by the broker),
  whatever it reports: one rebuilt from the summary, in the round that sees it (no grace;
  reason ``lost``), read in one broker connection per round;
- a node that runs a job the plan does not give it (unplanned): the same, or a signed clear when
  the plan gives it nothing, so its agent stops the process. When that job's record is final,
  the job gets the event "running on NODE after it ended; stopped" and a warning is logged.

Every re-send is counted in ``hulk_placements_resent_total{reason}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hulk.errors import HulkError, InputError
from hulk.wire.placement import NodePlacement, PlanSummary
from planner.core.lifecycle import FINAL, JobRecord
from planner.core.placements import build_node_placements, plan_from_summary
from planner.core.reconcile import (UNPLANNED, Resend, as_sent, deleted, expected_by_node,
                                    reconcile)
from planner.core.reconcile import grace_s as default_grace_s
from planner.core.recovery import down_nodes
from planner.service.metrics import NO_EVENTS, ServeEvents, plan_makespan_s
from planner.service.publisher import CLEARED_PLAN_ID, UntrustedSummary
from planner.service.recovery import now_ms
from planner.service.runtime import BackgroundTask
from planner.service.seams import CurrentPlan, JobStore, NodeDirectory, ServeOptions

if TYPE_CHECKING:
    from planner.service.node_rows import NodeRecord
    from planner.service.recovery import Replanner

log = logging.getLogger(__name__)


class Reconciler:
    """One round per :meth:`run_once`: nodes whose reports disagree with ``plan`` for longer
    than ``grace_s`` (default :func:`planner.core.reconcile.grace_s` of ``interval_s`` and the node
    timeout) are sent
    their placement again. A node is never called silent before a full node timeout after
    ``started_ms`` (as recovery)."""

    def __init__(self, plan: CurrentPlan, nodes: NodeDirectory, jobs: JobStore | None = None, *,
                 options: ServeOptions, interval_s: float = 2.0, grace_s: float | None = None,
                 lock: asyncio.Lock | None = None, clock_ms: Callable[[], int] = now_ms,
                 started_ms: int | None = None, events: ServeEvents = NO_EVENTS,
                 silence_base_ms: Callable[[], int | None] | None = None):
        self.plan, self.nodes, self.jobs = plan, nodes, jobs
        self.options = options
        self.grace_s = (default_grace_s(interval_s, options.node_timeout_s) if grace_s is None
                        else grace_s)
        self.lock = lock or asyncio.Lock()
        self.clock_ms = clock_ms
        self.started_ms = clock_ms() if started_ms is None else started_ms
        # From when nodes may be silent (Replanner.silence_base_ms; None: not while serve is
        # offline on the broker)
        self.silence_base_ms = silence_base_ms or (lambda: self.started_ms)
        self.events = events
        self.since: dict[str, Any] = {}          # the core's mismatch clocks, round to round
        self.last_sent: dict[str, int] = {}
        self.noted: set[tuple[str, str, str]] = set()   # (node, job, plan id) already an event
        self.makespan_known = False      # the retained plan's makespan exported since start

    async def run_once(self) -> list[Resend] | None:
        """For the serve runtime's periodic task: failures are logged and the loop goes on."""
        try:
            async with self.lock:
                return await self.round()
        except HulkError as exc:
            self.events.push_failed("reconcile")
            log.warning("reconcile round failed: %s", exc)
            return None

    async def round(self) -> list[Resend]:
        try:
            summary = await self.plan.summary()
        except UntrustedSummary:     # logged once where it was read
            return []
        except InputError as exc:
            log.error("reconcile: leaving every node alone, the retained summary does not "
                      "verify: %s", exc)
            return []
        if summary is not None and not self.makespan_known:
            await self._export_makespan(summary)
        nodes = [n for n in await self.nodes.nodes() if n.monitored]
        now = self.clock_ms()
        base = self.silence_base_ms()
        heard = {n.id: max(n.last_seen_ms or 0, now if base is None else base) for n in nodes}
        silent = down_nodes(heard, now, self.options.node_timeout_s)
        records = await self.jobs.unretired_jobs() if self.jobs is not None else []
        given = expected_by_node(summary.jobs) if summary is not None else {}
        final = {r.name for r in records if r.state in FINAL}
        decision = reconcile(given, {n.id: n.launch for n in nodes if n.launch is not None},
                             silent, now_ms=now, grace_ms=self.grace_s * 1000, since=self.since,
                             last_sent=self.last_sent, final_jobs=final)
        self.since = decision.since
        monitored = {n.id for n in nodes}
        absent = await self.plan.absent(sorted(monitored & set(given)))
        decision.resend.extend(deleted(given, absent, silent, final,
                                       already={a.node for a in decision.resend}))
        if not decision.resend:
            return []
        for action in decision.resend:      # tries count too: a node that cannot be sent to
            self.last_sent[action.node] = now    # is not tried (and logged) every round
        wanted = await self._placements(decision.resend, summary, given, nodes, records)
        sent = [a for a in decision.resend if a.node in wanted]
        if not sent:
            return []
        count = await self.plan.resend(wanted, issued_at_ms=now)
        for action in sent:
            self.events.placement_resent(action.reason)
            log.warning("reconcile: re-sent %s's placement (%s: it reports %s, the plan gives it "
                        "%s)", action.node, action.reason, _told(action),
                        ", ".join(sorted(j for j, _ in given.get(action.node, ()))) or "nothing")
        self.events.plan_pushed("reconcile", count)
        await self._note_ended(sent, records)
        return sent

    async def _export_makespan(self, summary: PlanSummary) -> None:
        """``hulk_plan_makespan_seconds`` of the plan retained when serve started, once: a
        restarted serve exports it before its first push."""
        self.makespan_known = True
        net = await self.nodes.network()
        try:
            plan, _, _ = plan_from_summary(summary, net)
        except HulkError as exc:     # a metric never fails a round
            log.debug("reconcile: no makespan for the retained plan: %s", exc)
            return
        self.events.plan_retained(plan_makespan_s(plan, net))

    async def _placements(self, actions: list[Resend], summary: PlanSummary | None,
                          given: Mapping[str, frozenset], nodes: list[NodeRecord],
                          records: list[JobRecord]) -> dict[str, NodePlacement]:
        """Node -> the placement to send it: its retained one when that gives it exactly what
        the summary does, else one rebuilt from the summary (or a clear)."""
        targets = [a.node for a in actions]
        retained = await self.plan.placements(targets)
        out: dict[str, NodePlacement] = {}
        rebuild: list[str] = []
        for node in targets:
            want = given.get(node, frozenset())
            current = retained.get(node)
            if current is not None and {(r.job, r.plan_id) for r in current.roles} == want:
                out[node] = current
            elif not want:
                out[node] = NodePlacement(fleet=self.options.fleet, node=node, plan_id=(
                    summary.plan_id if summary is not None else CLEARED_PLAN_ID))
            else:
                rebuild.append(node)
        if rebuild and summary is not None:
            built = await self._rebuilt(summary, rebuild, nodes, records, retained)
            for node in rebuild:
                if node in built:
                    out[node] = built[node]
                else:
                    log.warning("reconcile: cannot rebuild %s's placement: the plan's nodes are "
                                "not all in the fleet (recovery re-plans it)", node)
        return out

    async def _rebuilt(self, summary: PlanSummary, targets: list[str], nodes: list[NodeRecord],
                       records: list[JobRecord], retained: Mapping[str, NodePlacement]
                       ) -> dict[str, NodePlacement]:
        """The ``targets``' placements as the summary describes them, with the rendezvous and
        restart counts their jobs' other ranks hold (read from their retained placements)."""
        net = await self.nodes.network()
        plan, plan_ids, missing = plan_from_summary(summary, net)
        placements = build_node_placements(
            plan, net, fleet=self.options.fleet, plan_id=summary.plan_id,
            addresses={n.id: n.address for n in nodes if n.address}, job_plan_ids=plan_ids,
            restart_counts={r.name: r.restarts for r in records})
        jobs = [j for j in summary.jobs if j.name not in missing and set(targets) & set(j.node_ids)]
        peers = sorted({n for j in jobs for n in j.node_ids} - set(targets))
        held = [*retained.values(), *(await self.plan.placements(peers)).values()]
        return {node: as_sent(placements[node], [r for p in held for r in p.roles])
                for node in targets if node in placements
                and not any(j.name in missing for j in summary.jobs if node in j.node_ids)}

    async def _note_ended(self, sent: list[Resend], records: list[JobRecord]) -> None:
        """A job running after its record became final: a warning and an event on the job."""
        if self.jobs is None:
            return
        unretired = {r.name: r for r in records}
        for action in sent:
            key = (action.node, action.job, action.plan_id)
            if action.reason != UNPLANNED or key in self.noted:
                continue
            record = unretired.get(action.job) or await self.jobs.job_named(action.job)
            if record is None or record.state not in FINAL:
                continue
            self.noted.add(key)
            detail = f"running on {action.node} after it ended; stopped"
            log.warning("reconcile: job %s (%s) was %s", action.job, record.state, detail)
            await self.jobs.add_event(record.id, record.state, detail)


def _told(action: Resend) -> str:
    return f"{action.job} (plan {action.plan_id}) running" if action.reason == UNPLANNED else \
        "none of them"


def add_to_runtime(runtime: Any, replanner: Replanner, *, interval_s: float) -> Reconciler:
    """Run a Reconciler as serve's background task ``reconcile`` every ``interval_s`` (the
    lifecycle's), with the Replanner's current plan, nodes, job records, options and lock."""
    reconciler = Reconciler(replanner.plan, replanner.nodes, replanner.jobs,
                            options=replanner.options, interval_s=interval_s,
                            lock=replanner.lock, started_ms=replanner.started_ms,
                            events=getattr(runtime, "events", NO_EVENTS),
                            silence_base_ms=replanner.silence_base_ms)
    runtime.add_task(BackgroundTask("reconcile", reconciler.run_once, interval_s,
                                    in_store_thread=False))
    log.info("reconcile: nodes running other than the plan for %.0f s are sent their placement "
             "again (checking every %.1f s)", reconciler.grace_s, interval_s)
    return reconciler
