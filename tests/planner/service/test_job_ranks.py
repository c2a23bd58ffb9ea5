"""job_ranks: every rank's last launch report is kept with its job, across heartbeats and after
the node goes idle, and `jobs logs` prints it once the job has ended."""

from __future__ import annotations

import sqlite3

import pytest

from hulk.wire.records import ExitCause, LaunchState, LaunchStatus, RegisterRequest
from planner.cli import main
from planner.core.lifecycle import FAILED, FENCED, PLACED, RUNNING
from planner.service.job_ranks import RankReport, rank_reports, record_rank
from planner.service.store import Store
from tests.helpers.clock import ManualClock

T0 = 1_790_000_000_000
SPEC = {"model": "gpt2-xl", "steps": 1000, "command": ["python", "train.py"]}
CRASH = ("exit code 1\nfirst error (lines 11-11 of 44):\n"
         "ValueError: --dim (65) must be a multiple of --heads (4)\nlast lines:\n  ...\n"
         "full log: /var/lib/hulk/jobs/gpt/job.log")


def launch(state: LaunchState, job: str = "gpt", plan_id: str = "p1", code: int = 0,
           detail: str = "") -> LaunchStatus:
    return LaunchStatus(state, plan_id=plan_id, job=job, exit_code=code, detail=detail,
                        changed_at_ms=T0)


@pytest.fixture
def clock():
    return ManualClock(T0)


@pytest.fixture
def store(tmp_path, clock):
    with Store(tmp_path / "planner.sqlite", clock=clock) as store:
        for node in ("n0", "n1"):
            store.register(RegisterRequest(node, hostname=node, address="127.0.0.1"))
        record = store.submit_job("gpt", SPEC)
        store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n0", "n1"])
        store.update_job(record.id, state=RUNNING)
        yield store


def test_reports_are_kept_across_heartbeats_and_after_the_node_goes_idle(store, clock):
    job = store.job_by_name("gpt")
    store.heartbeat("n0", launch=launch(LaunchState.RUNNING, detail="step 10"))
    store.heartbeat("n1", launch=launch(LaunchState.RUNNING))
    clock.now += 5000
    store.heartbeat("n0", launch=launch(LaunchState.EXITED, code=1, detail=CRASH))
    store.update_job(job.id, state=FAILED, detail="n0: exit code 1")
    clock.now += 5000
    store.heartbeat("n0", launch=LaunchStatus(LaunchState.IDLE, detail="no placement"))
    reports = rank_reports(store, job.id)
    assert [r.node_id for r in reports] == ["n0", "n1"]
    assert reports[0] == RankReport("n0", "p1", "exited", 1, CRASH, T0 + 5000)
    assert reports[1].state == "running" and reports[1].changed_ms == T0
    assert store.node_records()[0].launch.state == "idle"    # the node itself forgot it


def test_only_placed_jobs_take_reports(store):
    assert not record_rank(store.conn, "n0", None, T0)
    assert not record_rank(store.conn, "n0", launch(LaunchState.RUNNING, job="other"), T0)
    assert not record_rank(store.conn, "n0", launch(LaunchState.RUNNING, job=""), T0)
    queued = store.submit_job("fresh", SPEC)              # never placed: no plan id
    assert not record_rank(store.conn, "n0", launch(LaunchState.RUNNING, job="fresh"), T0)
    assert rank_reports(store.conn, queued.id) == []


def test_a_reused_name_keeps_each_run_its_own_reports(store):
    old = store.job_by_name("gpt")
    store.update_job(old.id, state=FAILED, retired=True)
    new = store.submit_job("gpt", SPEC)
    store.update_job(new.id, state=PLACED, plan_id="p2", nodes=["n1"])
    store.heartbeat("n0", launch=launch(LaunchState.EXITED, plan_id="p1", code=1, detail=CRASH))
    store.heartbeat("n1", launch=launch(LaunchState.RUNNING, plan_id="p2"))
    assert [(r.node_id, r.plan_id) for r in rank_reports(store, old.id)] == [("n0", "p1")]
    assert [(r.node_id, r.plan_id) for r in rank_reports(store, new.id)] == [("n1", "p2")]


def logs(capsys, db, *extra) -> tuple[int, str]:
    code = main(["jobs", "logs", "gpt", "--db", str(db), *extra])
    return code, capsys.readouterr().out


