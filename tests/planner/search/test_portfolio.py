"""The portfolio of starts (planner.search.portfolio): determinism, the anytime property, never
worse than the plain search, the same plan on one or two workers, the caller's start."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hulk.errors import PlanningError
from planner.core.costmodel import estimate_plan
from planner.core.generate import generate_jobs, generate_network
from planner.search import plan_search
from planner.search.portfolio import (DEFAULT_STARTS, MAX_STARTS, MIN_STARTS, plan_portfolio,
                                      portfolio_starts, refine_starts, resolve_defaults,
                                      start_count)
from tests.helpers.plan_checks import assert_valid, same_plan

GENEROUS_S = 600.0   # a budget no start comes near: only the start count decides the plan


def makespan(plan, net) -> float:
    return estimate_plan(plan.placements, net).makespan_s


@pytest.fixture(scope="module")
def small():
    net = generate_network(24, seed=21)
    return generate_jobs(2, seed=21), net


def test_starts_are_decided_by_seed_and_count(small):
    jobs, net = small
    a = portfolio_starts(jobs, net, seed=4, count=6)
    b = portfolio_starts(jobs, net, seed=4, count=6)
    c = portfolio_starts(jobs, net, seed=5, count=6)
    assert len(portfolio_starts(jobs, net, seed=4, count=1)) == 1
    assert [s.name for s in a] == ["heuristic", "greedy-flops", "greedy-memory", "uniform",
                                   "random-1", "random-2"]
    assert a[0].scores is None and a[0].build is None
    assert [(s.scores, s.build) for s in a[1:3]] == [(None, "greedy-flops"),
                                                     (None, "greedy-memory")]
    for x, y in zip(a[3:], b[3:]):
        assert np.array_equal(x.scores, y.scores)
    assert not np.array_equal(a[4].scores, c[4].scores)
    # uniform: idle wins every node's tie, so Algorithm 1 grows each job from nothing
    assert (a[3].scores.argmax(axis=1) == len(jobs)).all()


def test_start_count_grows_with_the_budget_within_bounds():
    assert start_count(50, 4, 1e-6) == MIN_STARTS
    assert start_count(50, 4, 1e6) == MAX_STARTS
    assert start_count(50, 4, 1e6, extra=2) == MAX_STARTS + 2
    assert start_count(2000, 20, 30.0) < start_count(50, 4, 30.0)


def test_default_starts_are_fixed_whatever_the_machine_and_the_default_has_no_budget(monkeypatch):
    import planner.search.portfolio as portfolio

    # A pure function of its inputs: how many cores this machine has does not enter.
    for cores in (1, 2, 64):
        monkeypatch.setattr(portfolio, "default_workers", lambda: cores)
        assert resolve_defaults(300, 10) == (DEFAULT_STARTS, None)
    # Given values win: --starts fixes the count, --time-budget sets it from the budget.
    assert resolve_defaults(300, 10, starts=5) == (5, None)
    assert resolve_defaults(300, 10, budget_s=1e6) == (MAX_STARTS, 1e6)
    with pytest.raises(PlanningError, match="positive"):
        resolve_defaults(300, 10, budget_s=0.0)


@pytest.mark.slow
def test_same_seed_and_budget_same_plan(small):
    jobs, net = small
    a = plan_portfolio(jobs, net, seed=3, budget_s=GENEROUS_S, starts=3, workers=1)
    b = plan_portfolio(jobs, net, seed=3, budget_s=GENEROUS_S, starts=3, workers=1)
    assert a.method == "portfolio"
    assert_valid(a, net, jobs)
    assert same_plan(a, b)


@pytest.mark.slow
@pytest.mark.process   # two worker processes
def test_one_worker_and_two_workers_give_the_same_plan(small):
    jobs, net = small
    one = plan_portfolio(jobs, net, seed=1, budget_s=GENEROUS_S, starts=3, workers=1)
    two = plan_portfolio(jobs, net, seed=1, budget_s=GENEROUS_S, starts=3, workers=2)
    again = plan_portfolio(jobs, net, seed=1, budget_s=GENEROUS_S, starts=3, workers=2)
    assert same_plan(one, two) and same_plan(two, again)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 5])
def test_never_worse_than_the_plain_search(seed):
    net = generate_network(24, seed=seed)
    jobs = generate_jobs(2, seed=seed)
    plain = plan_search(jobs, net)
    best = plan_portfolio(jobs, net, seed=seed, budget_s=GENEROUS_S, starts=MIN_STARTS, workers=1)
    assert_valid(best, net, jobs)
    assert makespan(best, net) <= makespan(plain, net) * (1 + 1e-12)


@pytest.mark.process   # worker processes at the default settings
@pytest.mark.parametrize("seed", [2, 5])
def test_the_default_is_never_worse_than_the_plain_search(seed):
    net = generate_network(24, seed=seed)
    jobs = generate_jobs(2, seed=seed)
    plain = plan_search(jobs, net)
    default = plan_portfolio(jobs, net, seed=seed)
    assert_valid(default, net, jobs)
    assert makespan(default, net) <= makespan(plain, net) * (1 + 1e-12)


@pytest.mark.slow
def test_a_tiny_budget_still_gives_the_plain_search_plan_or_better():
    # The heuristic start (the plain search) always finishes; the others are stopped or dropped.
    net = generate_network(24, seed=13)
    jobs = generate_jobs(2, seed=13)
    plan = plan_portfolio(jobs, net, budget_s=1e-3, workers=1)
    assert_valid(plan, net, jobs)
    assert makespan(plan, net) <= makespan(plan_search(jobs, net), net) * (1 + 1e-12)
    assert plan.facts.cut_short and plan.facts.winner is not None
    assert any("budget ran out" in note for note in plan.notes)


@pytest.mark.slow
def test_a_caller_start_is_refined_and_can_win(small):
    jobs, net = small
    plain = plan_search(jobs, net)
    # The caller's start is the plain search's own plan written as class scores, so the
    # portfolio with just the heuristic and it reaches at least that plan.
    scores = np.zeros((net.n, len(jobs) + 1))
    scores[:, -1] = 1.0
    for p in plain.placements:
        scores[list(p.nodes), [j.name for j in jobs].index(p.job.name)] = 2.0
    plan = plan_portfolio(jobs, net, budget_s=GENEROUS_S, starts=2, workers=1,
                          extra_starts=[("caller", scores)])
    assert makespan(plan, net) <= makespan(plain, net) * (1 + 1e-12)
    assert any("refined starts" in note for note in plan.notes)


def test_extra_starts_come_after_the_built_in_ones_and_change_none_of_them(small):
    """A caller's start (the GNN's) only adds: the built-in starts keep their number, order
    and scores, so a tie or a worse extra start leaves the plan as it was."""
    jobs, net = small
    plain = portfolio_starts(jobs, net, seed=4, count=5)
    extra = np.ones((net.n, len(jobs) + 1))
    more = portfolio_starts(jobs, net, seed=4, count=5, extra_starts=[("gnn", extra)])
    assert [(s.index, s.name) for s in more] == [(s.index, s.name) for s in plain] + [(5, "gnn")]
    for a, b in zip(plain, more):
        assert (a.scores is None and b.scores is None) or np.array_equal(a.scores, b.scores)


def test_a_bad_extra_start_leaves_the_plan_unchanged(small):
    """Everything on the first job, the other jobs on nothing: the worst start a caller can
    give; the portfolio's plan is the one it makes without it."""
    jobs, net = small
    bad = np.zeros((net.n, len(jobs) + 1))
    bad[:, 0] = 1.0
    without = plan_portfolio(jobs, net, starts=2, workers=1)
    with_bad = plan_portfolio(jobs, net, starts=2, workers=1, extra_starts=[("bad", bad)])
    assert with_bad.facts.winner == without.facts.winner != "bad"
    assert makespan(with_bad, net) == makespan(without, net)


