"""The DT-FM-style peer (planner.baselines.dtfm): valid sequential plans, its parts, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from hulk.errors import PlanningError
from planner.baselines.dtfm import dtfm_placement, path_order, plan_dtfm
from planner.core.costmodel import estimate, estimate_plan, problems
from planner.core.fleet import Network, Node
from planner.core.generate import generate_jobs, generate_network
from planner.core.jobs import Job
from planner.search.arrangement import match_rows


def test_plan_is_valid_and_sequential_shortest_first():
    net = generate_network(40, seed=3)
    jobs = generate_jobs(3, seed=3)
    plan = plan_dtfm(jobs, net, seed=0, generations=10)
    assert plan.method == "dtfm"
    assert sorted(p.job.name for p in plan.placements) == sorted(j.name for j in jobs)
    assert sorted(p.phase for p in plan.placements) == list(range(len(jobs)))
    times = []
    for p in sorted(plan.placements, key=lambda p: p.phase):
        assert problems(p, net) == []
        times.append(estimate(p, net).job_s)
    assert times == sorted(times)
    pe = estimate_plan(plan.placements, net)
    assert pe.makespan_s == pytest.approx(sum(times))


def test_same_seed_same_plan():
    net = generate_network(30, seed=4)
    jobs = generate_jobs(2, seed=4)
    a = plan_dtfm(jobs, net, seed=5, generations=10)
    b = plan_dtfm(jobs, net, seed=5, generations=10)
    assert [(p.job.name, p.stages, p.micro_batch) for p in a.placements] == \
           [(p.job.name, p.stages, p.micro_batch) for p in b.placements]


def test_evolution_never_makes_the_placement_worse():
    net = generate_network(30, seed=6)
    job = generate_jobs(1, seed=6)[0]
    _, start = dtfm_placement(job, net, seed=0, generations=0)
    _, evolved = dtfm_placement(job, net, seed=0, generations=20)
    assert evolved.iteration_s <= start.iteration_s


def test_open_path_order_follows_a_line():
    # Points on a line, shuffled: the open path must visit them in line order.
    pos = np.array([5.0, 0.0, 3.0, 1.0, 4.0, 2.0])
    dist = np.abs(pos[:, None] - pos[None, :])
    path = path_order(dist)
    assert [pos[i] for i in path] in ([0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0])


def test_bottleneck_matching_pairs_each_node_with_its_neighbour():
    # Stage 0 holds nodes in cities A and B, stage 1 the other node of each city (listed crossed):
    # matching must pair A with A and B with B.
    nodes = [Node(id=f"n{i}", city=c, gpus=8, compute_capability=8.0, memory_gb=80.0)
             for i, c in enumerate(["A", "B", "B", "A"])]
    city = np.array([0, 1, 1, 0])
    rtt = np.where(city[:, None] == city[None, :], 1.0, 150.0)
    net = Network.from_matrix(nodes, rtt)
    grid = np.array([[0, 1], [3, 2]])[:, ::-1].copy()   # [[1, 0], [2, 3]]: crossed
    matched = match_rows(net, grid, act=1e7)
    for p in range(2):
        assert city[matched[0, p]] == city[matched[1, p]]


def test_a_job_that_fits_nowhere_is_listed_unplaced():
    nodes = [Node(id=f"n{i}", gpus=8, compute_capability=8.0, memory_gb=40.0) for i in range(3)]
    net = Network.from_matrix(nodes, np.ones((3, 3)))
    huge = Job(name="huge", params=100e9, layers=8, hidden=1024, seq_len=512, global_batch=64)
    plan = plan_dtfm([huge], net, generations=2)
    assert plan.placements == [] and plan.unplaced[0].name == "huge"
    with pytest.raises(PlanningError):
        dtfm_placement(huge, net, generations=2)


def test_large_partitions_get_fewer_generations():
    from planner.baselines.dtfm import EVOLVE_FULL_NODES, _generations_for

    assert _generations_for(60, EVOLVE_FULL_NODES) == 60
    assert _generations_for(0, 10 * EVOLVE_FULL_NODES) == 0
    fewer = _generations_for(60, 4 * EVOLVE_FULL_NODES)
    assert 10 <= fewer < 60
    assert _generations_for(60, 100 * EVOLVE_FULL_NODES) == 10
