"""The store's job records: submit, read, move between states (the ``jobs`` and ``job_events``
tables of planner.service.database), one part of ``planner.service.store.Store``.

Every state change is one transaction that updates the job's row and appends an event, so
``jobs show`` can print when each change happened.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hulk.errors import InputError, NotFoundError
from planner.core.lifecycle import FINAL, LIVE, QUEUED, RUNNING, STATES, JobRecord
from planner.service.database import Database

if TYPE_CHECKING:
    from planner.service.store import Store

_COLUMNS = ("id, name, state, spec_json, submitted_ms, changed_ms, plan_id, nodes_json, restarts, "
            "started_ms, finished_ms, retired_ms, estimate_s, detail, stages_json, failures, fences")


def _record(row: tuple, events: tuple = ()) -> JobRecord:
    (id_, name, state, spec, submitted, changed, plan_id, nodes, restarts, started, finished,
     retired, estimate_s, detail, stages, failures, fences) = row
    return JobRecord(id=id_, name=name, state=state, spec=json.loads(spec), submitted_ms=submitted,
                     changed_ms=changed, plan_id=plan_id, nodes=tuple(json.loads(nodes or "[]")),
                     restarts=restarts, started_ms=started, finished_ms=finished,
                     retired_ms=retired, estimate_s=estimate_s, detail=detail or "", events=events,
                     stages=json.loads(stages) if stages else None, failures=failures or 0,
                     fences=fences or 0)


class JobRecords:
    """Job records over ``database``; times from ``clock`` (ms)."""

    def __init__(self, database: Database, clock: Callable[[], int]):
        self.database = database
        self.clock = clock

    def submit_job(self, name: str, spec: Mapping[str, Any]) -> JobRecord:
        """Store a job as queued; InputError when a job of that name is still active."""
        return self.submit_jobs([(name, spec)])[0]

    def submit_jobs(self, jobs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[JobRecord]:
        """Store jobs (name, spec) as queued in one transaction: all of them or, on any error
        (a name still active, a full disk), none; InputError when a name is still active."""
        t = self.clock()
        ids = []
        with self.database.transaction("submit jobs") as conn:
            for name, spec in jobs:
                for row in conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE name = ?", (name,)):
                    if _record(row).active:
                        raise InputError(f"a job named {name!r} is already {row[2]}; cancel it "
                                         "or pick another name", field="name")
                cur = conn.execute("INSERT INTO jobs (name, state, spec_json, submitted_ms, "
                                   "changed_ms) VALUES (?, ?, ?, ?, ?)",
                                   (name, QUEUED, json.dumps(dict(spec)), t, t))
                conn.execute("INSERT INTO job_events (job_id, at_ms, state, detail) VALUES "
                             "(?, ?, ?, ?)", (cur.lastrowid, t, QUEUED, "submitted"))
                ids.append(cur.lastrowid)
        return [self.job_record(job_id) for job_id in ids]

    def job_record(self, job_id: int) -> JobRecord:
        with self.database.reading("read job") as conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no job with id {job_id}")
            events = tuple(conn.execute(
                "SELECT state, at_ms, detail FROM job_events WHERE job_id = ? ORDER BY rowid",
                (job_id,)).fetchall())
        return _record(row, events)

    def add_event(self, job_id: int, state: str, detail: str) -> None:
        """Append an event to a job's history without changing the job (something seen about
        it, such as a process that ran after it ended)."""
        with self.database.transaction("add job event") as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                raise NotFoundError(f"no job with id {job_id}")
            conn.execute("INSERT INTO job_events (job_id, at_ms, state, detail) VALUES (?, ?, ?, ?)",
                         (job_id, self.clock(), state, detail))

    def job_by_name(self, name: str) -> JobRecord:
        """The latest job of that name; NotFoundError when there is none."""
        with self.database.reading("read job") as conn:
            row = conn.execute("SELECT id FROM jobs WHERE name = ? ORDER BY id DESC LIMIT 1",
                                    (name,)).fetchone()
        if row is None:
            raise NotFoundError(f"no job named {name!r}")
        return self.job_record(row[0])

    def job_records(self, *, unretired_only: bool = False) -> list[JobRecord]:
        """Every job (oldest first); ``unretired_only``: those the lifecycle still acts on."""
        where = " WHERE retired_ms IS NULL" if unretired_only else ""
        with self.database.reading("read jobs") as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM jobs{where} ORDER BY id").fetchall()
        return [_record(r) for r in rows]

    def update_job(self, job_id: int, *, state: str | None = None, detail: str | None = None,
                   plan_id: str | None = None, nodes: Iterable[str] | None = None,
                   estimate_s: float | None = None, restart: bool = False,
                   retired: bool = False, stages: Mapping[str, Any] | None = None,
                   failure: bool = False, fenced: bool = False,
                   started_ms: int | None = None) -> None:
        """Change a job's row; a new state (or a restart) is also appended as an event. New
        ``nodes`` replace the kept ``stages`` too (none when not given: they belonged to the old
        nodes). ``failure``: the restart follows a failure of the job's own ranks (it counts in
        ``failures``, the budget ``max_restarts`` limits, as well as in ``restarts``);
        ``fenced``: it follows a rank fenced when its node's lease lapsed (it counts in
        ``fences`` and ``restarts``, never in ``failures``). Every restart counts in
        ``restarts``: the epoch its placement carries (HULK_RESTART_COUNT). ``started_ms``: when it
        started running, as its ranks report it (kept within its placement and now; default
        now)."""
        if failure and fenced:
            raise ValueError("a restart follows a failure or a fence, not both")
        if state is not None and state not in STATES:
            raise ValueError(f"unknown job state {state!r}")
        t = self.clock()
        with self.database.transaction("update job") as conn:
            row = conn.execute("SELECT state, changed_ms FROM jobs WHERE id = ?",
                               (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no job with id {job_id}")
            sets: dict[str, Any] = {}
            if plan_id is not None:
                sets["plan_id"] = plan_id
            if nodes is not None:
                sets["nodes_json"] = json.dumps(list(nodes))
                sets["stages_json"] = None if stages is None else json.dumps(dict(stages))
            if estimate_s is not None:
                sets["estimate_s"] = estimate_s
            if detail is not None:
                sets["detail"] = detail
            if retired:
                sets["retired_ms"] = t
            changed = state is not None and state != row[0]
            if changed:
                sets.update(state=state, changed_ms=t)
                if state == RUNNING:
                    # The ranks' own start, not this round's: a heartbeat later otherwise.
                    started = t if started_ms is None else min(t, max(started_ms, row[1] or 0))
                    conn.execute("UPDATE jobs SET started_ms = ? WHERE id = ? AND started_ms IS NULL",
                                 (started, job_id))
                if state in FINAL:
                    sets["finished_ms"] = t
                elif state in LIVE:
                    sets["finished_ms"] = None
            if restart:
                conn.execute("UPDATE jobs SET restarts = restarts + 1, failures = failures + ?, "
                             "fences = fences + ? WHERE id = ?",
                             (int(failure), int(fenced), job_id))
            if sets:
                assign = ", ".join(f"{k} = ?" for k in sets)
                conn.execute(f"UPDATE jobs SET {assign} WHERE id = ?", (*sets.values(), job_id))
            if changed or restart:
                event = state if changed else row[0]
                why = detail or ("restarted on other nodes" if restart else "")
                conn.execute("INSERT INTO job_events (job_id, at_ms, state, detail) VALUES (?, ?, ?, ?)",
                             (job_id, t, event, why))


def record_pushed_plan(store: JobRecords | Store, placed: Mapping[str, tuple[Any, ...]],
                       plan_id: str) -> None:
    """What ``plan --push`` did, as job records: each pushed job ``placed`` (name -> (spec, node
    ids[, stages])) with the new plan id; every other live job lost its placement to the push
    (it clears every node), so it is cancelled and retired."""
    for record in store.job_records(unretired_only=True):
        if record.name not in placed and record.state in LIVE:
            store.update_job(record.id, state="cancelled", detail=f"replaced by plan --push {plan_id}",
                             retired=True)
        elif record.name not in placed and record.nodes:
            store.update_job(record.id, retired=True)     # its placement was cleared by the push
    for name, (spec, nodes, *stages) in placed.items():
        try:
            record = store.job_by_name(name)
        except NotFoundError:
            record = None
        if record is not None and record.state in FINAL:   # a finished job of that name: a new run
            if record.retired_ms is None:
                store.update_job(record.id, retired=True)
            record = None
        if record is None:
            record = store.submit_job(name, spec)
        store.update_job(record.id, state="placed", plan_id=plan_id, nodes=nodes,
                         stages=stages[0] if stages else None, detail="pushed by plan --push")
