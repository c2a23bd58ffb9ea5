"""Measured step times of jobs: each rank's progress as its heartbeat carried it (the
``job_progress`` table), one part of ``planner.service.store.Store``.

A heartbeat whose launch status carries ``StepProgress`` for a job the store knows replaces that
rank's row (one per job and node) in the heartbeat's transaction. A job's measured iteration
time is the slowest of its current placement's ranks (a pipeline steps at its slowest stage's
pace): the maximum over those ranks of their median step time; beside it the largest of their
wall-clock seconds a step over the whole run (outer syncs included, which a DiLoCo job's median
inner step leaves out). The estimate beside it is the
one the plan stored for the placement (``jobs.estimate_s``, the job's estimated seconds) over the
job's steps: the cost model's ``job_s`` is ``steps * iteration_s``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hulk.wire.progress import StepProgress
from planner.core.lifecycle import JobRecord

if TYPE_CHECKING:   # the jobs command imports this module: no sqlite layer or protobuf at start
    from hulk.wire.records import LaunchStatus
    from planner.service.database import Database

_COLUMNS = ("p.plan_id, p.rank, p.steps, p.total_steps, p.iteration_s, p.iteration_p90_s, "
            "p.compute_s, p.communication_s, p.samples, p.updated_ms, p.received_ms, "
            "p.wall_iteration_s, p.wall_steps")


@dataclass(frozen=True)
class RankProgress:
    """One rank's last reported progress."""

    node_id: str
    rank: int | None           # its position in the job's nodes (stage-major: the plan's rank)
    plan_id: str
    progress: StepProgress
    received_ms: int           # planner time of the heartbeat that carried it


@dataclass(frozen=True)
class JobIteration:
    """A placed job's measured iteration time against the plan's estimate."""

    job_name: str
    plan_id: str
    spec: Mapping[str, Any]                # the job's spec (jobs.spec_json)
    nodes: list[str]
    measured_iteration_s: float            # max over the job's ranks of their median
    samples: int                           # steps behind the slowest rank's median
    estimated_iteration_s: float | None    # None: the plan stored no estimate
    stages: Mapping[str, Any] | None = None   # the placement's stages (placements.stages_doc)
    # The largest wall seconds a step over the run among the ranks (outer syncs included; 0:
    # none reported it) and the steps behind it: the job goes at its slowest rank's pace.
    wall_iteration_s: float = 0.0
    wall_steps: int = 0


def estimated_iteration_s(record: JobRecord) -> float | None:
    """The plan's estimated seconds a step for ``record`` (None when it stored no estimate)."""
    steps = record.spec.get("steps")
    if record.estimate_s is None or not isinstance(steps, int) or steps <= 0:
        return None
    return record.estimate_s / steps


def measured(ranks: Sequence[RankProgress]) -> tuple[float, int] | None:
    """(the slowest rank's median step time, the steps behind it) over the ranks that measured
    any step; None when none has."""
    timed = [r.progress for r in ranks if r.progress.samples > 0]
    if not timed:
        return None
    slowest = max(timed, key=lambda p: p.iteration_s)
    return slowest.iteration_s, slowest.samples


def measured_wall(ranks: Sequence[RankProgress]) -> tuple[float, int]:
    """(the largest wall seconds a step over the run among the ranks, the steps behind it);
    (0, 0) when none reported one."""
    slowest = max((r.progress for r in ranks), key=lambda p: p.wall_iteration_s, default=None)
    if slowest is None or not slowest.wall_iteration_s > 0:
        return 0.0, 0
    return slowest.wall_iteration_s, slowest.wall_steps


def store_progress(conn: sqlite3.Connection, node_idx: int, node_id: str,
                   launch: LaunchStatus | None, received_ms: int) -> bool:
    """Keep ``launch.progress`` as this node's row of its job (inside the heartbeat's
    transaction); False when there is nothing to keep (no progress, no job of that name).
    InputError for figures that cannot be true: nothing is stored."""
    if launch is None or launch.progress is None or not launch.job:
        return False
    progress = launch.progress.check("launch.progress")
    row = conn.execute("SELECT id, nodes_json FROM jobs WHERE name = ? ORDER BY id DESC LIMIT 1",
                       (launch.job,)).fetchone()
    if row is None:
        return False
    nodes = json.loads(row[1] or "[]")
    rank = nodes.index(node_id) if node_id in nodes else None
    conn.execute(
        "INSERT OR REPLACE INTO job_progress (job_id, node_idx, plan_id, rank, steps, "
        "total_steps, iteration_s, iteration_p90_s, compute_s, communication_s, samples, "
        "updated_ms, received_ms, wall_iteration_s, wall_steps) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (row[0], node_idx, launch.plan_id, rank, progress.steps, progress.total_steps,
         progress.iteration_s, progress.iteration_p90_s, progress.compute_s,
         progress.communication_s, progress.samples, progress.updated_ms, received_ms,
         progress.wall_iteration_s, progress.wall_steps))
    return True


def _rank(node_id: str, row: tuple) -> RankProgress:
    (plan_id, rank, steps, total, it, p90, compute, comm, samples, updated, received,
     wall, wall_steps) = row
    return RankProgress(node_id, rank, plan_id,
                        StepProgress(steps, total, it, p90, compute, comm, samples, updated,
                                     wall, wall_steps),
                        received)


class JobProgress:
    """Reads of ``job_progress`` over ``database``; times from ``clock`` (ms)."""

    def __init__(self, database: Database, clock: Callable[[], int],
                 job_records: Callable[[], list[JobRecord]]):
        self.database = database
        self.clock = clock
        self._job_records = job_records

    def rank_progress(self, job_id: int, plan_id: str | None = None) -> list[RankProgress]:
        """The job's ranks' progress, by rank; only its placement ``plan_id``'s when given."""
        where, args = ("AND p.plan_id = ?", (job_id, plan_id)) if plan_id else ("", (job_id,))
        with self.database.reading("read job progress") as conn:
            rows = conn.execute(f"SELECT n.id, {_COLUMNS} FROM job_progress p JOIN nodes n ON "
                                f"n.idx = p.node_idx WHERE p.job_id = ? {where} "
                                "ORDER BY p.rank, n.id", args).fetchall()
        return [_rank(r[0], r[1:]) for r in rows]

    def job_iterations(self) -> list[JobIteration]:
        """Every job whose current placement measured a step, oldest first."""
        with self.database.reading("read job progress") as conn:
            rows = conn.execute(f"SELECT p.job_id, n.id, {_COLUMNS} FROM job_progress p "
                                "JOIN nodes n ON n.idx = p.node_idx").fetchall()
        by_job: dict[int, list[RankProgress]] = {}
        for job_id, node_id, *rest in rows:
            by_job.setdefault(job_id, []).append(_rank(node_id, tuple(rest)))
        out = []
        for record in self._job_records():
            ranks = [r for r in by_job.get(record.id, ()) if r.plan_id == record.plan_id]
            figures = measured(ranks)
            if figures is None or not record.plan_id:
                continue
            out.append(JobIteration(record.name, record.plan_id, dict(record.spec),
                                    list(record.nodes), figures[0], figures[1],
                                    estimated_iteration_s(record), record.stages,
                                    *measured_wall(ranks)))
        return out
