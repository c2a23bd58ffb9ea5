"""Job records in the store: submit, read back, move, events, restarts, name reuse."""

from __future__ import annotations

import pytest

from hulk.errors import InputError, NotFoundError
from planner.core.lifecycle import CANCELLED, PLACED, QUEUED, RUNNING, SUCCEEDED
from planner.service.store import Store

SPEC = {"model": None, "params": 1e8, "layers": 4, "hidden": 256, "seq_len": 128,
        "global_batch": 8, "micro_batch": 1, "steps": 10, "command": ["python", "train.py"]}


@pytest.fixture
def store(tmp_path):
    ticks = iter(range(1000, 10**6, 1000))
    with Store(tmp_path / "s.sqlite", clock=lambda: next(ticks)) as s:
        yield s


def test_a_job_round_trips_through_the_file_with_every_change(store, tmp_path):
    record = store.submit_job("a", SPEC)
    assert (record.state, record.submitted_ms, record.restarts) == (QUEUED, 1000, 0)
    store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n1", "n2"], estimate_s=12.5)
    store.update_job(record.id, state=RUNNING)
    store.update_job(record.id, state=PLACED, plan_id="p2", nodes=["n3"], restart=True)
    store.update_job(record.id, state=RUNNING)
    store.update_job(record.id, state=SUCCEEDED, detail="every rank exited 0")
    with Store(tmp_path / "s.sqlite") as again:
        back = again.job_by_name("a")
    assert back.spec == SPEC and back.job.command == ("python", "train.py")
    assert (back.state, back.plan_id, back.nodes, back.restarts) == (SUCCEEDED, "p2", ("n3",), 1)
    assert back.started_ms == 3000 and back.finished_ms is not None and back.estimate_s == 12.5
    assert [e[0] for e in back.events] == [QUEUED, PLACED, RUNNING, PLACED, RUNNING, SUCCEEDED]
    assert back.active     # finished but its nodes not cleared yet
    store.update_job(record.id, retired=True)
    assert not store.job_by_name("a").active
    assert store.job_records(unretired_only=True) == []


def test_an_active_name_is_refused_and_a_retired_one_may_run_again(store):
    first = store.submit_job("a", SPEC)
    with pytest.raises(InputError, match="already queued"):
        store.submit_job("a", SPEC)
    store.update_job(first.id, state=CANCELLED)
    second = store.submit_job("a", SPEC)
    assert second.id != first.id and store.job_by_name("a").id == second.id
    assert [r.name for r in store.job_records()] == ["a", "a"]


def test_unknown_jobs_and_states_are_errors(store):
    with pytest.raises(NotFoundError):
        store.job_by_name("nope")
    with pytest.raises(NotFoundError):
        store.update_job(99, state=RUNNING)
    record = store.submit_job("a", SPEC)
    with pytest.raises(ValueError):
        store.update_job(record.id, state="sleeping")


def test_a_pushed_plan_becomes_placed_records_and_replaces_the_live_ones(store):
    from planner.service.job_records import record_pushed_plan

    old = store.submit_job("old", SPEC)
    store.update_job(old.id, state=PLACED, plan_id="p0", nodes=["n9"])
    done = store.submit_job("a", SPEC)
    store.update_job(done.id, state=PLACED, plan_id="p0", nodes=["n8"])
    store.update_job(done.id, state=SUCCEEDED)
    record_pushed_plan(store, {"a": (SPEC, ["n1"]), "b": (SPEC, ["n2", "n3"])}, "p1")
    assert store.job_by_name("old").state == CANCELLED and not store.job_by_name("old").active
    a, b = store.job_by_name("a"), store.job_by_name("b")
    assert a.id != done.id and (a.state, a.plan_id, a.nodes) == (PLACED, "p1", ("n1",))
    assert (b.state, b.nodes) == (PLACED, ("n2", "n3"))
    assert not store.job_record(done.id).active      # the finished run is retired, never revived
    record_pushed_plan(store, {"a": (SPEC, ["n4"])}, "p2")   # a live job pushed again: same record
    assert store.job_by_name("a").id == a.id and store.job_by_name("a").nodes == ("n4",)
    assert store.job_by_name("b").state == CANCELLED


def test_started_is_when_the_ranks_began_kept_between_the_placement_and_now(tmp_path):
    now = [1000]
    with Store(tmp_path / "t.sqlite", clock=lambda: now[0]) as store:
        started = {}
        for name, reported in (("ranks", 5000), ("skewed-back", 500), ("skewed-ahead", 20_000),
                               ("unknown", None)):
            now[0] = 1000
            record = store.submit_job(name, SPEC)
            now[0] = 2000
            store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n1"])
            now[0] = 9000                  # the round that sees every rank running
            store.update_job(record.id, state=RUNNING, started_ms=reported)
            started[name] = store.job_by_name(name).started_ms
    assert started == {"ranks": 5000, "skewed-back": 2000, "skewed-ahead": 9000, "unknown": 9000}
