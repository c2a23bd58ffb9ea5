"""Algorithm 1 (planner.search.algorithm1): thresholds, merging, waiting, the never-fits error."""

from __future__ import annotations

import numpy as np
import pytest

from hulk.errors import PlanningError
from planner.search import algorithm1 as alg1
from planner.core.fleet import Network, Node
from planner.core.jobs import Job


def _net(mem_gb: list[float], city_of: list[int], cross_rtt: float = 50.0) -> Network:
    nodes = [Node(id=f"n{i}", city=f"c{c}", gpus=8, compute_capability=8.0, memory_gb=m)
             for i, (m, c) in enumerate(zip(mem_gb, city_of))]
    city = np.array(city_of)
    rtt = np.where(city[:, None] == city[None, :], 1.0, cross_rtt)
    return Network.from_matrix(nodes, rtt)


def _job(name: str, params: float, layers: int = 8) -> Job:
    return Job(name=name, params=params, layers=layers, hidden=1024, seq_len=512,
               global_batch=64, micro_batch=1, steps=10)


def _scores(n: int, owner: list[int], num_jobs: int) -> np.ndarray:
    """One-hot scores: node i belongs to class owner[i] (num_jobs = idle)."""
    s = np.zeros((n, num_jobs + 1))
    s[np.arange(n), owner] = 1.0
    return s


def test_memory_threshold_is_one_replica_of_the_model_plus_activations():
    job = _job("a", 1e9, layers=8)
    k = 4
    m = job.global_batch // job.micro_batch
    expected = 16 * 1e9 + job.activation_bytes() * 8 * min(m, k)
    assert alg1.memory_threshold(job, k) == pytest.approx(expected)


def test_groups_that_fit_are_kept_as_scored():
    net = _net([100.0] * 6, [0] * 6)
    jobs = [_job("a", 1e9), _job("b", 1e9)]           # 16 GB each: one node holds either
    g = alg1.algorithm1(jobs, net, _scores(6, [0, 0, 0, 1, 1, 1], 2))
    assert g.groups == {"a": (0, 1, 2), "b": (3, 4, 5)}
    assert g.phase == {"a": 0, "b": 0}


def test_a_group_short_of_memory_takes_idle_nodes_first():
    net = _net([100.0] * 6, [0] * 6)
    jobs = [_job("big", 20e9), _job("small", 1e9)]    # big needs 320 GB + activations: 4 nodes
    g = alg1.algorithm1(jobs, net, _scores(6, [0, 0, 2, 2, 2, 1], 2))
    assert alg1.fits(jobs[0], net, g.groups["big"])
    assert g.groups["small"] == (5,)
    assert set(g.groups["big"]).isdisjoint(g.groups["small"])
    assert g.phase == {"big": 0, "small": 0}


def test_merge_path_takes_the_next_group_and_that_job_waits():
    net = _net([100.0] * 6, [0] * 6)
    jobs = [_job("big", 20e9), _job("small", 1e9)]
    # big scored 2 nodes, small 4 nodes, no idle nodes: big must merge small's group.
    g = alg1.algorithm1(jobs, net, _scores(6, [0, 0, 1, 1, 1, 1], 2))
    assert alg1.fits(jobs[0], net, g.groups["big"])
    assert g.phase["big"] == 0
    assert any("merged the group of small" in note for note in g.notes)
    # small lost its nodes to big and no node is idle: it waits for phase 1 (whole fleet again).
    assert g.phase["small"] == 1
    assert alg1.fits(jobs[1], net, g.groups["small"])


def test_wait_path_two_jobs_that_cannot_run_together():
    net = _net([100.0] * 6, [0] * 6)
    jobs = [_job("a", 20e9), _job("b", 20e9)]         # each needs 4 of the 6 nodes (2 layers each)
    g = alg1.algorithm1(jobs, net, _scores(6, [0, 0, 0, 1, 1, 1], 2))
    assert sorted(g.phase.values()) == [0, 1]
    for job in jobs:
        assert alg1.fits(job, net, g.groups[job.name])


def test_never_fits_raises_planning_error_naming_the_job():
    net = _net([100.0] * 4, [0] * 4)
    jobs = [_job("huge", 100e9)]                      # 1.6 TB on a 400 GB fleet
    with pytest.raises(PlanningError, match="huge"):
        alg1.algorithm1(jobs, net, _scores(4, [0, 0, 0, 0], 1))


def test_never_fits_counts_only_one_connected_component():
    nodes = [Node(id=f"n{i}", gpus=8, compute_capability=8.0, memory_gb=100.0) for i in range(4)]
    rtt = np.full((4, 4), np.inf)
    rtt[:2, :2] = rtt[2:, 2:] = 1.0
    net = Network.from_matrix(nodes, rtt)
    job = _job("split", 15e9)                         # 240 GB: fits 4 nodes, not 2
    with pytest.raises(PlanningError, match="split"):
        alg1.algorithm1([job], net, _scores(4, [0, 0, 0, 0], 1))


def test_groups_stay_inside_one_component():
    nodes = [Node(id=f"n{i}", gpus=8, compute_capability=8.0, memory_gb=100.0) for i in range(8)]
    rtt = np.full((8, 8), np.inf)
    rtt[:4, :4] = rtt[4:, 4:] = 1.0
    net = Network.from_matrix(nodes, rtt)
    jobs = [_job("a", 10e9), _job("b", 1e9)]
    # a is scored across both components; it must end up in one.
    g = alg1.algorithm1(jobs, net, _scores(8, [0, 0, 0, 1, 0, 0, 2, 2], 2))
    comp = alg1.component_labels(net)
    for name, members in g.groups.items():
        assert len({comp[i] for i in members}) == 1, name


def test_scores_shape_is_checked():
    net = _net([100.0] * 3, [0] * 3)
    with pytest.raises(ValueError):
        alg1.algorithm1([_job("a", 1e9)], net, np.zeros((3, 5)))
