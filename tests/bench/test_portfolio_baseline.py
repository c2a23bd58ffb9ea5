"""bench.portfolio_bench's baseline: the search without stage ordering and chains, asked for with
options (planner.search.options), so it changes nothing for the runs after it."""

from __future__ import annotations

import pytest

from bench.portfolio_bench import Fleet, load, measure


@pytest.mark.slow   # plans the paper's jobs on a 90-server fleet, three ways
def test_the_baseline_is_the_search_without_stage_order_and_leaves_the_default_alone(shared_dir):
    # The 90-server real-region fleet with the paper's 4 jobs: opt-175b's 6 servers in an
    # order with a slow WAN hop (before) against the order the 2-opt finds (now).
    jobs, net = load(Fleet("regions", "regions", 90, 45, "paper-4", 1), shared_dir)
    now = measure("search", jobs, net)
    before = measure("search", jobs, net, stage_order=False)
    again = measure("search", jobs, net)
    assert before["complete"] and now["complete"]
    assert now["makespan_s"] < before["makespan_s"] * 0.8
    assert again["makespan_s"] == now["makespan_s"]   # the baseline run left no setting behind
    assert not now["cut_short"] and not before["cut_short"]


def test_the_baseline_is_the_plain_search_only(shared_dir):
    jobs, net = load(Fleet("regions", "regions", 90, 45, "paper-4", 1), shared_dir)
    with pytest.raises(ValueError):
        measure("portfolio", jobs, net, stage_order=False)
