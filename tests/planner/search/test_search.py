"""The search planner (planner.search): valid plans, exact estimates, determinism, components,
and quality against the DT-FM-style peer."""

from __future__ import annotations

import numpy as np
import pytest

from hulk.errors import PlanningError
from planner.baselines.dtfm import plan_dtfm
from planner.core.costmodel import estimate, estimate_plan, problems
from planner.core.fleet import Network, Node
from planner.core.generate import generate_jobs, generate_network
from planner.core.jobs import Job, catalog_job
from planner.search import algorithm1 as alg1
from planner.search import best_placement, cluster_labels, heuristic_scores, plan_search
from planner.search.groups import evaluate_grid
from planner.search.grow import grow_bottleneck
from planner.search.state import SearchRun
from tests.helpers.plan_checks import assert_valid, same_plan


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_plans_on_generated_fleets_are_valid(seed):
    net = generate_network(60, seed=seed)
    jobs = generate_jobs(4, seed=seed)
    plan = plan_search(jobs, net)
    assert plan.method == "search"
    assert_valid(plan, net, jobs)


def test_best_placement_estimate_is_the_cost_model():
    net = generate_network(40, seed=5)
    for job in generate_jobs(3, seed=5):
        placement, est = best_placement(job, range(net.n), net)
        assert problems(placement, net) == []
        assert est == estimate(placement, net)


def test_best_placement_uses_all_levers_on_a_two_city_fleet():
    # Two cities of 4 A100 servers, 100 ms apart: a 13B model (208 GB of state) fits one city, so
    # the best plan keeps every ring and chain inside one city.
    nodes = [Node(id=f"n{i}", city="east" if i < 4 else "west", gpus=8,
                  compute_capability=8.0, memory_gb=320.0) for i in range(8)]
    city = np.array([0] * 4 + [1] * 4)
    rtt = np.where(city[:, None] == city[None, :], 1.0, 100.0)
    net = Network.from_matrix(nodes, rtt)
    job = catalog_job("gpt3-13b")
    placement, est = best_placement(job, range(8), net)
    used = set(placement.nodes)
    assert used <= set(range(4)) or used <= set(range(4, 8))
    # ...and it beats the naive pipeline over all eight nodes, one stage each.
    from planner.core.costmodel import Placement, Stage
    per = job.layers // 8
    naive = Placement(job, tuple(Stage(k * per, (k + 1) * per if k < 7 else job.layers, (k,))
                                 for k in range(8)), job.micro_batch)
    assert est.iteration_s < estimate(naive, net).iteration_s


def test_best_placement_raises_when_the_group_is_too_small():
    net = generate_network(10, seed=2)
    with pytest.raises(PlanningError):
        best_placement(catalog_job("bloom-176b"), [0], net)


@pytest.mark.slow
def test_same_inputs_same_plan():
    net = generate_network(80, seed=7)
    jobs = generate_jobs(5, seed=7)
    a = plan_search(jobs, net)
    b = plan_search(jobs, net)
    assert same_plan(a, b)


def test_progress_is_reported_up_to_the_total():
    net = generate_network(30, seed=4)
    jobs = generate_jobs(3, seed=4)
    seen = []
    plan_search(jobs, net, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1]
    assert all(0 <= d <= t for d, t in seen)


def test_split_fleet_places_each_group_inside_one_component():
    net = generate_network(40, seed=9)
    rtt = net.rtt_ms.copy()
    rtt[:20, 20:] = np.inf
    rtt[20:, :20] = np.inf
    split = Network.from_matrix(net.nodes, rtt)
    jobs = generate_jobs(4, seed=9)
    plan = plan_search(jobs, split)
    assert_valid(plan, split, jobs)
    for p in plan.placements:
        nodes = np.array(p.nodes)
        assert (nodes < 20).all() or (nodes >= 20).all(), p.job.name


def test_a_job_larger_than_any_component_is_a_planning_error():
    nodes = [Node(id=f"n{i}", gpus=8, compute_capability=8.0, memory_gb=80.0) for i in range(4)]
    rtt = np.full((4, 4), np.inf)
    rtt[:2, :2] = rtt[2:, 2:] = 1.0
    net = Network.from_matrix(nodes, rtt)
    job = Job(name="wide", params=15e9, layers=8, hidden=1024, seq_len=512, global_batch=64)
    with pytest.raises(PlanningError, match="wide"):
        plan_search([job], net)


@pytest.mark.slow
def test_initial_grouping_is_refined_not_ignored():
    net = generate_network(50, seed=11)
    jobs = generate_jobs(3, seed=11)
    scores = np.zeros((net.n, len(jobs) + 1))
    scores[:, 0] = 1.0                       # everything to job 0: others must be merged/wait
    grouping = alg1.algorithm1(jobs, net, scores)
    plan = plan_search(jobs, net, initial=grouping)
    assert_valid(plan, net, jobs)
    plan_scores = plan_search(jobs, net, initial=scores)
    assert_valid(plan_scores, net, jobs)


