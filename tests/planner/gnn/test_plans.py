"""GNN plans are valid plans: every fixture, both methods."""

import numpy as np
import pytest

from planner.core.costmodel import estimate_plan, problems
from planner.core.fleet import complete
from planner.core.generate import generate_fleet, generate_jobs
from planner.files.fleet import load_fleet
from planner.gnn.infer import plan_gnn
from planner.files.jobs import load_jobs


def assert_valid(plan, jobs, net):
    assert {p.job.name for p in plan.placements} | {u.name for u in plan.unplaced} == \
        {j.name for j in jobs}
    for p in plan.placements:
        assert problems(p, net) == [], problems(p, net)
    by_phase = {}
    for p in plan.placements:
        used = by_phase.setdefault(p.phase, [])
        used.extend(p.nodes)
    for phase, used in by_phase.items():
        assert len(used) == len(set(used)), f"phase {phase} reuses a node"
    assert np.isfinite(estimate_plan(plan.placements, net).makespan_s)


@pytest.mark.parametrize("method_refine", [("gnn", True), ("gnn-raw", False)])
@pytest.mark.parametrize("n,k,seed", [(8, 2, 1), (24, 4, 2),
                                     pytest.param(60, 6, 3, marks=pytest.mark.slow)])
def test_generated_fleets(shipped_checkpoint, method_refine, n, k, seed):
    method, refine = method_refine
    net = complete(generate_fleet(n, seed=seed))
    jobs = generate_jobs(k, seed=seed + 100, max_params=net.mem.sum() / 48)
    plan = plan_gnn(jobs, net, checkpoint=shipped_checkpoint, refine=refine)
    assert plan.method == method
    assert_valid(plan, jobs, net)


@pytest.mark.slow   # plans the paper's fleet
@pytest.mark.parametrize("jobs_file", ["paper-4-jobs.yaml", "paper-6-jobs.yaml"])
@pytest.mark.parametrize("refine", [True, False])
def test_paper_fleet(shipped_checkpoint, paper_fleet_dir, shared_dir, jobs_file, refine):
    net = complete(load_fleet(paper_fleet_dir))
    jobs = load_jobs(shared_dir / "bench" / jobs_file)
    plan = plan_gnn(jobs, net, checkpoint=shipped_checkpoint, refine=refine)
    assert_valid(plan, jobs, net)


def test_more_than_eight_jobs_are_all_scored_and_planned(shipped_checkpoint):
    from planner.gnn.infer import load_cached, node_scores

    net = complete(generate_fleet(80, seed=9))
    jobs = generate_jobs(10, seed=10, max_params=net.mem.sum() / 60)
    scores = node_scores(jobs, net, load_cached(shipped_checkpoint))
    assert scores.shape == (80, 11)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)
    assert (scores[:, 8:10] > 0).all()          # jobs 9 and 10 are scored like the others
    plan = plan_gnn(jobs, net, checkpoint=shipped_checkpoint, refine=False)
    assert plan.method == "gnn-raw"
    assert_valid(plan, jobs, net)
