"""bench.portfolio_bench's baseline: the search without stage ordering, and the switch restored."""

from __future__ import annotations

import pytest

from bench.portfolio_bench import Fleet, load, measure
from hulk.errors import PlanningError
from planner.search import chain, groups


def test_the_baseline_is_the_search_without_stage_order_and_the_switch_comes_back(shared_dir):
    # The 90-server real-region fleet with the paper's 4 jobs: opt-175b's 6 servers in an
    # order with a slow WAN hop (before) against the order the 2-opt finds (now).
    jobs, net = load(Fleet("regions", "regions", 90, 45, "paper-4", 1), shared_dir)
    before = measure("search", jobs, net, stage_order=False)
    assert groups.STAGE_ORDER is True and chain.CHAINS is True
    now = measure("search", jobs, net)
    assert before["complete"] and now["complete"]
    assert now["makespan_s"] < before["makespan_s"] * 0.8


def test_the_switch_comes_back_when_planning_fails(shared_dir):
    jobs, net = load(Fleet("regions", "regions", 90, 45, "paper-4", 1), shared_dir)
    with pytest.raises(PlanningError):   # two jobs of the same name
        measure("search", jobs + jobs[:1], net, stage_order=False)
    assert groups.STAGE_ORDER is True and chain.CHAINS is True