def test_clusters_join_same_city_and_low_rtt():
    rtt = np.array([[0, 20, 3, 50], [20, 0, 40, 50], [3, 40, 0, 50], [50, 50, 50, 0]], float)
    labels = cluster_labels(rtt, 8.0, ["a", "b", None, "b"])
    assert labels[0] == labels[2]             # 3 ms apart
    assert labels[1] == labels[3]             # same city, though 50 ms apart
    assert labels[0] != labels[1]


@pytest.mark.slow   # a full DT-FM evolution and search per seed
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_search_beats_or_equals_the_dtfm_peer(seed):
    net = generate_network(40, seed=seed)
    jobs = generate_jobs(3, seed=seed)
    ours = estimate_plan(plan_search(jobs, net).placements, net).makespan_s
    peer_plan = plan_dtfm(jobs, net, seed=0, generations=15)
    peer = estimate_plan(peer_plan.placements, net).makespan_s
    assert ours <= peer * (1 + 1e-9)


@pytest.mark.slow   # plans the paper's fleet
def test_paper_fleet_six_jobs(paper_fleet_dir, shared_dir):
    from planner.core.costmodel import compute_bound_s
    from planner.core.fleet import complete
    from planner.files.fleet import load_fleet
    from planner.files.jobs import load_jobs

    net = complete(load_fleet(paper_fleet_dir))
    jobs = load_jobs(shared_dir / "bench" / "paper-6-jobs.yaml")
    plan = plan_search(jobs, net)
    assert_valid(plan, net, jobs)
    ours = estimate_plan(plan.placements, net).makespan_s
    assert ours >= compute_bound_s(jobs, net)
    peer = estimate_plan(plan_dtfm(jobs, net, seed=0, generations=10).placements, net).makespan_s
    assert ours < peer


def test_heuristic_scores_give_every_job_a_group_that_fits():
    net = generate_network(120, seed=13)
    jobs = generate_jobs(6, seed=13)
    scores = heuristic_scores(jobs, net)
    assert scores.shape == (net.n, len(jobs) + 1)
    owner = scores.argmax(axis=1)
    for j, job in enumerate(jobs):
        assert alg1.fits(job, net, np.flatnonzero(owner == j)), job.name


def test_trimming_drops_slow_stage_groups_when_that_is_faster():
    # Four rows of two servers in one city: H100, H100, A100, T4. For a 1B model the pipeline
    # hops and all-reduces of extra stages cost more than the slower rows add, so keeping only
    # the fastest row beats the whole grid (which the untrimmed evaluation keeps).
    kinds = [("NVIDIA H100 80GB HBM3", 8, 640.0)] * 2 + [("NVIDIA A100-SXM4-40GB", 8, 320.0),
                                                        ("Tesla T4", 4, 64.0)]
    specs = [k for k in kinds for _ in range(2)]
    nodes = [Node(id=f"n{i}", city="here", gpus=g, gpu_name=name, memory_gb=mem)
             for i, (name, g, mem) in enumerate(specs)]
    net = Network.from_matrix(nodes, np.ones((8, 8)))
    job = Job("small", params=1.0e9, layers=24, hidden=2048, seq_len=1024, global_batch=512,
              micro_batch=1, steps=10)
    grid = np.arange(8).reshape(4, 2)
    plain, plain_est = evaluate_grid(job, net, grid, 1)
    trimmed, trimmed_est = evaluate_grid(job, net, grid, 1, trim=True)
    assert plain is not None and trimmed is not None
    assert trimmed_est.iteration_s < plain_est.iteration_s * 0.9
    assert not {6, 7} & set(trimmed.nodes)
    assert problems(trimmed, net) == []
    assert trimmed_est == estimate(trimmed, net)


def test_the_bottleneck_job_moves_to_a_larger_idle_city():
    # The starting grouping puts the only job on a 2-server city; an idle city of 8 identical
    # servers 100 ms away lets it run 4x as many data-parallel replicas over cheap rings.
    nodes = [Node(id=f"n{i}", city="small" if i < 2 else "big", gpus=8,
                  compute_capability=8.0, memory_gb=320.0) for i in range(10)]
    city = np.array([0] * 2 + [1] * 8)
    net = Network.from_matrix(nodes, np.where(city[:, None] == city[None, :], 1.0, 100.0))
    job = Job("compute-heavy", params=1.0e9, layers=24, hidden=2048, seq_len=2048,
              global_batch=4096, micro_batch=8, steps=10)
    start = alg1.Grouping({job.name: (0, 1)}, {job.name: 0})
    _, on_small = best_placement(job, [0, 1], net)
    # The grow step on its own (the bottleneck job migrates to the larger idle cluster)...
    run = SearchRun([job], net)
    states = {job.name: run.state(job, np.array([0, 1]))}
    assert grow_bottleneck(run, states)
    grown = states[job.name]
    assert grown.est.job_s < on_small.job_s * 0.9
    assert set(grown.placement.nodes) <= set(range(2, 10))
    assert grown.est == estimate(grown.placement, net)
    # ...and the whole planner from that starting grouping.
    plan = plan_search([job], net, initial=start)
    assert_valid(plan, net, [job])
    assert estimate(plan.placements[0], net).job_s <= grown.est.job_s * (1 + 1e-9)
