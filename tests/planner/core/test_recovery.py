"""Recovery decisions (pure): which nodes are down, which jobs they carry, re-planning those."""

from __future__ import annotations

from hulk.errors import PlanningError
from planner.core.costmodel import Placement, Stage
from planner.core.plan import Plan
from planner.core.recovery import down_nodes, jobs_using, replan_jobs, sub_network
from planner.methods import planner_for
from tests.helpers.plans import job, manual_plan, two_city_net


def test_down_nodes_are_those_silent_past_the_timeout():
    seen = {"a": 10_000, "b": 7_001, "c": 6_999, "d": None}
    assert down_nodes(seen, now_ms=10_000, timeout_s=3) == {"c", "d"}
    assert down_nodes({}, now_ms=10_000, timeout_s=3) == set()


def test_jobs_using_names_only_jobs_with_a_role_on_the_nodes():
    net = two_city_net()
    plan = manual_plan(net)
    assert jobs_using(plan, net, {"n3"}) == {"a"}
    assert jobs_using(plan, net, {"n5", "unknown"}) == set()
    assert jobs_using(plan, net, {"n0", "n4"}) == {"a", "b"}


def test_sub_network_keeps_the_chosen_rows_and_columns():
    net = two_city_net()
    sub = sub_network(net, [5, 0])
    assert sub.ids == ["n5", "n0"] and sub.rtt_ms[0, 1] == net.rtt_ms[5, 0]


def test_replan_moves_only_the_affected_job_onto_free_nodes():
    net = two_city_net(per_city=4)          # n0..n7
    plan = manual_plan(net)                 # a on n0-n3, b on n4; n5, n6, n7 free
    result = replan_jobs(plan, net, [plan.placements[0].job], down={"n1"},
                         search=planner_for("search"), seed=0)
    assert result.replanned == ["a"] and result.kept == ["b"] and result.lost == []
    by_name = {p.job.name: p for p in result.plan.placements}
    assert by_name["b"] == plan.placements[1]                       # untouched, same object
    new_nodes = {net.ids[i] for i in by_name["a"].nodes}
    assert new_nodes <= {"n0", "n2", "n3", "n5", "n6", "n7"} and "n1" not in new_nodes
    assert "n4" not in new_nodes                                     # the kept job's node
    assert by_name["a"].stages[0].lo == 0 and by_name["a"].stages[-1].hi == 48


def never_called(jobs, net, seed=0):
    raise AssertionError("no free node: the planner is not asked")


def test_replan_with_no_free_node_marks_the_job_unplaced():
    net = two_city_net(per_city=1)          # n0, n1
    plan = Plan("manual", [Placement(job("a"), (Stage(0, 48, (0,)),), 4),
                           Placement(job("b"), (Stage(0, 48, (1,)),), 4)])
    result = replan_jobs(plan, net, [job("a")], down={"n0"}, search=never_called)
    assert result.lost == ["a"] and result.kept == ["b"]
    assert [u.name for u in result.plan.unplaced] == ["a"]


def test_a_job_the_planner_cannot_place_again_is_lost_with_the_reason():
    net = two_city_net(per_city=4)
    plan = manual_plan(net)

    def cannot(jobs, net, seed=0):
        raise PlanningError("not enough memory")

    result = replan_jobs(plan, net, [plan.placements[0].job], down={"n1"}, search=cannot)
    assert result.lost == ["a"] and result.replanned == [] and result.kept == ["b"]
    (unplaced,) = result.plan.unplaced
    assert unplaced.name == "a" and "not enough memory" in unplaced.reason
