"""Options as values (planner.search.options), caches owned by a run, and the facts a plan
carries for code to read (planner.core.plan.PlanFacts) instead of notes to parse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.core.generate import generate_jobs, generate_network
from planner.core.plan import PlanFacts
from planner.search import Effort, EffortParams, SearchOptions, plan_search
from planner.search import algorithm1 as alg1
from planner.search.groups import GridCache, evaluate_grid, solve_group
from planner.search.portfolio import Start, _run_start, plan_portfolio
from tests.helpers.plan_checks import assert_valid, same_plan


@pytest.fixture(scope="module")
def small():
    return generate_jobs(3, seed=5), generate_network(30, seed=5)


def test_efforts_are_an_enum_of_growing_parameters():
    assert [e.name for e in Effort] == ["FAST", "NORMAL", "FULL"]
    params = [e.params for e in Effort]
    assert all(isinstance(p, EffortParams) for p in params)
    assert params[0].screen_only and not params[1].screen_only
    assert [p.replica_options for p in params] == sorted(p.replica_options for p in params)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SearchOptions().chains = False   # type: ignore[misc]


def test_a_run_writes_nothing_on_the_network_and_options_do_not_leak(small):
    jobs, net = small
    before = {k: id(v) for k, v in vars(net).items()}
    default = plan_search(jobs, net)
    assert {k: id(v) for k, v in vars(net).items()} == before
    plan_search(jobs, net, options=SearchOptions(stage_order=False, chains=False, max_rounds=1))
    again = plan_search(jobs, net)
    assert same_plan(default, again)
    assert_valid(again, net, jobs)


def test_the_grid_cache_changes_speed_only_and_keeps_to_one_network(small):
    jobs, net = small
    job = jobs[0]
    nodes = np.arange(net.n)
    cache = GridCache(net)
    kept = solve_group(job, net, nodes, Effort.NORMAL, cache=cache)
    assert kept == solve_group(job, net, nodes, Effort.NORMAL)   # a fresh cache of its own
    assert kept == solve_group(job, net, nodes, Effort.NORMAL, cache=cache)   # from the table
    grid = kept.placement.node_matrix()
    assert evaluate_grid(job, net, grid, kept.placement.micro_batch, cache=cache) == \
        evaluate_grid(job, net, grid, kept.placement.micro_batch)
    with pytest.raises(ValueError):
        evaluate_grid(job, generate_network(30, seed=6), grid, 1, cache=cache)


def test_a_stopped_search_says_so_in_its_facts(small):
    jobs, net = small
    assert plan_search(jobs, net).facts == PlanFacts()
    stopped = plan_search(jobs, net, should_stop=lambda: True)
    assert stopped.facts.cut_short
    assert_valid(stopped, net, jobs)


def test_unscored_jobs_are_facts_and_their_remarks_keep_their_place():
    net = generate_network(24, seed=2)
    jobs = generate_jobs(3, seed=2)
    scores = np.zeros((net.n, len(jobs) + 1))
    scores[:, 0] = 1.0   # every node to the first job: the others get none by score
    grouping = alg1.algorithm1(jobs, net, scores)
    assert set(grouping.unscored_jobs) == {jobs[1].name, jobs[2].name}
    remarks = grouping.remarks()
    assert len(remarks) == len(grouping.notes) + len(grouping.unscored)
    for place, name, text in grouping.unscored:
        assert name in text and text in remarks
    assert [r for r in remarks if r in grouping.notes] == grouping.notes
    plan = plan_search(jobs, net, initial=scores)
    assert plan.facts.unscored_jobs == grouping.unscored_jobs
    assert plan.notes[:len(remarks)] == remarks


@pytest.mark.slow   # a portfolio of refined starts run to its end
def test_the_portfolio_names_its_winner_and_drops_a_starts_remarks_on_its_scores(small):
    jobs, net = small
    scores = np.zeros((net.n, len(jobs) + 1))
    scores[:, 0] = 1.0   # the other jobs get no node by score
    plain = plan_search(jobs, net, initial=scores)
    assert plain.facts.unscored_jobs
    start = _run_start(Start(1, "lopsided", scores), jobs, net, SearchOptions(), None)
    assert same_plan(start.plan, plain)   # the same refinement ...
    assert start.plan.facts.unscored_jobs == ()   # ... without the remarks on the scores
    assert start.plan.notes == [n for n in plain.notes if "got no node by score" not in n]
    plan = plan_portfolio(jobs, net, budget_s=3600.0, starts=2, workers=1,
                          extra_starts=[("lopsided", scores)])
    assert plan.facts.winner in {"heuristic", "lopsided"}
    assert not plan.facts.cut_short
    assert any(f"is {plan.facts.winner!r}" in note for note in plan.notes)
