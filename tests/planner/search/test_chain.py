"""Chains of relocations for the critical job (planner.search.chain), on real fleets: the
300-server real-region fleet of the portfolio benchmark, where the plain search left gpt3-13b
in a slow cluster, and small generated fleets."""

from __future__ import annotations

import numpy as np
import pytest

from bench.regions import region_network
from planner.core.costmodel import estimate, estimate_plan, problems
from planner.core.generate import generate_jobs, generate_network
from planner.search.chain import chain_move, split_pool, tight_parts
from planner.search.options import Effort, SearchOptions
from planner.search.refine import plan_search
from planner.search.state import JobState, SearchRun


NO_CHAINS = SearchOptions(chains=False)


def _states(plan, net) -> dict[str, JobState]:
    return {p.job.name: JobState.of(p.job, p, estimate(p, net)) for p in plan.placements}


def _makespan(states) -> float:
    return max(s.est.job_s for s in states.values())


def test_split_pool_gives_two_disjoint_valid_placements_inside_the_pool():
    net = generate_network(60, seed=4)
    jobs = generate_jobs(2, seed=4)
    run = SearchRun(jobs, net)
    pool = np.arange(net.n)
    a, b = (JobState.of(j, *run.solve(j, pool, Effort.NORMAL)) for j in jobs)
    split = split_pool(run, a, b, pool, limit=np.inf)
    assert split is not None
    (pa, ea), (pb, eb) = split
    assert set(pa.nodes).isdisjoint(pb.nodes)
    assert set(pa.nodes) | set(pb.nodes) <= set(pool.tolist())
    assert problems(pa, net) == [] and problems(pb, net) == []
    assert ea == estimate(pa, net) and eb == estimate(pb, net)
    # Nothing is returned when no split ends before the limit.
    assert split_pool(run, a, b, pool, limit=min(ea.job_s, eb.job_s) / 10) is None


@pytest.mark.slow   # plans a 300-server fleet
def test_a_chain_moves_the_critical_job_out_of_its_slow_cluster():
    net = region_network(300, 69, seed=7)
    jobs = generate_jobs(10, seed=7)
    plan = plan_search(jobs, net, options=NO_CHAINS)
    states = _states(plan, net)
    old = {k: s.placement for k, s in states.items()}
    before = _makespan(states)
    crit = max(states, key=lambda k: states[k].est.job_s)
    run = SearchRun(jobs, net)
    assert chain_move(run, states)
    after = _makespan(states)
    assert after < before
    moved = [k for k in states if states[k].placement is not old[k]]
    assert crit in moved and len(moved) >= 2
    nodes = [i for s in states.values() for i in s.group]
    assert len(nodes) == len(set(nodes))
    for s in states.values():
        assert problems(s.placement, net) == []
        assert s.est == estimate(s.placement, net)


@pytest.mark.slow   # plans a 300-server fleet
def test_the_search_with_chains_is_shorter_there_and_still_deterministic():
    net = region_network(300, 69, seed=7)
    jobs = generate_jobs(10, seed=7)
    with_chains = plan_search(jobs, net)
    again = plan_search(jobs, net)
    without = plan_search(jobs, net, options=NO_CHAINS)
    a = estimate_plan(with_chains.placements, net).makespan_s
    assert a == estimate_plan(again.placements, net).makespan_s
    assert [p.nodes for p in with_chains.placements] == [p.nodes for p in again.placements]
    assert a < 0.95 * estimate_plan(without.placements, net).makespan_s


def test_no_chain_for_a_single_job():
    net = generate_network(40, seed=2)
    jobs = generate_jobs(1, seed=2)
    states = _states(plan_search(jobs, net), net)
    snapshot = {k: s.placement for k, s in states.items()}
    assert not chain_move(SearchRun(jobs, net), states)
    assert {k: s.placement for k, s in states.items()} == snapshot


def test_tight_parts_split_a_chained_cluster_at_its_richest_city():
    # Four cities on a line, 6 ms apart: one single-linkage cluster 18 ms across. City B has
    # the most servers, so the first part is centred on it and holds what lies within 10 ms.
    pos = np.repeat([0.0, 6.0, 12.0, 18.0], [2, 4, 2, 2])
    rtt = np.abs(pos[:, None] - pos[None, :]) + 0.5 * (pos[:, None] != pos[None, :])
    np.fill_diagonal(rtt, 0.0)
    thr = np.ones(pos.size)
    pool = np.arange(pos.size)
    parts = tight_parts(rtt, thr, pool, radius_ms=8.0, count=2)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3, 4, 5, 6, 7], [6, 7, 8, 9]]
    # A pool whose diameter is at most twice the radius is tight already.
    assert tight_parts(rtt, thr, pool, radius_ms=10.0) == []
    assert tight_parts(rtt, thr, pool[:1]) == []


@pytest.mark.slow   # plans a 150-server fleet
def test_a_chain_finds_the_tight_part_of_a_continental_cluster():
    # The 150-server real-region fleet: llama-2-7b sets the makespan and does better on the
    # European servers within 10 ms of one city than on the whole European cluster.
    net = region_network(150, 60, seed=4)
    jobs = generate_jobs(8, seed=4)
    with_chains = estimate_plan(plan_search(jobs, net).placements, net).makespan_s
    without = estimate_plan(plan_search(jobs, net, options=NO_CHAINS).placements, net).makespan_s
    assert with_chains < 0.8 * without
