"""The completed Network's per-node arrays, and nodes that cannot compute."""

from __future__ import annotations

import pytest

from planner.baselines.dtfm import plan_dtfm
from planner.baselines.systems import plan_system_b
from planner.core.jobs import catalog_job
from planner.search import plan_search
from tests.helpers.plans import make_net

RTT = [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]


def test_a_node_without_gpus_holds_no_memory():
    net = make_net([("A100-SXM4-80GB", 8, 640), ("A100-SXM4-80GB", 0, 640), ("x", 8, 320)], RTT)
    assert net.thr[1] == 0.0
    assert net.mem[1] == 0.0                 # listed memory, but nothing to compute with
    assert net.mem[0] == 640e9 and net.mem[2] == 320e9


@pytest.mark.timeout(60)  # it used to loop forever on a NaN stage share
@pytest.mark.parametrize("planner", [plan_search, plan_dtfm, plan_system_b])
def test_planners_finish_and_never_use_a_node_without_gpus(planner):
    net = make_net([("A100-SXM4-80GB", 8, 640), ("A100-SXM4-80GB", 0, 640),
                    ("A100-SXM4-80GB", 8, 640)], RTT)
    plan = planner([catalog_job("gpt2-xl", name="a", steps=10)], net)
    assert plan.placements, plan.unplaced
    for placement in plan.placements:
        assert 1 not in placement.nodes
