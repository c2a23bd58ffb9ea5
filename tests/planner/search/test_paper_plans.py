"""Every available method on the paper's fleet (../shared/data/hulk-upstream): plans are valid."""

from __future__ import annotations

import pytest

from hulk.errors import HulkError, InputError
from planner.methods import METHODS, planner_for
from planner.core.costmodel import estimate, problems
from planner.core.fleet import complete
from planner.files.jobs import load_jobs
from planner.core.evaluate import evaluate
from planner.files.plan import parse_plan, plan_to_json

pytestmark = pytest.mark.slow   # plans the paper's fleet with every method


@pytest.fixture(scope="module")
def paper(paper_fleet_dir, shared_dir):
    from planner.files.fleet import load_fleet

    net = complete(load_fleet(paper_fleet_dir))
    jobs = load_jobs(shared_dir / "bench" / "paper-6-jobs.yaml")
    return net, jobs


@pytest.fixture(scope="module")
def plans(paper):
    net, jobs = paper
    out = {}
    for method in METHODS:
        try:
            # workers=1: the portfolio refines its starts in this process (no worker processes)
            out[method] = planner_for(method)(jobs, net, seed=0, workers=1)
        except InputError as exc:    # module not built in this checkout
            out[method] = exc
        except HulkError as exc:      # e.g. the GNN without a trained checkpoint
            out[method] = exc
    return out


@pytest.mark.parametrize("method", list(METHODS))
def test_plan_is_valid(paper, plans, method):
    net, jobs = paper
    plan = plans[method]
    if isinstance(plan, Exception):
        pytest.skip(f"{method}: {plan}")
    names = {p.job.name for p in plan.placements} | set(plan.job_s_override)
    unplaced = {u.name for u in plan.unplaced}
    assert names | unplaced == {j.name for j in jobs} and not names & unplaced
    for p in plan.placements:
        assert problems(p, net) == [], method
        assert estimate(p, net).feasible
    by_phase: dict[int, set[int]] = {}
    for p in plan.placements:
        used = by_phase.setdefault(p.phase, set())
        assert not used & set(p.nodes), f"{method}: nodes shared within phase {p.phase}"
        used |= set(p.nodes)
    report = evaluate(plan, net)
    if plan.placements and not plan.job_s_override:
        doc = plan_to_json(plan, net, report)
        parsed = parse_plan(doc, method, net.ids)
        for jd, p in zip(parsed.jobs, parsed.placements(jobs, net)):
            assert jd.estimate["job_s"] == pytest.approx(estimate(p, net).job_s, rel=1e-9, abs=5e-7)
    if method in ("portfolio", "search", "dtfm", "gnn", "gnn-raw"):
        assert not plan.unplaced, f"{method} left jobs unplaced: {plan.unplaced}"
        assert report.makespan_s < float("inf")


def test_system_a_cannot_place_opt_175b(plans):
    plan = plans["system-a"]
    assert [u.name for u in plan.unplaced] == ["opt-175b"]


def test_the_portfolio_is_not_worse_than_the_search_on_the_paper_fleet(paper, plans):
    net, _ = paper
    if isinstance(plans["portfolio"], Exception):
        pytest.fail(f"portfolio: {plans['portfolio']}")
    assert (evaluate(plans["portfolio"], net).makespan_s
            <= evaluate(plans["search"], net).makespan_s * (1 + 1e-12))
