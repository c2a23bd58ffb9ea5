"""Reconciliation's pure decisions (planner/core/reconcile.py): which nodes are sent their
placement again, and when."""

from __future__ import annotations

import random

from hulk.wire.placement import NodePlacement, Role, SummaryJob
from planner.core.lifecycle import RankState
from planner.core.reconcile import (LOST, RESEND_GAP_MS, UNPLANNED, Resend, as_sent,
                                    expected_by_node, grace_s, mismatch, reconcile)

GRACE_MS = 10_000
GIVEN = {"n1": frozenset({("a", "P1")}), "n2": frozenset({("a", "P1"), ("b", "P2")})}


def decide(reports, *, now=100_000, since=None, last_sent=None, silent=(), final=(), given=GIVEN):
    return reconcile(given, reports, silent, now_ms=now, grace_ms=GRACE_MS, since=since or {},
                     last_sent=last_sent or {}, final_jobs=final)


def test_the_summary_gives_each_node_its_jobs_and_plan_ids():
    jobs = [SummaryJob("a", "P1", 0, 1, ((0, 4, ("n1", "n2")),)),
            SummaryJob("b", "P2", 1, 1, ((0, 2, ("n2",)), (2, 4, ("n3",))))]
    assert expected_by_node(jobs) == {"n1": frozenset({("a", "P1")}),
                                      "n2": frozenset({("a", "P1"), ("b", "P2")}),
                                      "n3": frozenset({("b", "P2")})}


def test_grace_is_three_rounds_at_least_the_node_timeout_and_ten_seconds():
    assert grace_s(0.5) == 10.0 and grace_s(2.0) == 10.0 and grace_s(5.0) == 15.0
    assert grace_s(2.0, 30.0) == 30.0 and grace_s(0.5, 5.0) == 10.0


def test_a_lost_node_is_sent_its_placement_once_the_grace_has_passed():
    idle = {"n1": RankState("idle")}
    first = decide(idle, now=100_000)
    assert first.resend == [] and first.since == {"n1": ((LOST, "a", "P1"), 100_000)}
    assert decide(idle, now=100_000 + GRACE_MS - 1, since=first.since).resend == []
    late = decide(idle, now=100_000 + GRACE_MS, since=first.since)
    assert late.resend == [Resend("n1", LOST, "a", "P1")]
    assert late.since == first.since           # the clock keeps running until it matches


def test_another_plan_id_or_an_exited_old_run_is_lost_too():
    since = {"n1": ((LOST, "a", "P1"), 0)}
    for report in (RankState("exited", "a", "P0"), RankState("failed", "z", "P9"),
                   RankState("exited", "b", "P2")):
        assert decide({"n1": report}, since=since).resend == [Resend("n1", LOST, "a", "P1")]


def test_a_node_is_sent_at_most_once_per_gap():
    since = {"n1": ((LOST, "a", "P1"), 0)}
    idle = {"n1": RankState("idle")}
    now = 100_000
    soon = now - RESEND_GAP_MS + 1
    assert decide(idle, now=now, since=since, last_sent={"n1": soon}).resend == []
    assert decide(idle, now=now, since=since, last_sent={"n1": now - RESEND_GAP_MS}).resend == \
        [Resend("n1", LOST, "a", "P1")]
    # Other nodes are not held back by one node's re-send.
    both = decide({**idle, "n2": RankState("idle")}, now=now,
                  since={**since, "n2": ((LOST, "a", "P1"), 0)}, last_sent={"n1": now - 1})
    assert [r.node for r in both.resend] == ["n2"]


def test_a_node_running_a_job_the_plan_does_not_give_it_is_unplanned():
    running = {"n9": RankState("running", "old", "P0"), "n1": RankState("starting", "c", "P3")}
    first = decide(running)
    assert first.resend == []
    late = decide(running, now=100_000 + GRACE_MS, since=first.since)
    assert late.resend == [Resend("n1", UNPLANNED, "c", "P3"), Resend("n9", UNPLANNED, "old", "P0")]
    # Even when the job is final (it ran after it ended): it must be stopped.
    assert decide(running, now=100_000 + GRACE_MS, since=first.since, final={"old"}).resend == \
        late.resend


def test_a_node_given_only_finished_jobs_is_never_restarted():
    since = {"n1": ((LOST, "a", "P1"), 0)}
    assert decide({"n1": RankState("idle")}, since=since, final={"a"}).resend == []
    assert mismatch(GIVEN["n2"], RankState("idle"), final_jobs={"a"}) == (LOST, "b", "P2")


def test_silent_nodes_are_left_to_recovery():
    since = {"n1": ((LOST, "a", "P1"), 0), "n9": ((UNPLANNED, "x", "P"), 0)}
    got = decide({"n1": RankState("idle"), "n9": RankState("running", "x", "P")}, since=since,
                 silent={"n1", "n9"})
    assert got.resend == [] and got.since == {}


def test_a_changed_mismatch_starts_its_clock_again():
    since = {"n1": ((UNPLANNED, "x", "P"), 0)}
    got = decide({"n1": RankState("running", "y", "P")}, since=since)
    assert got.resend == [] and got.since == {"n1": ((UNPLANNED, "y", "P"), 100_000)}


def test_a_node_that_reports_a_job_it_is_given_is_never_touched():
    rng = random.Random(27)
    states = ("idle", "starting", "running", "exited", "failed")
    jobs = [("a", "P1"), ("a", "P0"), ("b", "P2"), ("c", "P3"), ("", "")]
    for _ in range(500):
        given = {f"n{i}": frozenset(rng.sample(jobs[:4], rng.randint(0, 2))) for i in range(6)}
        reports = {n: RankState(rng.choice(states), *rng.choice(jobs)) for n in given}
        silent = {n for n in given if rng.random() < 0.2}
        since = {n: ((rng.choice((LOST, UNPLANNED)), "a", "P1"), 0) for n in given}
        got = reconcile(given, reports, silent, now_ms=10**9, grace_ms=GRACE_MS,
                        since=since, last_sent={})
        sent = {r.node for r in got.resend}
        for node, report in reports.items():
            right = (report.job, report.plan_id) in given[node]
            if right or node in silent:
                assert node not in sent and node not in got.since, (node, report, given[node])
            elif report.state in ("running", "starting") or given[node]:
                assert node in got.since         # a mismatch: its clock runs
        for r in got.resend:                     # the first round of a mismatch sends nothing
            assert got.since[r.node][1] < 10**9


def test_a_rebuilt_placement_takes_the_rendezvous_its_jobs_other_ranks_were_sent():
    def role(job, plan_id, port, restart=0):
        return Role(plan_id=plan_id, job=job, phase=0, stage=0, num_stages=1, layer_lo=0,
                    layer_hi=4, replica=0, num_replicas=2, rank=0, world_size=2,
                    rendezvous_address="n1", rendezvous_port=port, micro_batch=1,
                    restart_count=restart)
    rebuilt = NodePlacement("lab", "n2", "P9",
                            roles=(role("a", "P1", 29500), role("b", "P2", 29501)))
    sent = [role("a", "P1", 29503, restart=2), role("a", "P0", 29999), role("c", "P2", 29777)]
    got = as_sent(rebuilt, sent)
    assert [(r.job, r.rendezvous_port, r.restart_count) for r in got.roles] == \
        [("a", 29503, 2), ("b", 29501, 0)]          # b: no other rank of P2 known: as rebuilt
    assert (got.node, got.plan_id) == ("n2", "P9")
