"""A job's life as pure decisions: queued -> placed -> running -> succeeded / failed, or cancelled.

Values in, decisions out (the serve task, planner/service/lifecycle.py, reads the store and the
broker, pushes and writes):

- :class:`JobRecord`: one submitted job as the store keeps it (its spec as jobs.yaml gave it).
- :func:`next_state`: where a placed or running job goes, from its ranks' launch states.
- :func:`to_retire`: finished or cancelled jobs whose nodes still hold their placement.
- :func:`place_queued`: queued jobs planned on the nodes no active job uses (phase 0 only: a job
  that would have to wait for another stays queued until nodes free up).

A succeeded job is final: nothing here ever moves it back to queued, so it never runs again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.core.costmodel import estimate
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.placements import job_from_spec, stages_doc
from planner.core.plan import Plan
from planner.core.recovery import replan_jobs

if TYPE_CHECKING:
    from planner.methods import Planner

QUEUED, PLACED, RUNNING = "queued", "placed", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
STATES = (QUEUED, PLACED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
LIVE = frozenset({QUEUED, PLACED, RUNNING})          # may still run
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})    # never runs again


@dataclass(frozen=True)
class JobRecord:
    """One submitted job: its state, when each state began, where it runs, how often it restarted."""

    id: int
    name: str
    state: str
    spec: Mapping[str, Any]                 # planner.core.placements.job_spec of the Job
    submitted_ms: int
    changed_ms: int
    plan_id: str | None = None
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    started_ms: int | None = None           # first seen running
    finished_ms: int | None = None
    retired_ms: int | None = None           # its nodes' placements cleared
    estimate_s: float | None = None
    detail: str = ""
    events: tuple[tuple[str, int, str], ...] = field(default=())   # (state, at ms, detail)
    # Its placement's stages (planner.core.placements.stages_doc); None when the record
    # predates kept stages or its placement came without them.
    stages: Mapping[str, Any] | None = None

    @property
    def job(self) -> Job:
        return job_from_spec(self.name, self.spec)

    @property
    def active(self) -> bool:
        """Still holds its name: live, or finished but its placements not yet cleared."""
        return self.state in LIVE or (self.retired_ms is None and bool(self.nodes))


@dataclass(frozen=True)
class RankState:
    """What a node last reported about its launched process (the store's launch_* columns)."""

    state: str              # idle, starting, running, exited, failed
    job: str = ""
    plan_id: str = ""
    exit_code: int = 0
    detail: str = ""


def next_state(record: JobRecord, ranks: Mapping[str, RankState | None]) -> tuple[str, str]:
    """(state, detail) of a placed or running job from its nodes' launch states.

    Only reports for this job and its plan id count. Any rank failed (refused, could not start)
    -> failed; a rank exited non-zero -> failed once no other rank is still reported running or
    starting (a dead node's last report stays "running": its peers' exits must leave the job to
    recovery, which re-plans it after the node timeout); every rank exited 0 -> succeeded; every
    rank running (or already done with 0) and at least one running -> running; otherwise unchanged.
    """
    if record.state not in (PLACED, RUNNING) or not record.nodes:
        return record.state, record.detail
    mine = {n: r for n in record.nodes
            if (r := ranks.get(n)) is not None and r.job == record.name and r.plan_id == record.plan_id}
    live = any(r.state in ("running", "starting") for r in mine.values())
    for node, rank in sorted(mine.items()):
        if rank.state == "failed" or (rank.state == "exited" and rank.exit_code != 0 and not live):
            why = rank.detail or f"exit code {rank.exit_code}"
            return FAILED, f"{node}: {why}"[:500]
    if len(mine) < len(record.nodes):
        return record.state, record.detail
    states = {r.state for r in mine.values()}
    if states == {"exited"}:
        return SUCCEEDED, "every rank exited 0"
    if states <= {"running", "exited"} and "running" in states:
        return RUNNING, ""
    return record.state, record.detail


def to_retire(records: Iterable[JobRecord]) -> list[JobRecord]:
    """Finished or cancelled jobs whose nodes' placements are still to be cleared."""
    return [r for r in records if r.state in FINAL and r.retired_ms is None]


@dataclass
class Placing:
    plan: Plan                       # kept placements + the newly placed (full network indices)
    placed: dict[str, list[str]]     # job name -> its node ids
    estimates: dict[str, float]      # job name -> estimated seconds
    waiting: list[str]               # queued jobs that stay queued
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)   # job name -> stages_doc


def place_queued(kept: Plan, net: Network, queued: list[Job], unavailable: Iterable[str], *,
                 search: Planner, seed: int = 0) -> Placing:
    """Plan ``queued`` jobs on the nodes of ``net`` that are neither ``unavailable`` (silent) nor
    used by ``kept``'s placements; placements that would wait for another job (phase > 0) are
    dropped, so those jobs wait in the queue instead."""
    if not queued:
        return Placing(kept, {}, {}, [])
    result = replan_jobs(kept, net, queued, unavailable, search=search, seed=seed)
    names = {j.name for j in queued}
    new = [p for p in result.plan.placements if p.job.name in names and p.phase == 0]
    old = [p for p in result.plan.placements if p.job.name not in names]
    plan = Plan(method=kept.method, placements=old + new, unplaced=list(kept.unplaced),
                notes=list(kept.notes))
    placed = {p.job.name: [net.ids[i] for i in p.nodes] for p in new}
    estimates = {p.job.name: estimate(p, net).job_s for p in new}
    return Placing(plan, placed, estimates, sorted(names - set(placed)),
                   {p.job.name: stages_doc(p, net) for p in new})
