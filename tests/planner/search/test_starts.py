"""Constructive starts (planner.search.starts): each job takes the solver's best spot on the nodes
still free, in a fixed order; jobs that do not fit wait for the next phase."""

from __future__ import annotations

import numpy as np
import pytest

from hulk.errors import PlanningError
from planner.core.generate import generate_jobs, generate_network
from planner.core.jobs import catalog_job
from planner.search import algorithm1 as alg1
from planner.search.options import Effort
from planner.search.starts import GREEDY_ORDERS, greedy_grouping, greedy_order
from planner.search.state import SearchRun


@pytest.fixture(scope="module")
def fleet():
    return generate_jobs(3, seed=7), generate_network(40, seed=7)


def assert_feasible(grouping: alg1.Grouping, jobs, net):
    assert sorted(grouping.groups) == sorted(j.name for j in jobs)
    by_name = {j.name: j for j in jobs}
    for phase in grouping.phases():
        used: list[int] = []
        for name in grouping.jobs_in_phase(phase):
            assert alg1.fits(by_name[name], net, grouping.groups[name]), name
            used += grouping.groups[name]
        assert len(used) == len(set(used)), f"phase {phase} gives a node twice"
    assert grouping.phases() == list(range(len(grouping.phases())))


@pytest.mark.parametrize("order", GREEDY_ORDERS)
def test_greedy_groupings_are_feasible_and_deterministic(fleet, order):
    jobs, net = fleet
    a = greedy_grouping(jobs, net, order)
    assert_feasible(a, jobs, net)
    assert a == greedy_grouping(jobs, net, order)


def test_the_first_job_gets_the_solvers_best_spot_on_the_whole_fleet(fleet):
    jobs, net = fleet
    first = greedy_order(jobs, "greedy-flops")[0]
    assert first.total_flops == max(j.total_flops for j in jobs)
    placement, _ = SearchRun(jobs, net).solve(first, np.arange(net.n), Effort.NORMAL)
    grouping = greedy_grouping(jobs, net, "greedy-flops")
    assert grouping.groups[first.name] == tuple(sorted(placement.nodes))
    assert grouping.phase[first.name] == 0


def test_orders_rank_by_flops_and_by_memory():
    small, big = catalog_job("gpt3-13b"), catalog_job("opt-175b")
    assert [j.name for j in greedy_order([small, big], "greedy-flops")] == ["opt-175b", "gpt3-13b"]
    assert [j.name for j in greedy_order([small, big], "greedy-memory")] == ["opt-175b",
                                                                             "gpt3-13b"]
    with pytest.raises(ValueError, match="unknown greedy order"):
        greedy_order([small], "greedy-luck")


def test_a_job_that_does_not_fit_beside_another_waits_for_the_next_phase():
    net = generate_network(24, seed=21)   # 4.5 TB in all; one opt-175b needs 3.3 TB
    jobs = [catalog_job("opt-175b", "opt-a"), catalog_job("opt-175b", "opt-b")]
    grouping = greedy_grouping(jobs, net, "greedy-flops")
    assert grouping.phase == {"opt-a": 0, "opt-b": 1}
    assert_feasible(grouping, jobs, net)


def test_a_job_that_fits_nowhere_is_refused_and_a_stop_gives_no_grouping(fleet):
    with pytest.raises(PlanningError, match="opt-175b"):
        greedy_grouping([catalog_job("opt-175b")], generate_network(4, seed=1), "greedy-flops")
    jobs, net = fleet
    assert greedy_grouping(jobs, net, "greedy-memory", should_stop=lambda: True) is None