def test_a_caller_start_of_the_wrong_shape_is_refused(small):
    jobs, net = small
    with pytest.raises(PlanningError, match="gnn.*shape"):
        plan_portfolio(jobs, net, budget_s=1.0, workers=1,
                       extra_starts=[("gnn", np.ones((net.n, len(jobs))))])


def test_plan_flags_parse_and_refuse_bad_values():
    from planner.commands import plan as plan_command
    from planner.settings import PlannerSettings

    parser = argparse.ArgumentParser(exit_on_error=False)
    plan_command.register(parser.add_subparsers(), PlannerSettings())
    args = parser.parse_args(["plan", "jobs.yaml", "--fleet", "f.json", "--time-budget", "2.5",
                              "--workers", "2", "--starts", "5"])
    assert (args.method, args.budget_s, args.workers, args.starts) == ("portfolio", 2.5, 2, 5)
    assert plan_command.DEFAULT_METHOD == "portfolio" and "search" in plan_command.METHODS
    for bad in (["--time-budget", "0"], ["--time-budget", "nan"], ["--workers", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["plan", "jobs.yaml", "--fleet", "f.json", *bad])


@pytest.mark.slow
def test_a_greedy_start_wins_where_the_heuristic_grouping_does_not():
    # A fleet where the job with most FLOPs placed first on the best spot beats the heuristic
    # grouping by a third (fixed seed; deterministic: a budget no start reaches).
    net = generate_network(40, seed=1)
    jobs = generate_jobs(3, seed=1)
    run = refine_starts(jobs, net, budget_s=GENEROUS_S, starts=2, workers=1)
    assert [r.name for r in run.results] == ["heuristic", "greedy-flops"]
    assert run.best().name == "greedy-flops"
    assert run.results[1].makespan_s < 0.8 * run.results[0].makespan_s
    plan = plan_portfolio(jobs, net, budget_s=GENEROUS_S, starts=2, workers=1)
    assert_valid(plan, net, jobs)
    assert makespan(plan, net) == run.best().makespan_s
    assert any("'greedy-flops'" in note for note in plan.notes)


def test_the_default_on_one_worker_runs_every_start_to_its_end_and_judges_the_baselines(small):
    jobs, net = small
    run = refine_starts(jobs, net, workers=1)
    names = [r.name for r in run.results]
    assert run.budget_s is None and run.dropped == 0 and run.baselines == 4
    assert names == ["heuristic", "greedy-flops", "system-a", "system-b", "system-c", "dtfm"]
    assert not any(r.cut_short for r in run.results)
    plan = plan_portfolio(jobs, net, workers=1)
    assert plan.facts.winner == run.best().name and not plan.facts.cut_short
    assert makespan(plan, net) == run.best().makespan_s
    assert not any("differ" in note for note in plan.notes)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.process   # a planner process and its worker
@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_workers_stop_when_the_planner_is_killed():
    # The default waits for every start to end; a planner killed before that must not leave
    # its worker refining on.
    code = ("from planner.core.generate import generate_jobs, generate_network\n"
            "from planner.search.portfolio import plan_portfolio\n"
            "net = generate_network(400, seed=3); jobs = generate_jobs(12, seed=3)\n"
            "print('ready', flush=True)\n"
            "plan_portfolio(jobs, net, workers=2)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not _children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        workers = _children(proc.pid)
        assert workers, "the portfolio started no worker"
        time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    killed = time.monotonic()
    while any(_running(w) for w in workers) and time.monotonic() < killed + 10:
        time.sleep(0.02)
    # Stopped after its current solve (a few tens of ms), not after its whole start (seconds).
    assert time.monotonic() - killed < 1.0
