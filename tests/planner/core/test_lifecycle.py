"""The job lifecycle's pure decisions: states from ranks' launch reports, retiring, placing."""

from __future__ import annotations

from planner.core.fleet import Fleet, Link, Node, complete
from planner.core.lifecycle import (CANCELLED, FAILED, PLACED, QUEUED, RUNNING, SUCCEEDED, JobRecord,
                                    RankState, next_state, place_queued, to_retire)
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.core.placements import job_spec
from planner.methods import planner_for

SPEC = job_spec(Job(name="a", params=1e8, layers=4, hidden=256, seq_len=128, global_batch=8, steps=10))


def record(state=PLACED, nodes=("n1", "n2"), plan_id="p1", **kw) -> JobRecord:
    return JobRecord(id=1, name="a", state=state, spec=SPEC, submitted_ms=0, changed_ms=0,
                     plan_id=plan_id, nodes=tuple(nodes), **kw)


def rank(state, job="a", plan_id="p1", code=0, detail=""):
    return RankState(state=state, job=job, plan_id=plan_id, exit_code=code, detail=detail)


def test_all_ranks_running_moves_a_placed_job_to_running():
    assert next_state(record(), {"n1": rank("running"), "n2": rank("running")})[0] == RUNNING


def test_one_rank_still_starting_keeps_it_placed():
    assert next_state(record(), {"n1": rank("running"), "n2": rank("starting")})[0] == PLACED


def test_reports_of_another_plan_or_job_do_not_count():
    ranks = {"n1": rank("running", plan_id="old"), "n2": rank("running", job="b")}
    assert next_state(record(), ranks)[0] == PLACED
    assert next_state(record(), {"n1": rank("exited", plan_id="old", code=1)})[0] == PLACED


def test_every_rank_exited_zero_is_success_even_before_running_was_seen():
    state, _ = next_state(record(), {"n1": rank("exited"), "n2": rank("exited")})
    assert state == SUCCEEDED


def test_any_rank_failed_or_nonzero_fails_the_job_with_its_detail():
    state, detail = next_state(record(RUNNING), {"n1": rank("exited", code=1),
                                                 "n2": rank("exited", code=3, detail="boom")})
    assert (state, detail) == (FAILED, "n1: exit code 1")
    assert next_state(record(RUNNING), {"n1": rank("exited"), "n2": rank("exited", code=3,
                                                                         detail="boom")}) == (FAILED, "n2: boom")
    assert next_state(record(), {"n1": rank("failed", detail="refused: x")})[0] == FAILED
    assert next_state(record(RUNNING), {"n1": rank("running"),
                                        "n2": rank("failed", detail="cannot start: x")})[0] == FAILED


def test_a_nonzero_exit_waits_while_another_rank_is_still_reported_running():
    # A node that died mid-run keeps its last report ("running"); its peers exit non-zero when
    # their connections to it break. The job is left to recovery (re-planned after the node
    # timeout) instead of failing at once (found in the lab: tests/lab/test_lab_jobs.py).
    ranks = {"n1": rank("running"), "n2": rank("exited", code=1)}
    assert next_state(record(RUNNING), ranks) == (RUNNING, "")
    assert next_state(record(), {"n1": rank("starting"), "n2": rank("exited", code=1)})[0] == PLACED
    ranks["n1"] = rank("exited", code=1)
    assert next_state(record(RUNNING), ranks)[0] == FAILED


def test_final_and_queued_jobs_never_move():
    done = {"n1": rank("running"), "n2": rank("running")}
    for state in (QUEUED, SUCCEEDED, FAILED, CANCELLED):
        assert next_state(record(state), done)[0] == state


def test_finished_unretired_jobs_are_retired_and_keep_their_name_until_then():
    jobs = [record(SUCCEEDED), record(CANCELLED, retired_ms=5), record(RUNNING), record(FAILED)]
    assert [r.state for r in to_retire(jobs)] == [SUCCEEDED, FAILED]
    assert record(SUCCEEDED).active and not record(SUCCEEDED, retired_ms=1).active
    assert record(QUEUED, nodes=()).active and not record(CANCELLED, nodes=()).active


def network(n):
    nodes = [Node(id=f"n{i}", city="Beijing", gpus=8, gpu_name="NVIDIA A100-SXM4-40GB",
                  compute_capability=8.0, memory_gb=320) for i in range(n)]
    links = [Link(src=a.id, dst=b.id, rtt_ms=2.0) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    return complete(Fleet(nodes=tuple(nodes), links=tuple(links)))


def test_queued_jobs_go_on_free_nodes_only_and_wait_when_none_are_free():
    net = network(3)
    job = Job(name="a", params=1e8, layers=4, hidden=256, seq_len=128, global_batch=8, steps=10)
    first = place_queued(Plan("search", []), net, [job], ["n2"], search=planner_for("search"))
    assert list(first.placed) == ["a"] and "n2" not in first.placed["a"]
    assert first.estimates["a"] > 0 and first.waiting == []
    used = set(first.placed["a"])
    other = Job(name="b", params=1e8, layers=4, hidden=256, seq_len=128, global_batch=8, steps=10)
    second = place_queued(first.plan, net, [other], ["n2"], search=planner_for("search"))
    assert not used & set(second.placed.get("b", []))
    assert {p.job.name for p in second.plan.placements} >= {"a"}
    if len(used) == 2:   # every live node busy: b waits in the queue
        assert second.waiting == ["b"] and second.placed == {}
