"""The warm-started repair after a node loss (planner.search.repair): valid plans without the
lost nodes, other jobs untouched, only free nodes used, deterministic, and the full re-plan as
the fallback."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.costmodel import Placement, Stage, estimate, problems
from planner.core.fleet import Network, Node
from planner.core.generate import generate_fleet, generate_jobs
from planner.core.fleet import complete
from planner.core.plan import Plan
from planner.search import plan_search
from planner.search.repair import free_nodes, repair_job, repair_jobs, substitutes
from tests.helpers.plans import A100, job, manual_plan, two_city_net


def never_called(jobs, net, seed=0):
    raise AssertionError("the repair should have been enough: no full re-plan")


def assert_repaired(before: Plan, after: Plan, net: Network, down: set[str], changed: set[str]):
    """Valid by the cost model's rules, no down node, other jobs untouched, no changed job on a
    node of a kept job, no node with two roles."""
    down_idx = {net.index[n] for n in down}
    old = {p.job.name: p for p in before.placements}
    new = {p.job.name: p for p in after.placements}
    assert set(new) == set(old)
    for name, p in new.items():
        assert problems(p, net) == []
        assert not down_idx & set(p.nodes)
        if name not in changed:
            assert p == old[name]
    kept_nodes = {i for q in before.placements if q.job.name not in changed for i in q.nodes}
    for name in changed:
        assert not kept_nodes & set(new[name].nodes)
        assert new[name].phase == old[name].phase
    used = [i for p in after.placements for i in p.nodes]
    assert len(used) == len(set(used))


def test_a_lost_node_is_replaced_and_the_other_job_is_untouched():
    net = two_city_net(per_city=4)          # a on n0-n3 (Beijing), b on n4; n5-n7 free in Tokyo
    plan = manual_plan(net)
    result = repair_jobs(plan, net, [plan.placements[0].job], ["n1"], search=never_called)
    assert result.replanned == ["a"] and result.kept == ["b"] and result.lost == []
    assert_repaired(plan, result.plan, net, {"n1"}, {"a"})
    assert result.plan.placements[1] is plan.placements[1]
    assert any(n.startswith("repaired a without ['n1']") for n in result.plan.notes)


def test_the_repair_is_deterministic():
    net = two_city_net(per_city=4)
    plan = manual_plan(net)
    runs = [repair_jobs(plan, net, [plan.placements[0].job], ["n2"], search=never_called)
            for _ in range(2)]
    assert runs[0].plan.placements == runs[1].plan.placements
    assert runs[0].plan.notes == runs[1].plan.notes


def test_an_equal_spare_of_the_same_city_fills_the_slot_and_nothing_is_lost():
    net = two_city_net(per_city=6)          # n5 is a free twin of n1 in Beijing
    plan = manual_plan(net)
    a = plan.placements[0]
    before = estimate(a, net).job_s
    placed, est = substitutes(a, net, {1}, np.array([5, 6, 7, 8]))
    assert placed.stages[0].nodes == (0, 5) and est.job_s == before
    result = repair_job(a, net, {1}, free_nodes(plan, net, "a", {1}))
    assert result.placement is not None and 1 not in result.placement.nodes
    assert result.job_s <= before * (1 + 1e-9)


def test_down_spares_are_never_used():
    net = two_city_net(per_city=6)
    plan = manual_plan(net)
    result = repair_jobs(plan, net, [plan.placements[0].job], ["n1", "n5"], search=never_called)
    assert_repaired(plan, result.plan, net, {"n1", "n5"}, {"a"})


def test_two_jobs_losing_nodes_at_once_are_both_repaired_on_separate_nodes():
    net = two_city_net(per_city=6)
    plan = manual_plan(net)
    jobs = [p.job for p in plan.placements]
    result = repair_jobs(plan, net, jobs, ["n0", "n4"], search=never_called)
    assert result.replanned == ["a", "b"] and result.kept == [] and result.lost == []
    assert_repaired(plan, result.plan, net, {"n0", "n4"}, {"a", "b"})


def test_without_a_spare_a_pipeline_shrinks_onto_its_surviving_nodes():
    """No free node at all: the lost replica's column goes (2 x 2 -> 2 x 1)."""
    net = two_city_net(per_city=3)          # a on n0-n3, b on n4, n5 free
    plan = manual_plan(net)
    result = repair_job(plan.placements[0], net, {1}, np.array([], dtype=np.int64))
    assert result.placement is not None and result.step in ("shrink", "refine")
    assert set(result.placement.nodes) <= {0, 2, 3}


def test_a_job_that_cannot_be_repaired_falls_back_to_the_full_re_plan():
    """One 40 GB node: when it is lost, the only free node (8 GB) cannot take its slot and
    no survivor is left; the full re-plan is asked and finds nothing either."""
    nodes = [Node(id="big", city="Beijing", gpus=1, gpu_name=A100, memory_gb=40),
             Node(id="small", city="Beijing", gpus=1, gpu_name=A100, memory_gb=8)]
    net = Network.from_matrix(nodes, np.array([[0.0, 1.0], [1.0, 0.0]]))
    gpt = job("a")
    plan = Plan("manual", [Placement(gpt, (Stage(0, gpt.layers, (0,)),), 1)])
    asked = []

    def search(jobs, sub, seed=0):
        asked.append([j.name for j in jobs])
        return plan_search(jobs, sub)

    result = repair_jobs(plan, net, [gpt], ["big"], search=search)
    assert asked == [["a"]]
    assert result.lost == ["a"] and result.replanned == []
    assert any("repair of a failed" in n for n in result.plan.notes)


def test_a_job_without_a_placement_is_re_planned_in_full():
    net = two_city_net(per_city=4)
    plan = manual_plan(net)
    missing = job("c", "bert-large")
    asked = []

    def search(jobs, sub, seed=0):
        asked.append([j.name for j in jobs])
        return plan_search(jobs, sub)

    result = repair_jobs(plan, net, [missing], ["n7"], search=search)
    assert asked == [["c"]] and result.replanned == ["c"]
    assert sorted(result.kept) == ["a", "b"]
    c = next(p for p in result.plan.placements if p.job.name == "c")
    assert not {0, 1, 2, 3, 4, 7} & set(c.nodes)


@pytest.mark.slow   # plans and repairs eight generated fleets
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), pick=st.integers(0, 10_000))
def test_repair_on_generated_fleets_keeps_every_invariant(seed, pick):
    net = complete(generate_fleet(24, seed=seed, n_cities=4))
    jobs = generate_jobs(3, seed=seed, max_params=2e9)
    plan = plan_search(jobs, net)
    used = sorted({i for p in plan.placements for i in p.nodes})
    lost = used[pick % len(used)]
    name = next(p.job.name for p in plan.placements if lost in p.nodes)
    affected = [p.job for p in plan.placements if p.job.name == name]
    result = repair_jobs(plan, net, affected, [net.ids[lost]], search=never_called)
    assert result.replanned == [name] and result.lost == []
    assert_repaired(plan, result.plan, net, {net.ids[lost]}, {name})
    again = repair_jobs(plan, net, affected, [net.ids[lost]], search=never_called)
    assert again.plan.placements == result.plan.placements
