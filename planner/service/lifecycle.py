"""The job lifecycle in `serve --mqtt`: thin I/O around planner/core/lifecycle.py.

Each round (a ``BackgroundTask``) reads the unretired job records and the nodes' launch states
from the store, moves placed and running jobs on (running, succeeded, failed), then, when a job
is to be retired or queued jobs wait, reads the retained plan summary (verified), keeps the
placements of every other job, plans the queued jobs on the nodes no active job uses, and pushes
signed placements to the nodes it touched only (a finished or cancelled job's nodes are cleared,
so its processes stop; nodes of jobs that keep running are sent nothing). The summary is
replaced with one naming every active job, so recovery re-plans them when a node goes silent.

It shares the Replanner's lock and publisher, so the two never push over each other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hulk.errors import HulkError, InputError
from hulk.wire.broker import plan_topic
from hulk.wire.placement import parse_summary
from hulk.wire.signing import Signer
from planner.core.fleet import Network
from planner.core.lifecycle import (PLACED, QUEUED, RUNNING, JobRecord, RankState, next_state,
                                    place_queued, to_retire)
from planner.core.placements import build_node_placements, build_summary, plan_from_summary
from planner.core.plan import Plan
from planner.core.recovery import SearchFn, down_nodes
from planner.search import plan_search
from planner.service.metrics import NO_EVENTS, ServeEvents, plan_makespan_s
from planner.service.publisher import Publisher, new_plan_id, plan_messages, push_plan
from planner.service.runtime import BackgroundTask

log = logging.getLogger(__name__)

StoreCall = Callable[..., Awaitable[Any]]     # runs a Store method on the store's thread


def rank_states(rows: list[Mapping[str, Any]]) -> dict[str, RankState]:
    """node id -> its last launch status, from the store's node rows."""
    return {r["id"]: RankState(state=r["launch_state"], job=r.get("launch_job") or "",
                               plan_id=r.get("launch_plan_id") or "",
                               exit_code=r.get("launch_exit_code") or 0,
                               detail=r.get("launch_detail") or "")
            for r in rows if r.get("launch_state")}


@dataclass
class LifecycleRound:
    moved: dict[str, str] = field(default_factory=dict)      # job -> its new state
    retired: list[str] = field(default_factory=list)
    placed: dict[str, list[str]] = field(default_factory=dict)
    plan_id: str | None = None


class JobLifecycle:
    """One round per call of :meth:`run_once`. ``in_store(method_name, *args)`` runs a Store
    method on the store's thread; ``network()`` is the live Network."""

    def __init__(self, publisher: Publisher, *, fleet: str, signer: Signer, in_store: StoreCall,
                 network: Callable[[], Awaitable[Network]], timeout_s: float = 30.0,
                 search: SearchFn = plan_search, seed: int = 0, lock: asyncio.Lock | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 read_wait_s: float = 0.3, events: ServeEvents = NO_EVENTS):
        self.publisher, self.fleet, self.signer = publisher, fleet, signer
        self.verifier = signer.verifier()
        self.in_store, self.network = in_store, network
        self.timeout_s, self.search, self.seed = timeout_s, search, seed
        self.lock = lock or asyncio.Lock()
        self.clock_ms, self.read_wait_s = clock_ms, read_wait_s
        self.events = events   # metrics: state changes, pushes, failed rounds

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
        records = await self.in_store("job_records", unretired_only=True)
        rows = await self.in_store("nodes")
        ranks = rank_states(rows)
        current: list[JobRecord] = []
        for record in records:
            state, detail = next_state(record, ranks)
            if state != record.state:
                await self.in_store("update_job", record.id, state=state, detail=detail)
                log.info("job %s: %s -> %s %s", record.name, record.state, state, detail)
                out.moved[record.name] = state
                self.events.job_moved(state)
                record = await self.in_store("job_record", record.id)
            current.append(record)
        retire = to_retire(current)
        queued = [r for r in current if r.state == QUEUED]
        if not retire and not queued:
            return out
        await self.replan(current, retire, queued, rows, out)
        return out

    async def replan(self, records: list[JobRecord], retire: list[JobRecord], queued: list[JobRecord],
                     rows: list[Mapping[str, Any]], out: LifecycleRound) -> None:
        """Drop the retired jobs from the retained plan, place queued ones, push the touched nodes."""
        net = await self.network()
        now = self.clock_ms()
        raw = await self.publisher.read_retained(plan_topic(self.fleet), self.read_wait_s)
        kept, plan_ids = Plan(method="search", placements=[]), {}
        summary_nodes: dict[str, list[str]] = {}
        if raw:
            try:
                summary = parse_summary(raw, source=plan_topic(self.fleet), verifier=self.verifier)
            except InputError as exc:
                log.error("jobs: leaving the plan alone, its retained summary does not verify: %s", exc)
                return
            kept, plan_ids, missing = plan_from_summary(summary, net)
            if missing:   # a node left the fleet: recovery re-plans first
                log.info("jobs: waiting for recovery to re-plan %s", ", ".join(missing))
                return
            summary_nodes = {j.name: j.node_ids for j in summary.jobs}
        gone = {r.name for r in retire}
        kept = Plan(method=kept.method, placements=[p for p in kept.placements if p.job.name not in gone])
        heard = {r["id"]: r.get("last_seen_ms") for r in rows if r.get("source") != "import"}
        silent = down_nodes({n: heard.get(n) for n in net.ids}, now, self.timeout_s)
        placing = place_queued(kept, net, [r.job for r in queued], silent, search=self.search,
                               seed=self.seed)
        if not retire and not placing.placed:
            return
        plan_id = new_plan_id(now)
        job_plan_ids = {p.job.name: plan_ids[p.job.name] for p in kept.placements}
        placements = build_node_placements(placing.plan, net, fleet=self.fleet, plan_id=plan_id,
                                           addresses=self._addresses(rows), job_plan_ids=job_plan_ids,
                                           restart_counts={r.name: r.restarts
                                                           for r in [*records, *queued]})
        # A retired job's node that still holds another job's (later phase) role keeps its
        # retained placement: re-sending fewer roles would restart the process running there.
        retired_nodes = {n for r in retire for n in (*r.nodes, *summary_nodes.get(r.name, ()))}
        new_nodes = {n for nodes in placing.placed.values() for n in nodes}
        sent = {n: placements[n] for n in new_nodes}
        clear = sorted(n for n in retired_nodes if n not in placements)
        if placing.plan.placements:
            summary_doc = build_summary(placing.plan, net, fleet=self.fleet, plan_id=plan_id,
                                        issued_at_ms=now, node_placements=placements,
                                        job_plan_ids=job_plan_ids)
            count, _ = await push_plan(self.publisher, self.fleet, sent, summary_doc,
                                       signer=self.signer, issued_at_ms=now, clear=clear)
            self.events.plan_pushed("jobs", count, plan_makespan_s(placing.plan, net))
        else:   # nothing runs any more: clear the nodes and the summary
            await self.publisher.publish_retained(
                {**plan_messages(self.fleet, {}, None, clear=clear), plan_topic(self.fleet): b""})
        for record in retire:
            await self.in_store("update_job", record.id, retired=True)
            out.retired.append(record.name)
        by_name = {r.name: r for r in queued}
        for name, nodes in placing.placed.items():
            await self.in_store("update_job", by_name[name].id, state=PLACED, plan_id=plan_id,
                                nodes=nodes, estimate_s=placing.estimates.get(name), detail="")
            self.events.job_moved(PLACED)
        out.placed, out.plan_id = placing.placed, plan_id
        log.info("jobs: plan %s: placed %s, retired %s, cleared %d node(s); waiting: %s", plan_id,
                 placing.placed or "nothing", out.retired or "nothing", len(clear),
                 placing.waiting or "none")

    @staticmethod
    def _addresses(rows: list[Mapping[str, Any]]) -> dict[str, str]:
        return {r["id"]: r["address"] for r in rows if r.get("address")}