def test_jobs_logs_of_an_ended_job_prints_the_kept_detail(store, capsys):
    job = store.job_by_name("gpt")
    store.heartbeat("n0", launch=launch(LaunchState.EXITED, code=1, detail=CRASH))
    store.heartbeat("n1", launch=launch(LaunchState.RUNNING, detail="step 12"))
    store.update_job(job.id, state=FAILED, detail="n0: exit code 1", retired=True)
    store.heartbeat("n0", launch=LaunchStatus(LaunchState.IDLE, detail="no placement"))
    store.heartbeat("n1", launch=LaunchStatus(LaunchState.IDLE, detail="no placement"))
    code, out = logs(capsys, store.path)
    assert code == 0 and "job gpt (failed)" in out
    assert "== n0 (rank 0): exited, exit code 1" in out
    for line in CRASH.splitlines():
        assert f"   {line}" in out
    assert "== n1 (rank 1): last reported running (the job has ended since)" in out
    assert "exit code 0" not in out and "no report" not in out


def test_running_ranks_never_say_exit_code_0(store, capsys):
    store.heartbeat("n0", launch=launch(LaunchState.RUNNING, detail="step 3\n\x1b]0;title\x07"))
    store.heartbeat("n1", launch=launch(LaunchState.STARTING))
    code, out = logs(capsys, store.path)
    assert code == 0 and "exit code" not in out
    assert "== n0 (rank 0): running (heard" in out and "== n1 (rank 1): starting (heard" in out
    assert "\x1b" not in out and "\x07" not in out and "?]0;title?" in out
    store.heartbeat("n0", launch=launch(LaunchState.EXITED, code=0, detail="exited 0"))
    code, out = logs(capsys, store.path, "--node", "n0")
    assert "== n0 (rank 0): exited 0 (heard" in out and "n1" not in out


FENCE = ("fenced: the node's lease lapsed 0.3 s ago: SIGTERM to the job\nexit code 143\n"
         "full log: /var/lib/hulk/jobs/gpt/job.log")


def test_a_fenced_rank_is_kept_as_fenced_on_its_node_and_with_its_job(store, capsys):
    job = store.job_by_name("gpt")
    store.heartbeat("n0", launch=LaunchStatus(LaunchState.EXITED, plan_id="p1", job="gpt",
                                              exit_code=143, detail=FENCE, changed_at_ms=T0,
                                              exit_cause=ExitCause.FENCED))
    store.heartbeat("n1", launch=launch(LaunchState.EXITED, code=1, detail=CRASH))
    node = {n.id: n for n in store.node_records()}
    assert node["n0"].launch.exit_cause == FENCED and node["n0"].launch.fenced
    assert node["n1"].launch.exit_cause == "" and not node["n1"].launch.fenced
    kept = {r.node_id: r for r in rank_reports(store, job.id)}
    assert kept["n0"].exit_cause == FENCED and kept["n1"].exit_cause == ""
    code, out = logs(capsys, store.path)
    assert code == 0
    assert "== n0 (rank 0): fenced (the node's lease lapsed), exit code 143" in out
    assert "== n1 (rank 1): exited, exit code 1" in out
    # A state other than exited keeps no cause, whatever the report said.
    store.heartbeat("n0", launch=LaunchStatus(LaunchState.STARTING, plan_id="p1", job="gpt",
                                              exit_cause=ExitCause.FENCED))
    assert {n.id: n for n in store.node_records()}["n0"].launch.exit_cause == ""


def test_a_store_from_before_fencing_gains_the_columns_and_reads_no_fence(tmp_path):
    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        store.register(RegisterRequest("n0", hostname="n0", address="127.0.0.1"))
        record = store.submit_job("gpt", SPEC)
        store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n0"])
        store.update_job(record.id, state=PLACED, restart=True, failure=True)
        store.heartbeat("n0", launch=launch(LaunchState.EXITED, code=1, detail=CRASH))
    conn = sqlite3.connect(path)                          # the columns an older planner lacks
    for table, column in (("jobs", "fences"), ("nodes", "launch_exit_cause"),
                          ("job_ranks", "exit_cause")):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.commit()
    conn.close()
    with Store(path) as store:
        job = store.job_by_name("gpt")
        assert (job.restarts, job.failures, job.fences) == (1, 1, 0)
        assert store.node_records()[0].launch.exit_cause == ""
        assert [r.exit_cause for r in rank_reports(store, job.id)] == [""]
        store.update_job(job.id, restart=True, fenced=True)
        assert store.job_by_name("gpt").fences == 1
