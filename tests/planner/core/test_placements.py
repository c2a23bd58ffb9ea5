"""Plan -> per-node hulk-placement/1 messages and the plan summary, and back through the parsers.

The parsers' own rejections are tested in tests/hulk/test_wire_placement.py."""

from __future__ import annotations

import json

from hulk.wire.placement import PLACEMENT_FORMAT, parse_placement, parse_summary
from planner.core.placements import (build_node_placements, build_summary, job_ports,
                                     plan_from_summary)
from planner.core.plan import Unplaced
from tests.helpers.plans import manual_plan, two_city_net


def test_every_node_of_a_job_gets_its_role_rank_and_the_rank0_rendezvous():
    net = two_city_net()
    placements = build_node_placements(manual_plan(net), net, fleet="lab", plan_id="p1",
                                       addresses={"n0": "10.0.0.1", "n4": "10.0.0.5"})
    assert sorted(placements) == ["n0", "n1", "n2", "n3", "n4"]       # n5 has no role
    roles = {node: p.roles[0] for node, p in placements.items()}
    # rank = stage * replicas + replica; world = stages * replicas
    assert [(roles[n].stage, roles[n].replica, roles[n].rank) for n in ["n0", "n1", "n2", "n3"]] == \
        [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    assert {roles[n].world_size for n in ["n0", "n1", "n2", "n3"]} == {4}
    assert (roles["n2"].layer_lo, roles["n2"].layer_hi) == (20, 48)
    assert {roles[n].rendezvous_address for n in ["n0", "n1", "n2", "n3"]} == {"10.0.0.1"}
    assert roles["n4"].rendezvous_address == "10.0.0.5" and roles["n4"].world_size == 1
    assert roles["n0"].rendezvous_port != roles["n4"].rendezvous_port
    assert roles["n0"].command == ("python", "train.py", "--steps", "3") and roles["n4"].command is None
    assert roles["n0"].micro_batch == 2 and roles["n0"].num_stages == 2 and roles["n0"].num_replicas == 2


def test_node_without_address_is_addressed_by_its_id():
    net = two_city_net()
    placements = build_node_placements(manual_plan(net), net, fleet="lab", plan_id="p1")
    assert placements["n3"].roles[0].rendezvous_address == "n0"


def test_ports_depend_on_the_set_of_job_names_only():
    assert job_ports(["b", "a"], 30000) == {"a": 30000, "b": 30001}
    assert job_ports(["a", "b", "b"], 30000) == job_ports(["b", "a"], 30000)


def test_message_round_trips_through_the_parser():
    net = two_city_net()
    for placement in build_node_placements(manual_plan(net), net, fleet="lab", plan_id="p1").values():
        doc = json.loads(placement.to_bytes())
        assert doc["format"] == PLACEMENT_FORMAT
        assert doc["roles"][0]["nnodes"] == doc["roles"][0]["world_size"]
        assert parse_placement(placement.to_bytes()) == placement


def test_summary_lists_jobs_by_node_id_and_rebuilds_the_plan():
    net = two_city_net()
    plan = manual_plan(net)
    plan.unplaced.append(Unplaced("c", "does not fit"))
    placements = build_node_placements(plan, net, fleet="lab", plan_id="p1")
    doc = build_summary(plan, net, fleet="lab", plan_id="p1", issued_at_ms=5, node_placements=placements)
    assert doc["nodes"]["n4"] == ["b"] and "n5" not in doc["nodes"]
    assert doc["jobs"][0]["stages"][1]["nodes"] == ["n2", "n3"]
    summary = parse_summary(json.dumps(doc))
    rebuilt, plan_ids, missing = plan_from_summary(summary, net)
    assert missing == [] and plan_ids == {"a": "p1", "b": "p1"}
    assert [(p.job, p.stages, p.micro_batch) for p in rebuilt.placements] == \
        [(p.job, p.stages, p.micro_batch) for p in plan.placements]
    smaller = two_city_net(ids=["n0", "n1", "n2", "x3", "n4", "n5"])
    _, _, missing = plan_from_summary(summary, smaller)
    assert missing == ["a"]
