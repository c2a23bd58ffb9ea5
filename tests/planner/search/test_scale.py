"""Planning on the best sites of a fleet larger than the search's node limit."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.costmodel import problems
from planner.core.fleet import complete
from planner.core.generate import generate_regional_fleet
from planner.core.jobs import catalog_job
from planner.search import plan_search
from planner.search.scale import candidate_nodes, plan_at_scale, site_numbers


def test_small_fleets_are_planned_whole_and_large_ones_on_whole_sites():
    net = complete(generate_regional_fleet(90, 6, seed=7))
    assert np.array_equal(candidate_nodes(net, limit=90), np.arange(90))
    keep = candidate_nodes(net, limit=40)
    site = site_numbers(net)
    assert len(keep) == 40 and np.all(np.diff(keep) > 0)
    totals = {s: net.thr[site == s].sum() for s in set(site.tolist())}
    kept_sites = set(site[keep].tolist())
    # Every kept site but the last (cut to its fastest servers) is kept whole, best first.
    whole = [s for s in kept_sites if (site[keep] == s).sum() == (site == s).sum()]
    assert len(whole) >= len(kept_sites) - 1
    assert min(totals[s] for s in whole) >= max(totals[s] for s in set(totals) - kept_sites)

    jobs = [catalog_job("gpt2-xl", name="a"), catalog_job("bert-large", name="b")]
    plan = plan_at_scale(plan_search, jobs, net, limit=40)
    used = {i for p in plan.placements for i in p.nodes}
    assert used and used <= set(keep.tolist())
    assert not [m for p in plan.placements for m in problems(p, net)]
    assert any("planned on the 40 servers" in note for note in plan.notes)


def test_view_sizes_grow_geometrically_to_the_whole_fleet():
    from planner.search.scale import view_sizes

    assert view_sizes(900, 1500, 3) == [900]
    assert view_sizes(10_000, 1500, 1) == [1500]
    assert view_sizes(10_000, 1500, 3) == [1500, 3873, 10_000]
    assert view_sizes(1501, 1500, 3) == [1500, 1501]


@pytest.mark.slow   # plans every view of a large fleet
def test_the_best_view_wins_by_the_cost_model():
    from planner.core.costmodel import estimate_plan
    from planner.core.generate import generate_jobs

    # A fleet whose views give three different makespans (the smallest view beats the middle).
    net = complete(generate_regional_fleet(100, 8, seed=6))
    jobs = generate_jobs(4, seed=6)
    alone = [plan_at_scale(plan_search, jobs, net, limit=size) for size in (25, 50)]
    spans = [estimate_plan(p.placements, net).makespan_s for p in alone + [plan_search(jobs, net)]]
    assert len(set(spans)) == 3
    best = plan_at_scale(plan_search, jobs, net, limit=25, views=3)
    assert estimate_plan(best.placements, net).makespan_s == min(spans)
    assert any("best of views of 25, 50, 100 servers" in note for note in best.notes)
    assert not [m for p in best.placements for m in problems(p, net)]
