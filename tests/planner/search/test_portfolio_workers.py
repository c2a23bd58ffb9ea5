"""The portfolio's worker processes (planner.search.workers) and the anytime snapshots a stopped
start gives (plan_search's ``snapshot``)."""

from __future__ import annotations

import math
import os
import time

import pytest

from planner.core.costmodel import estimate_plan
from planner.core.generate import generate_jobs, generate_network
from planner.search import plan_search
from planner.search.portfolio import Start, _run_start, refine_starts
from planner.search.options import SearchOptions
from planner.search.starts import greedy_grouping
from planner.search.workers import StartWorkers, can_fork, wait_reaped
from tests.helpers.plan_checks import assert_valid, same_plan

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs os.fork")


def _drain(pool: StartWorkers, timeout: float = 10.0) -> list:
    got, deadline = [], time.monotonic() + timeout
    while pool.running and time.monotonic() < deadline:
        got += pool.poll(0.2)
    return got


@pytest.mark.process   # forked children
def test_children_take_every_queued_index_once_and_stream_each_result():
    def run_one(index, send, should_stop):
        send(("snapshot", index))
        send(("final", index, os.getpid()))

    pool = StartWorkers(2, [1, 2, 3, 4, 5], run_one, math.inf)
    try:
        got = _drain(pool)
    finally:
        pool.close()
    finals = sorted(x[1] for x in got if x[0] == "final")
    assert finals == [1, 2, 3, 4, 5]
    assert sorted(x[1] for x in got if x[0] == "snapshot") == finals
    # each index's snapshot came before its final result, through the same child's pipe
    for index in finals:
        kinds = [x[0] for x in got if x[1] == index]
        assert kinds == ["snapshot", "final"]
    assert {x[2] for x in got if x[0] == "final"} - {os.getpid()}, "the work ran in children"


@pytest.mark.process   # forked children
def test_the_stop_is_seen_by_children_and_close_kills_them():
    def run_one(index, send, should_stop):
        send(index)
        while not should_stop():   # a start that only a stop ends
            time.sleep(0.005)
        send(-index)

    pool = StartWorkers(1, [1, 2, 3], run_one, math.inf)
    pids = list(pool.pids)
    try:
        first = []
        deadline = time.monotonic() + 10
        while not first and time.monotonic() < deadline:
            first = pool.poll(0.2)
        assert first == [1]
        pool.set_stop(time.monotonic())
        rest = _drain(pool)
        assert rest == [-1]   # stopped start 1 answered; 2 and 3 were never begun
    finally:
        pool.close()
    wait_reaped()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)   # already reaped


@pytest.mark.process   # a forked child that never returns on its own
def test_close_ends_a_child_that_ignores_the_stop():
    def run_one(index, send, should_stop):
        send("busy")
        while True:
            time.sleep(0.01)

    pool = StartWorkers(1, [1], run_one, math.inf)
    pid = pool.pids[0]
    try:
        deadline = time.monotonic() + 10
        while not pool.poll(0.2) and time.monotonic() < deadline:
            pass
    finally:
        pool.close()
    wait_reaped()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_snapshots_are_valid_plans_that_only_improve_and_change_nothing():
    net = generate_network(40, seed=1)
    jobs = generate_jobs(3, seed=1)
    grouping = greedy_grouping(jobs, net, "greedy-flops")
    sent = []
    result = _run_start(Start(1, "greedy-flops", None, build="greedy-flops"), jobs, net,
                        SearchOptions(), lambda: False, sent.append)
    assert sent, "no snapshot of the refinement was sent"
    spans = [r.makespan_s for r in sent]
    assert spans == sorted(spans, reverse=True) and len(set(spans)) == len(spans)
    for snap in sent:
        assert not snap.final and snap.cut_short and snap.index == 1
        assert_valid(snap.plan, net, jobs)
        assert snap.makespan_s == estimate_plan(snap.plan.placements, net).makespan_s
    assert result.final and result.makespan_s <= spans[-1] * (1 + 1e-12)
    # The hook only watches: the start's plan is the plain refinement's from that grouping.
    assert same_plan(result.plan, plan_search(jobs, net, initial=grouping))


@pytest.mark.process   # forked children
def test_the_planner_takes_queued_work_too():
    def run_one(index, send, should_stop):
        send(index)

    pool = StartWorkers(1, list(range(1, 40)), run_one, math.inf, low_priority=False)
    try:
        mine = []
        while (index := pool.take()) is not None:
            mine.append(index)
        theirs = _drain(pool)
    finally:
        pool.close()
    assert sorted(mine + theirs) == list(range(1, 40))   # each index once, by one side


def test_by_default_workers_are_forked_whatever_the_load(monkeypatch):
    import planner.search.portfolio as portfolio
    import planner.search.portfolio_run as portfolio_run

    net = generate_network(24, seed=21)
    jobs = generate_jobs(2, seed=21)
    monkeypatch.setattr(portfolio, "default_workers", lambda: 2)
    forked = []

    def no_fork(count, indices, run_one, stop_at, *, low_priority):
        forked.append((count, indices, low_priority))
        raise OSError("no fork in this test")

    monkeypatch.setattr(portfolio_run, "StartWorkers", no_fork)
    with pytest.raises(OSError):
        refine_starts(jobs, net)
    # One worker beside this process, at normal priority (the planner waits for it), for
    # every baseline, then every start but the heuristic.
    assert forked == [(1, [2, 3, 4, 5, 1], False)]
