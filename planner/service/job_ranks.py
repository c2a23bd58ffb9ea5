"""Each job rank's last launch report, kept with the job (the ``job_ranks`` table).

A node's launch columns (``nodes.launch_*``) hold only what it reports now: once its job ends and
its placement is cleared, the node reports idle and the job's last words are gone. So every
heartbeat whose launch names a job also replaces that job's row for the node here (in the
heartbeat's transaction), and ``jobs logs`` reads ended ranks from it: the exit code, its cause
('fenced' when the node's lease lapsed, else '') and the detail as the agent sent it (the lines
around the first error, the last lines, the full log's path on the node).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # the jobs command imports this module: no protobuf at start
    from hulk.wire.records import LaunchStatus

JOB_RANKS = """CREATE TABLE job_ranks (
    job_id INTEGER NOT NULL, node_id TEXT NOT NULL, plan_id TEXT NOT NULL, state TEXT NOT NULL,
    exit_code INTEGER NOT NULL, detail TEXT NOT NULL, changed_ms INTEGER NOT NULL,
    exit_cause TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (job_id, node_id)) WITHOUT ROWID"""


@dataclass(frozen=True)
class RankReport:
    """One rank's last report for a job."""

    node_id: str
    plan_id: str
    state: str            # starting, running, exited, failed, idle
    exit_code: int
    detail: str
    changed_ms: int       # planner time of the heartbeat that last carried it
    exit_cause: str = ""  # exited only: 'fenced' when its wrapper stopped it, else ''


def _job_id(conn: sqlite3.Connection, name: str, plan_id: str) -> int | None:
    """The job a report names: the one placed under its plan id, else the name's unretired
    job, else its latest; None when that job was never placed (a queued job of a reused name
    must not take an old run's report)."""
    row = conn.execute("SELECT id FROM jobs WHERE name = ? AND plan_id = ? "
                       "ORDER BY id DESC LIMIT 1", (name, plan_id)).fetchone()
    if row is None:
        row = conn.execute("SELECT id FROM jobs WHERE name = ? AND plan_id IS NOT NULL "
                           "ORDER BY retired_ms IS NULL DESC, id DESC LIMIT 1",
                           (name,)).fetchone()
    return row[0] if row else None


def exit_cause_name(launch: LaunchStatus) -> str:
    """How the store keeps a launch report's exit cause: '' (its own exit, or a state other than
    exited) or the cause's name in lower case ('fenced': planner.core.lifecycle.FENCED)."""
    if launch.state.name != "EXITED" or not launch.exit_cause:
        return ""
    return launch.exit_cause.name.lower()


def record_rank(conn: sqlite3.Connection, node_id: str, launch: LaunchStatus | None,
                now_ms: int) -> bool:
    """Keep ``launch`` as ``node_id``'s row of the job it names (inside the caller's
    transaction); False when it names no job the store placed."""
    if launch is None or not launch.job or not launch.plan_id or not launch.state:
        return False
    job_id = _job_id(conn, launch.job, launch.plan_id)
    if job_id is None:
        return False
    conn.execute("INSERT OR REPLACE INTO job_ranks (job_id, node_id, plan_id, state, exit_code, "
                 "detail, changed_ms, exit_cause) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (job_id, node_id, launch.plan_id, launch.state.name.lower(), launch.exit_code,
                  launch.detail, now_ms, exit_cause_name(launch)))
    return True


def rank_reports(source: Any, job_id: int) -> list[RankReport]:
    """The job's kept rank reports by node; ``source`` is a connection, a Database or a Store."""
    sql = ("SELECT node_id, plan_id, state, exit_code, detail, changed_ms, exit_cause "
           "FROM job_ranks WHERE job_id = ? ORDER BY node_id")
    if isinstance(source, sqlite3.Connection):
        return [RankReport(*r) for r in source.execute(sql, (job_id,)).fetchall()]
    database = getattr(source, "database", source)
    with database.reading("read job ranks") as conn:
        return [RankReport(*r) for r in conn.execute(sql, (job_id,)).fetchall()]