def store_caller(runtime: Any) -> StoreCall:
    """``in_store(method_name, *args)`` for a serve runtime: the Store method on its thread."""
    async def call(name: str, *args: Any, **kwargs: Any) -> Any:
        return await runtime.in_store(getattr(runtime.store, name), *args, **kwargs)
    return call


def recovery_hooks(runtime: Any) -> dict[str, Callable[..., Awaitable[Any]]]:
    """The Replanner's job-record hooks: which jobs are finished (never re-planned) and what to
    record when it re-plans (a restart, the new plan id and nodes) or loses a job (queued again)."""
    call = store_caller(runtime)

    async def finished() -> set[str]:
        return {r.name for r in await call("job_records", unretired_only=True)
                if r.state not in (QUEUED, PLACED, RUNNING)}

    async def replanned(plan_id: str, nodes: Mapping[str, list[str]], lost: list[str]) -> None:
        live = {r.name: r for r in await call("job_records", unretired_only=True)
                if r.state in (PLACED, RUNNING)}
        for name, job_nodes in nodes.items():
            if name in live:
                await call("update_job", live[name].id, state=PLACED, plan_id=plan_id, nodes=job_nodes,
                           restart=True, detail="re-planned after a node went silent")
        for name in lost:
            if name in live:
                await call("update_job", live[name].id, state=QUEUED, nodes=[], restart=True,
                           detail="lost its nodes; waiting for free ones")

    async def restart_counts() -> dict[str, int]:
        return {r.name: r.restarts for r in await call("job_records", unretired_only=True)}

    return {"finished_jobs": finished, "on_replanned": replanned, "restart_counts": restart_counts}


def add_to_runtime(runtime: Any, replanner: Any, *, interval_s: float, search: SearchFn) -> JobLifecycle:
    """Run the job lifecycle as serve's background task ``jobs``, every ``interval_s``, with the
    Replanner's publisher, signer, network, node timeout and lock."""
    lifecycle = JobLifecycle(replanner.publisher, fleet=runtime.fleet, signer=replanner.signer,
                             in_store=store_caller(runtime), network=replanner.network,
                             timeout_s=replanner.timeout_s, search=search, seed=replanner.seed,
                             lock=replanner.lock, events=getattr(runtime, "events", NO_EVENTS))
    runtime.add_task(BackgroundTask("jobs", lifecycle.run_once, interval_s, in_store_thread=False))
    log.info("jobs: starting queued jobs and retiring finished ones every %.1f s", interval_s)
    return lifecycle
