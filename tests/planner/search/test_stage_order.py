"""The pipeline order of a placement's stage groups (arrangement.order_rows, groups.reorder_stages)."""

from __future__ import annotations

import itertools

import numpy as np

from planner.core.costmodel import estimate, problems
from planner.core.fleet import Network, Node
from planner.core.jobs import Job
from planner.search import best_placement
from planner.search.arrangement import order_rows
from planner.search.groups import evaluate_grid, reorder_stages


def line_fleet(n: int) -> Network:
    """``n`` single servers in ``n`` cities on a line, 15 ms apart: neighbours are the cheap hops."""
    nodes = [Node(id=f"n{i}", city=f"c{i}", gpus=8, compute_capability=8.0, memory_gb=320.0)
             for i in range(n)]
    pos = np.arange(n, dtype=float)
    rtt = 1.0 + 15.0 * np.abs(pos[:, None] - pos[None, :])
    return Network.from_matrix(nodes, rtt)


JOB = Job("deep", params=20e9, layers=48, hidden=6144, seq_len=2048, global_batch=1024,
          micro_batch=4, steps=100)


def test_a_scrambled_pipeline_is_put_in_line_order():
    net = line_fleet(6)
    grid = np.array([0, 3, 1, 4, 2, 5])[:, None]   # every hop 15-45 ms
    ordered = order_rows(net, grid, JOB.activation_bytes(4))
    assert ordered is not None
    assert sorted(ordered.ravel().tolist()) == list(range(6))   # the same stage groups
    assert np.abs(np.diff(ordered.ravel())).max() == 1          # only neighbouring cities


def test_reordered_placement_is_the_best_order_by_the_cost_model():
    # The best of all 720 orders, judged by the cost model, is what reorder_stages reaches.
    net = line_fleet(6)
    grid = np.array([0, 3, 1, 4, 2, 5])[:, None]
    p, e = evaluate_grid(JOB, net, grid, 4)
    assert p is not None
    better, better_est = reorder_stages(JOB, net, p, e)
    assert better_est.iteration_s < e.iteration_s * 0.8
    assert better_est == estimate(better, net) and problems(better, net) == []
    brute = min(evaluate_grid(JOB, net, np.array(perm)[:, None], 4)[1].iteration_s
                for perm in itertools.permutations(range(6)))
    assert better_est.iteration_s <= brute * (1 + 1e-9)


def test_reordering_never_makes_a_placement_slower():
    rng = np.random.default_rng(7)   # fixed seed: the same fleets in CI
    for _ in range(20):
        n = 7
        nodes = [Node(id=f"n{i}", city=f"c{i}", gpus=int(rng.integers(1, 9)),
                      compute_capability=8.0, memory_gb=float(rng.choice([80.0, 160.0, 320.0])))
                 for i in range(n)]
        xy = rng.random((n, 2)) * 100.0
        rtt = 1.0 + np.linalg.norm(xy[:, None] - xy[None, :], axis=2)
        net = Network.from_matrix(nodes, rtt)
        grid = rng.permutation(n)[:, None]
        p, e = evaluate_grid(JOB, net, grid, 2)
        if p is None:
            continue
        q, f = reorder_stages(JOB, net, p, e)
        assert f.iteration_s <= e.iteration_s
        assert set(q.nodes) <= set(p.nodes)   # the same stage groups (or fewer)
        assert problems(q, net) == []


def test_a_solved_group_has_no_order_that_is_faster_by_a_simple_reversal():
    # best_placement orders its stages: on the scrambled line no single segment reversal of
    # its answer is faster by the cost model.
    net = line_fleet(6)
    p, e = best_placement(JOB, [0, 3, 1, 4, 2, 5], net)
    grid = p.node_matrix()
    k = grid.shape[0]
    for i, j in itertools.combinations(range(k + 1), 2):
        trial = grid.copy()
        trial[i:j] = trial[i:j][::-1]
        _, f = evaluate_grid(JOB, net, trial, p.micro_batch)
        assert f.iteration_s >= e.iteration_s * (1 - 1e-9)


def test_short_pipelines_are_left_alone():
    net = line_fleet(3)
    assert order_rows(net, np.array([[0], [2]]), JOB.activation_bytes(4)) is None
    assert order_rows(net, np.array([[0], [1], [2]]), JOB.activation_bytes(4)) is None
