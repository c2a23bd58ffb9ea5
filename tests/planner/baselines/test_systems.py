"""Systems A, B, C of docs/COSTMODEL.md section 6 on tiny fleets, expected values worked out by hand."""

from __future__ import annotations

import pytest

from planner.baselines.systems import (nearest_neighbour_chain, plan_system_a, plan_system_b,
                                    plan_system_c, system_a_placement, system_b_placement,
                                    system_c_estimate, system_c_totals)
from planner.core.costmodel import estimate, estimate_plan, problems
from planner.core.jobs import Job
from planner.core.plan import Unplaced
from tests.helpers.plans import make_net

JOB = Job(name="j", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=8, micro_batch=2,
          steps=10)
JOB8 = Job(name="j8", params=8e8, layers=8, hidden=1000, seq_len=100, global_batch=8, micro_batch=2,
           steps=10)


def test_system_a_uses_every_node_that_holds_the_model():
    # Whole model: 16 * 8e8 + 4e5 * 4 = 12.8016 GB.
    net = make_net([("A100", 1, 40), ("A100", 1, 12.80), ("V100", 1, 12.81)],
                   [[0, 5, 5], [5, 0, 5], [5, 5, 0]])
    p = system_a_placement(JOB, net)
    assert [st.nodes for st in p.stages] == [(0, 2)]
    assert (p.stages[0].lo, p.stages[0].hi) == (0, 4)
    assert problems(p, net) == []


def test_system_a_infeasible_when_no_node_holds_the_model():
    net = make_net([("A100", 1, 12.0), ("A100", 1, 12.5)], [[0, 5], [5, 0]])
    result = system_a_placement(JOB, net)
    assert isinstance(result, Unplaced) and "no node holds the whole model" in result.reason
    plan = plan_system_a([JOB], net)
    assert plan.placements == [] and plan.unplaced[0].name == "j"


def test_system_b_layers_in_proportion_to_throughput_and_chained_nearest_first():
    # thr 1:1:2 and 8 layers -> 2, 2, 4. Chain from node 0: nearest is 2 (10 ms), then 1.
    net = make_net([("A100", 1, 40), ("A100", 1, 40), ("A100", 2, 80)],
                   [[0, 30, 10], [30, 0, 5], [10, 5, 0]])
    p = system_b_placement(JOB8, net)
    assert [(st.lo, st.hi, st.nodes) for st in p.stages] == [(0, 2, (0,)), (2, 6, (2,)), (6, 8, (1,))]
    assert problems(p, net) == []


def test_system_b_respects_memory():
    # One layer on a 3-stage pipeline: 16 * 8e8 / 8 + 4e5 * min(4, 3) = 1.6012e9 bytes, so 4.81 GB
    # holds 3 layers. Node 2 is capped at 3; the other 5 split 2.5 / 2.5 and the tie goes to the
    # first in chain order (node 0).
    net = make_net([("A100", 1, 40), ("A100", 1, 40), ("A100", 2, 4.81)],
                   [[0, 30, 10], [30, 0, 5], [10, 5, 0]])
    p = system_b_placement(JOB8, net)
    assert [(st.lo, st.hi, st.nodes) for st in p.stages] == [(0, 3, (0,)), (3, 6, (2,)), (6, 8, (1,))]
    assert problems(p, net) == []


def test_system_b_takes_the_fastest_nodes_and_leaves_out_small_ones():
    # 4 layers, 6 nodes: node 5 cannot hold one layer; of the rest the 4 fastest (H100 > A100 x2 >
    # A100 > V100 > T4) are used.
    net = make_net([("T4", 1, 40), ("A100", 1, 40), ("V100", 1, 40), ("H100", 1, 80),
                    ("A100", 2, 80), ("H100", 8, 1.0)],
                   [[0 if i == j else 5 + i + j for j in range(6)] for i in range(6)])
    p = system_b_placement(JOB, net)
    assert sorted(p.nodes) == [1, 2, 3, 4]
    assert p.stages[0].nodes == (1,)  # the chain starts at the lowest index


def test_system_b_infeasible_when_the_pipeline_cannot_hold_the_model():
    net = make_net([("A100", 1, 3.0), ("A100", 1, 3.0)], [[0, 5], [5, 0]])
    result = system_b_placement(JOB8, net)
    assert isinstance(result, Unplaced) and "System B" in result.reason


def test_system_c_by_hand():
    # n = 2, min thr = V100 50e12: compute 6 * 8e8 * 100 * 8 / (2 * 50e12) = 0.0384 s.
    # 4 micro-batches x 4 layers x 4 all-reduces of A = 4e5 B over the ring 0 -> 1 -> 0 at 10 ms:
    # a = 0.005, bw = 8 Gbit/s = 1e9 B/s, T_ar = 2 * 1 * (0.005 + 4e5 / (2 * 1e9)) = 0.0104 s.
    net = make_net([("A100", 1, 40), ("V100", 1, 40)], [[0, 10], [10, 0]])
    e = system_c_estimate(JOB, net)
    assert e.compute_s == pytest.approx(0.0384)
    assert e.communication_s == pytest.approx(4 * 4 * 4 * 0.0104)
    assert e.iteration_s == pytest.approx(0.0384 + 0.6656)
    assert e.job_s == pytest.approx(10 * (0.0384 + 0.6656))
    plan = plan_system_c([JOB], net)
    assert plan.placements == [] and plan.job_s_override["j"] == pytest.approx(e.job_s)


def test_system_c_memory_and_split():
    small = make_net([("A100", 1, 40), ("V100", 1, 6.3)], [[0, 10], [10, 0]])  # each holds 6.4 GB
    assert isinstance(system_c_estimate(JOB, small), Unplaced)
    split = make_net([("A100", 1, 40), ("V100", 1, 40)], [[0, float("inf")], [float("inf"), 0]])
    result = system_c_estimate(JOB, split)
    assert isinstance(result, Unplaced) and "split" in result.reason


def test_nearest_neighbour_chain():
    net = make_net([("A100", 1, 40)] * 4, [[0, 9, 3, 7], [9, 0, 2, 1], [3, 2, 0, 8], [7, 1, 8, 0]])
    assert nearest_neighbour_chain(net, [3, 1, 2, 0]) == [0, 2, 1, 3]


def test_jobs_run_one_after_another_shortest_first():
    net = make_net([("A100", 1, 40), ("A100", 1, 40)], [[0, 5], [5, 0]])
    long = Job(name="long", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=8,
               micro_batch=2, steps=100)
    short = Job(name="short", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=8,
                micro_batch=2, steps=10)
    for planner in (plan_system_a, plan_system_b):
        plan = planner([long, short], net)
        phases = {p.job.name: p.phase for p in plan.placements}
        assert phases == {"short": 0, "long": 1}
        t = {p.job.name: estimate(p, net).job_s for p in plan.placements}
        totals = estimate_plan(plan.placements, net)
        assert totals.makespan_s == pytest.approx(t["short"] + t["long"])
        assert totals.sum_jct_s == pytest.approx(t["short"] + (t["short"] + t["long"]))
    plan_c = plan_system_c([long, short], net)
    tc = plan_c.job_s_override
    assert system_c_totals(plan_c) == pytest.approx((tc["short"] + tc["long"],
                                                     2 * tc["short"] + tc["long"]))
