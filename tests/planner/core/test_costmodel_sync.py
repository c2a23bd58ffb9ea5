"""docs/COSTMODEL.md section 9 (low-communication jobs) on cases worked out by hand here.

The job is tests/planner/core/test_costmodel.py's: P = 8e8, L = 4, s = 100, h = 1000, B = 8,
b = 2, so f = 2.4e11 FLOP per layer per micro-batch and an A100 node computes 124.8e12 FLOP/s.
The network: two "continents" of two A100 nodes, 10 ms inside one (bw = 8 Gbit/s = 1e9 B/s),
200 ms between them (bw = 80 / 200 Gbit/s = 5e7 B/s).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.core.costmodel import (OuterSync, Placement, Stage, estimate, outer_state_bytes,
                                    problems, pseudo_gradient_bytes, stage_memory_bytes)
from planner.core.costmodel_sync import (broadcast_s, exposed_outer_s, island_broadcast_s,
                                         outer_exchange_s, outer_group)
from planner.core.jobs import COMPRESSION_BYTES, Job, Sync
from planner.core.lower_bound import lower_bound
from tests.helpers.plans import make_net

JOB = Job(name="j", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=8, micro_batch=2,
          steps=10)
RTT = [[0, 10, 200, 200], [10, 0, 200, 200], [200, 200, 0, 10], [200, 200, 10, 0]]
NET = make_net([("A100", 1, 40)] * 4, RTT)
C = 2.4e11 * 4 / 124.8e12                    # one stage of 4 layers, one micro-batch
M = 1                                        # ceil(8 / 4 replicas / 2)
INNER_AR = 2 * 1 * (0.005 + 1.6e9 / (2 * 1e9))   # 2 replicas of an island, S = 2 P = 1.6e9
T_INNER = C + (M - 1) * C + INNER_AR


def diloco(h: int = 10, compression: str = "bf16", fragments: int = 0,
           islands: tuple[int, ...] = (2, 2)) -> Placement:
    return Placement(JOB, (Stage(0, 4, (0, 1, 2, 3)),), micro_batch=2, islands=islands,
                     outer=OuterSync(h, compression, fragments))


def test_contract_defaults_leave_step_jobs_alone():
    assert Job(name="x", params=1e9, layers=2, hidden=8, seq_len=8, global_batch=1).sync == Sync()
    assert Sync() == Sync("step", 1, ("none",), 0)
    assert COMPRESSION_BYTES == {"none": 4, "bf16": 2, "int8": 1}
    step = Placement(JOB, (Stage(0, 4, (0, 1, 2, 3)),), micro_batch=2)
    assert step.islands == () and step.outer is None and estimate(step, NET).outer_sync_s == 0.0


# The leader's broadcast of the averaged fp32 pseudo-gradient (4 P = 3.2e9 B) within an island
# of two: one round over the 10 ms link.
BROADCAST = 1 * (0.005 + 3.2e9 / 1e9)


def test_two_islands_by_hand():
    e = estimate(diloco(h=10, compression="bf16"), NET)
    # bf16 travels by all_gather between the two leaders: a = 0.1 s, 1.6e9 B each way at once.
    outer = (2 - 1) * (0.100 + 2 * 8e8 / 5e7) + BROADCAST
    assert outer == pytest.approx(35.305)
    assert e.micro_batches == 1
    assert e.allreduce_s == pytest.approx(INNER_AR, rel=1e-12)
    assert e.outer_sync_s == pytest.approx(outer, rel=1e-12)
    assert e.iteration_s == pytest.approx(T_INNER + outer / 10, rel=1e-12)
    assert e.job_s == pytest.approx(10 * T_INNER + math.ceil(10 / 10) * outer, rel=1e-12)
    assert e.compute_s == pytest.approx(C, rel=1e-12)
    assert e.communication_s == pytest.approx(e.iteration_s - C, rel=1e-12)
    assert problems(diloco(), NET) == []
    # The same nodes synchronising every step pay the 200 ms ring of all four replicas instead.
    step = estimate(Placement(JOB, (Stage(0, 4, (0, 1, 2, 3)),), micro_batch=2), NET)
    assert step.iteration_s == pytest.approx(C + 2 * 3 * (0.1 + 1.6e9 / (4 * 5e7)), rel=1e-12)
    assert e.iteration_s < step.iteration_s / 3


def test_job_s_counts_a_partial_last_round():
    e = estimate(diloco(h=4), NET)            # 10 steps: rounds after steps 4, 8 and 10
    assert e.job_s == pytest.approx(10 * T_INNER + 3 * e.outer_sync_s, rel=1e-12)


def test_compression_scales_the_outer_bytes():
    times = {c: estimate(diloco(compression=c), NET).outer_sync_s for c in COMPRESSION_BYTES}
    for c, nbytes in COMPRESSION_BYTES.items():
        assert pseudo_gradient_bytes(JOB, 4, c) == nbytes * 8e8
    # none: the trainer's fp32 ring all-reduce; bf16 and int8: an all_gather among the leaders.
    assert times["none"] == pytest.approx(2 * (0.1 + 4 * 8e8 / (2 * 5e7)) + BROADCAST, rel=1e-12)
    for c in ("bf16", "int8"):
        assert times[c] == pytest.approx(0.1 + COMPRESSION_BYTES[c] * 8e8 / 5e7 + BROADCAST,
                                         rel=1e-12)
    assert times["int8"] < times["bf16"] < times["none"]


def test_outer_sync_prices_the_all_gather_and_the_island_broadcast():
    three = make_net([("A100", 1, 40)] * 6, [[0 if i == j else (10 if i // 2 == j // 2 else 200)
                                              for j in range(6)] for i in range(6)])
    p = Placement(JOB, (Stage(0, 4, tuple(range(6))),), micro_batch=2, islands=(2, 2, 2),
                  outer=OuterSync(10, "int8"))
    # Three leaders: two all_gather hops of 8e8 int8 bytes each; islands of two: one broadcast.
    assert outer_exchange_s(p, three) == pytest.approx(2 * (0.1 + 8e8 / 5e7), rel=1e-12)
    assert island_broadcast_s(p, three) == pytest.approx(BROADCAST, rel=1e-12)
    singles = replace(p, stages=(Stage(0, 4, (0, 2, 4)),), islands=(1, 1, 1))
    assert island_broadcast_s(singles, three) == 0.0
    assert broadcast_s(5, 0.0, 1.0, 1.0) == 3 and broadcast_s(1, 0.1, 1.0, 1.0) == 0


def test_streaming_hides_the_outer_all_reduce_up_to_one_fragment():
    outer = 32.2
    assert exposed_outer_s(outer, 1.0, 10, 0) == outer
    assert exposed_outer_s(outer, 1.0, 10, 4) == pytest.approx(outer - 10)   # too few steps
    assert exposed_outer_s(outer, 1.0, 100, 4) == pytest.approx(outer / 4)   # one fragment shows
    e = estimate(diloco(h=100, fragments=4), NET)
    assert e.iteration_s == pytest.approx(T_INNER + e.outer_sync_s / 4 / 100, rel=1e-12)
    plain = estimate(diloco(h=100), NET)
    assert e.iteration_s < plain.iteration_s and e.outer_sync_s == plain.outer_sync_s


def test_one_island_costs_what_a_step_job_does_plus_the_outer_state():
    one = estimate(diloco(islands=()), NET)
    step = estimate(Placement(JOB, (Stage(0, 4, (0, 1, 2, 3)),), micro_batch=2), NET)
    assert one.outer_sync_s == 0.0
    assert one.iteration_s == step.iteration_s and one.job_s == step.job_s
    assert one.allreduce_s == step.allreduce_s
    assert one.peak_memory_fraction > step.peak_memory_fraction


def test_memory_adds_eight_bytes_per_parameter():
    need = stage_memory_bytes(JOB, 4, 2, M, 1) + outer_state_bytes(JOB, 4)
    assert outer_state_bytes(JOB, 4) == 8 * 8e8
    assert estimate(diloco(), NET).peak_memory_fraction == pytest.approx(need / 40e9, rel=1e-12)
    # 16 GB holds the training state (12.8 GB) but not the outer state beside it (19.2 GB).
    small = make_net([("A100", 1, 16)] * 4, RTT)
    assert problems(Placement(JOB, (Stage(0, 4, (0, 1, 2, 3)),), micro_batch=2), small) == []
    assert not estimate(diloco(), small).memory_ok
    assert any("stage 0 needs" in p for p in problems(diloco(), small))


def test_outer_group_is_each_islands_first_replica_per_stage():
    p = Placement(JOB, (Stage(0, 2, (0, 1, 2)), Stage(2, 4, (3, 4, 5))), micro_batch=2,
                  islands=(1, 2), outer=OuterSync(10, "int8"))
    assert outer_group(p).tolist() == [[0, 1], [3, 4]]
    assert p.island_columns() == [(0, 1), (1, 3)]


def test_problems_name_bad_islands():
    assert any("sum to the 4 replicas" in p for p in problems(diloco(islands=(1, 2)), NET))
    plain = Placement(JOB, (Stage(0, 4, (0, 1, 2, 3)),), micro_batch=2, islands=(2, 2))
    assert any("need an outer sync" in p for p in problems(plain, NET))


def test_the_lower_bound_stays_below_a_diloco_placement():
    # One node on each of two continents and a batch worth both nodes' compute: a step job
    # either computes on one node or rings across the 200 ms link every step; the islands
    # cross it every H steps only, so they beat the step job's floor and need their own.
    net = make_net([("A100", 1, 40)] * 2, [[0, 200], [200, 0]])
    jobs = replace(JOB, steps=1000, global_batch=8000)
    islands = estimate(Placement(jobs, (Stage(0, 4, (0, 1)),), micro_batch=2,
                                 islands=(1, 1), outer=OuterSync(500, "int8", 4)), net)
    assert islands.job_s < lower_bound([jobs], net).seconds
    for mode in ("diloco", "auto"):
        job = replace(jobs, sync=Sync(mode, 500, ("int8",), 4))
        assert 0 < lower_bound([job], net).seconds <= islands.job_s
