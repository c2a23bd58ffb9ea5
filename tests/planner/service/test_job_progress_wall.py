"""The store keeps each rank's wall-clock figure (wall seconds a step over the run, outer syncs
included) beside its medians; a job's is its ranks' largest; a store of an older planner gains
the two columns when opened, keeping its rows, which read 0 (not reported)."""

from __future__ import annotations

import sqlite3

import pytest

from hulk.wire.progress import StepProgress
from hulk.wire.records import HeartbeatRequest, LaunchState, LaunchStatus, RegisterRequest
from planner.core.lifecycle import PLACED, RUNNING
from planner.service.database import SCHEMA_VERSION
from planner.service.ingest import IngestService
from planner.service.store import Store
from tests.helpers.clock import ManualClock

T0 = 1_790_000_000_000
SPEC = {"model": "gpt2-xl", "steps": 1000, "command": ["python", "train.py"]}


def running(median_s: float, wall_s: float = 0.0, wall_steps: int = 0) -> LaunchStatus:
    return LaunchStatus(LaunchState.RUNNING, plan_id="p1", job="gpt", changed_at_ms=T0,
                        progress=StepProgress(steps=120, total_steps=1000, iteration_s=median_s,
                                              iteration_p90_s=median_s, samples=50,
                                              updated_ms=T0, wall_iteration_s=wall_s,
                                              wall_steps=wall_steps))


def placed_store(path, new: bool = True) -> tuple[Store, IngestService]:
    clock = ManualClock(T0)
    store = Store(path, clock=clock)
    service = IngestService(store, clock=clock)
    for node in ("n0", "n1", "n2"):
        service.register(RegisterRequest(node, hostname=node, address="127.0.0.1"))
    if new:
        record = store.submit_job("gpt", SPEC)
        store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n0", "n1", "n2"],
                         estimate_s=250.0)
        store.update_job(record.id, state=RUNNING)
    return store, service


def test_the_jobs_wall_figure_is_its_slowest_ranks(tmp_path):
    store, ingest = placed_store(tmp_path / "planner.sqlite")
    with store:
        for node, median, wall, steps in (("n0", 0.30, 0.41, 100), ("n1", 0.32, 0.45, 90),
                                          ("n2", 0.35, 0.0, 0)):     # n2: an older agent
            ingest.heartbeat(HeartbeatRequest(node, time_ms=T0, launch=running(median, wall,
                                                                               steps)))
        (it,) = store.job_iterations()
        assert (it.measured_iteration_s, it.samples) == (0.35, 50)   # the slowest median
        assert (it.wall_iteration_s, it.wall_steps) == (0.45, 90)    # the slowest wall clock
        ranks = store.rank_progress(store.job_by_name("gpt").id, "p1")
        assert [(r.node_id, r.progress.wall_iteration_s, r.progress.wall_steps)
                for r in ranks] == [("n0", 0.41, 100), ("n1", 0.45, 90), ("n2", 0.0, 0)]


def test_a_job_no_rank_timed_by_the_wall_clock_reads_zero(tmp_path):
    store, ingest = placed_store(tmp_path / "planner.sqlite")
    with store:
        ingest.heartbeat(HeartbeatRequest("n0", time_ms=T0, launch=running(0.3)))
        (it,) = store.job_iterations()
        assert (it.wall_iteration_s, it.wall_steps) == (0.0, 0)


def test_a_store_from_before_the_wall_figure_gains_its_columns_and_keeps_its_rows(tmp_path):
    path = tmp_path / "old.sqlite"
    store, ingest = placed_store(path)
    with store:
        ingest.heartbeat(HeartbeatRequest("n0", time_ms=T0, launch=running(0.3, 0.5, 80)))
    conn = sqlite3.connect(path)       # as an older planner of the same schema version left it
    conn.execute("ALTER TABLE job_progress DROP COLUMN wall_iteration_s")
    conn.execute("ALTER TABLE job_progress DROP COLUMN wall_steps")
    conn.commit()
    assert "wall_steps" not in {r[1] for r in conn.execute("PRAGMA table_info(job_progress)")}
    conn.close()
    store, ingest = placed_store(path, new=False)
    with store:
        assert store.database.meta("schema_version") == str(SCHEMA_VERSION)
        (it,) = store.job_iterations()
        assert (it.measured_iteration_s, it.samples) == (0.3, 50)    # the row survived
        assert (it.wall_iteration_s, it.wall_steps) == (0.0, 0)      # not reported then
        ingest.heartbeat(HeartbeatRequest("n1", time_ms=T0, launch=running(0.2, 0.6, 70)))
        (it,) = store.job_iterations()
        assert (it.measured_iteration_s, it.wall_iteration_s, it.wall_steps) == (0.3, 0.6, 70)
    with Store(path, read_only=True) as reader:      # a migrated store reads without a gap
        assert reader.database.behind is None
        assert reader.job_iterations()[0].wall_iteration_s == pytest.approx(0.6)
