"""Each docs/COSTMODEL.md formula on small cases whose expected values are worked out by hand here.

Numbers used throughout: an A100 node with 1 GPU has thr = 1 * 312e12 * 0.4 = 124.8e12 FLOP/s, a
V100 node with 1 GPU 1 * 125e12 * 0.4 = 50e12. The job: P = 8e8, L = 4, h = 1000, s = 100,
B = 8, b = 2, steps = 10, so f = 6 * 2e8 * 100 * 2 = 2.4e11 FLOP and A = 2 * 100 * 2 * 1000 = 4e5 B.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core import gpus
from planner.core.costmodel import (Placement, Stage, compute_bound_s, estimate, estimate_plan,
                                    memory_fraction, problems, sequential_totals,
                                    stage_memory_bytes)
from planner.core.fleet import Fleet, Link, Node, bandwidth_from_rtt, complete
from planner.core.jobs import Job
from tests.helpers.plans import make_net

JOB = Job(name="j", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=8, micro_batch=2,
          steps=10)
A100_THR = 124.8e12
V100_THR = 50e12


def test_throughput_by_name_then_capability_then_default():
    assert gpus.node_throughput(1, "NVIDIA A100-SXM4-40GB", None) == pytest.approx(A100_THR)
    assert gpus.node_throughput(8, None, 7.0) == pytest.approx(8 * 125e12 * 0.4)
    assert gpus.node_throughput(2, "Mystery GPU", 8.6) == pytest.approx(2 * 150e12 * 0.4)
    assert gpus.node_throughput(1, None, 5.2) == pytest.approx(100e12 * 0.4)
    assert Node("x").gpus == 8  # unknown count: 8, as in the paper


def test_bandwidth_model():
    # min(10 Gbit/s, 80 Gbit/s*ms / rtt) in bytes/s: 10 Gbit up to 8 ms, 1 Gbit at 80, 0.2667 at 300.
    assert bandwidth_from_rtt(5.0) == pytest.approx(10e9 / 8)
    assert bandwidth_from_rtt(80.0) == pytest.approx(1e9 / 8)
    assert bandwidth_from_rtt(300.0) == pytest.approx(80 / 300 * 1e9 / 8)


def test_job_formulas():
    assert JOB.flops_per_layer() == pytest.approx(2.4e11)
    assert JOB.activation_bytes() == pytest.approx(4e5)
    assert JOB.state_bytes == pytest.approx(1.28e10)


def test_two_stage_pipeline_by_hand():
    net = make_net([("A100", 1, 40), ("V100", 1, 32)], [[0, 20], [20, 0]])
    p = Placement(JOB, (Stage(0, 3, (0,)), Stage(3, 4, (1,))), micro_batch=2)
    c0 = 2.4e11 * 3 / 124.8e12          # 0.00576923...
    c1 = 2.4e11 * 1 / 50e12             # 0.0048
    bw = 4e9 / 8                        # 80 / 20 ms = 4 Gbit/s
    t = 2 * (0.010 + 4e5 / bw)          # 0.0216
    m = 4                               # ceil(8 / 1 / 2)
    pipe = c0 + t + c1 + (m - 1) * max(c0, t, c1)
    compute = c0 + c1 + (m - 1) * max(c0, c1)
    e = estimate(p, net)
    assert e.micro_batches == 4
    assert e.iteration_s == pytest.approx(pipe, rel=1e-12)
    assert pipe == pytest.approx(0.0969692307692, rel=1e-9)
    assert e.compute_s == pytest.approx(compute, rel=1e-12)
    assert e.communication_s == pytest.approx(pipe - compute, rel=1e-12)
    assert e.job_s == pytest.approx(10 * pipe, rel=1e-12)
    assert e.allreduce_s == 0.0
    assert problems(p, net) == []


def test_ring_allreduce_by_hand():
    # K = 1, D = 3 on A100s; ring 0->1 (10 ms), 1->2 (40 ms), 2->0 (20 ms).
    net = make_net([("A100", 1, 40)] * 3, [[0, 10, 20], [10, 0, 40], [20, 40, 0]])
    p = Placement(JOB, (Stage(0, 4, (0, 1, 2)),), micro_batch=2)
    m = math.ceil(8 / 3 / 2)                     # 2
    c = 2.4e11 * 4 / 124.8e12
    pipe = c + (m - 1) * c
    s_bytes = 2 * 8e8 * 4 / 4                    # 1.6e9
    a_max, bw_min = 0.020, 2e9 / 8               # worst link: 40 ms, 80/40 = 2 Gbit/s
    ar = 2 * (3 - 1) * (a_max + s_bytes / (3 * bw_min))
    e = estimate(p, net)
    assert e.micro_batches == 2
    assert e.allreduce_s == pytest.approx(ar, rel=1e-12)
    assert ar == pytest.approx(8.61333333333, rel=1e-9)
    assert e.iteration_s == pytest.approx(pipe + ar, rel=1e-12)
    assert e.compute_s == pytest.approx(pipe, rel=1e-12)


def test_measured_bandwidth_overrides_tcp_model():
    nodes = (Node("a", gpus=1, gpu_name="A100", memory_gb=40), Node("b", gpus=1, gpu_name="A100", memory_gb=40))
    fleet = Fleet(nodes, (Link("a", "b", rtt_ms=10.0, bandwidth_gbps=0.5),))
    net = complete(fleet)
    assert net.bw[0, 1] == pytest.approx(0.5e9 / 8)
    p = Placement(JOB, (Stage(0, 4, (0, 1)),), micro_batch=2)
    ar = 2 * 1 * (0.005 + 1.6e9 / (2 * 0.5e9 / 8))
    assert estimate(p, net).allreduce_s == pytest.approx(ar, rel=1e-12)


def test_memory_limit():
    # Stage [0, 3) of a 2-stage pipeline with M = 4: 16 * 8e8 * 3/4 + 4e5 * 3 * min(4, 2) bytes.
    need = 16 * 8e8 * 3 / 4 + 4e5 * 3 * 2
    assert need == pytest.approx(9.6024e9)
    assert stage_memory_bytes(JOB, 3, 2, 4, 2) == pytest.approx(need)
    stages = (Stage(0, 3, (0,)), Stage(3, 4, (1,)))
    tight = make_net([("A100", 1, 9.60), ("A100", 1, 40)], [[0, 1], [1, 0]])
    roomy = make_net([("A100", 1, 9.61), ("A100", 1, 40)], [[0, 1], [1, 0]])
    bad = Placement(JOB, stages, micro_batch=2)
    assert any("stage 0 needs 9.6 GB" in msg for msg in problems(bad, tight))
    assert not estimate(bad, tight).memory_ok and not estimate(bad, tight).feasible
    assert problems(bad, roomy) == [] and estimate(bad, roomy).feasible
    assert estimate(bad, roomy).peak_memory_fraction == pytest.approx(need / 9.61e9)


def test_memory_fraction_is_the_worst_node_and_inf_without_memory():
    need = np.array([4.0, 1.0])                         # per stage
    mem = np.array([[8.0, 2.0], [4.0, 1.0]])            # (K, D): stage 0's second node is tight
    assert memory_fraction(need, mem) == pytest.approx(2.0)
    assert memory_fraction(need, np.array([[8.0, 0.0], [4.0, 1.0]])) == math.inf


def test_structural_problems():
    net = make_net([("A100", 1, 40)] * 3, [[0, 1, 1], [1, 0, 1], [1, 1, 0]])
    gap = Placement(JOB, (Stage(0, 2, (0,)), Stage(3, 4, (1,))), 2)
    assert any("not contiguous" in m for m in problems(gap, net))
    uneven = Placement(JOB, (Stage(0, 2, (0, 1)), Stage(2, 4, (2,))), 2)
    assert any("same, non-zero number" in m for m in problems(uneven, net))
    twice = Placement(JOB, (Stage(0, 2, (0,)), Stage(2, 4, (0,))), 2)
    assert any("twice" in m for m in problems(twice, net))
    short = Placement(JOB, (Stage(0, 3, (0,)),), 2)
    assert any("cover" in m for m in problems(short, net))


def test_completion_rule():
    nodes = (Node("a", city="Beijing"), Node("b", city="Beijing"), Node("c", city="beijing "),
             Node("d", city="Tokyo"), Node("e", city="Tokyo"),
             Node("f", city="Paris"), Node("g", city="Paris"))
    links = (Link("a", "b", 2.0), Link("a", "d", 50.0), Link("d", "a", 60.0),   # duplicate: 55
             Link("d", "e", 4.0), Link("a", "a", 9.0))                           # self-loop dropped
    net = complete(Fleet(nodes, links))
    i = net.index
    assert net.rtt_ms[i["a"], i["d"]] == pytest.approx(55.0)
    assert not net.imputed[i["a"], i["d"]]
    assert net.rtt_ms[i["a"], i["a"]] == 0.0
    # Same city, unmeasured: the city's median measured RTT (Beijing has only a-b = 2 ms).
    assert net.rtt_ms[i["b"], i["c"]] == pytest.approx(2.0) and net.imputed[i["b"], i["c"]]
    # Same city, city without measurements: median of all same-city measurements (2, 4) = 3.
    assert net.rtt_ms[i["f"], i["g"]] == pytest.approx(3.0)
    # Other pairs: shortest path over measured links b-a-d-e = 2 + 55 + 4.
    assert net.rtt_ms[i["b"], i["e"]] == pytest.approx(61.0) and net.imputed[i["b"], i["e"]]
    # No measured path: cannot communicate.
    assert math.isinf(net.rtt_ms[i["a"], i["f"]]) and net.bw[i["a"], i["f"]] == 0.0
    assert math.isinf(net.rtt_ms[i["c"], i["d"]])


def test_completion_default_same_city_without_any_measurement():
    net = complete(Fleet((Node("a", city="Oslo"), Node("b", city="Oslo"))))
    assert net.rtt_ms[0, 1] == pytest.approx(1.0)


def test_infinite_cost_between_components():
    net = make_net([("A100", 1, 40)] * 2, [[0, np.inf], [np.inf, 0]])
    net.bw[0, 1] = net.bw[1, 0] = 0.0
    assert len(net.components()) == 2
    pipe = Placement(JOB, (Stage(0, 2, (0,)), Stage(2, 4, (1,))), 2)
    dp = Placement(JOB, (Stage(0, 4, (0, 1)),), 2)
    with np.errstate(divide="ignore"):
        assert math.isinf(estimate(pipe, net).iteration_s) and not estimate(pipe, net).feasible
        assert math.isinf(estimate(dp, net).iteration_s)


def test_phases_and_totals_by_hand():
    # Single-node jobs: T = M * c with c = f L / thr.
    net = make_net([("A100", 1, 40), ("V100", 1, 40)], [[0, 5], [5, 0]])
    j1 = JOB
    j2 = Job(name="k", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=4, micro_batch=2,
             steps=10)
    j3 = Job(name="l", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=2, micro_batch=2,
             steps=10)
    t1 = 10 * 4 * (2.4e11 * 4 / A100_THR)
    t2 = 10 * 2 * (2.4e11 * 4 / V100_THR)
    t3 = 10 * 1 * (2.4e11 * 4 / A100_THR)
    plan = [Placement(j1, (Stage(0, 4, (0,)),), 2, phase=0),
            Placement(j2, (Stage(0, 4, (1,)),), 2, phase=0),
            Placement(j3, (Stage(0, 4, (0,)),), 2, phase=1)]
    pe = estimate_plan(plan, net)
    assert pe.estimates["j"].job_s == pytest.approx(t1)
    assert pe.makespan_s == pytest.approx(max(t1, t2) + t3)
    assert pe.sum_jct_s == pytest.approx(t1 + t2 + max(t1, t2) + t3)
    assert pe.start_s["l"] == pytest.approx(max(t1, t2))
    assert sequential_totals({"x": 3.0, "y": 1.0, "z": 2.0}) == (6.0, 1.0 + 3.0 + 6.0)


def test_compute_bound_by_hand():
    net = make_net([("A100", 1, 40), ("V100", 2, 64)], [[0, 5], [5, 0]])
    expected = (6 * 8e8 * 100 * 8 * 10) / (A100_THR + 2 * V100_THR)
    assert compute_bound_s([JOB], net) == pytest.approx(expected)
