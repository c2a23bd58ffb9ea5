"""The placement GNN only adds a start: `plan --method gnn` and serve's planner run every
built-in start of the portfolio as they would without it, so the plan with the GNN's start is
never longer than the plan without it."""

import numpy as np
import pytest

from planner.core.costmodel import estimate_plan
from planner.core.fleet import complete
from planner.core.generate import generate_fleet, generate_jobs
from planner.methods import METHODS, planner_for


def _instance(n: int, k: int, seed: int):
    net = complete(generate_fleet(n, seed=seed, n_cities=3))
    jobs = generate_jobs(k, seed=seed, max_params=float(net.mem.sum()) / 16 / 3)
    return jobs, net


def _makespan(plan, net) -> float:
    return estimate_plan(plan.placements, net).makespan_s


def test_plan_offers_no_method_where_the_gnn_replaces_the_search():
    assert "gnn-raw" not in METHODS
    assert METHODS["gnn"].module == "planner.gnn.starts"
    assert planner_for("gnn-raw") is not None   # still there for the benchmarks


@pytest.mark.parametrize("n,k,seed", [(10, 2, 1), (16, 3, 5),
                                     pytest.param(30, 4, 7, marks=pytest.mark.slow)])
def test_the_shipped_gnns_start_never_lengthens_the_portfolios_plan(shipped_checkpoint, n, k,
                                                                    seed):
    jobs, net = _instance(n, k, seed)
    without = planner_for("portfolio")(jobs, net, seed=0, workers=1)
    with_gnn = planner_for("gnn")(jobs, net, seed=0, workers=1, checkpoint=shipped_checkpoint)
    assert with_gnn.method == "gnn" and not with_gnn.unplaced
    assert _makespan(with_gnn, net) <= _makespan(without, net)


def test_a_useless_checkpoint_gives_the_portfolios_plan(tmp_path):
    jobs, net = _instance(10, 2, 1)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    without = planner_for("portfolio")(jobs, net, seed=0, workers=1)
    with_gnn = planner_for("gnn")(jobs, net, seed=0, workers=1, checkpoint=broken)
    assert _makespan(with_gnn, net) == _makespan(without, net)
    assert np.isfinite(_makespan(with_gnn, net))
