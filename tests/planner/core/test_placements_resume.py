"""Roles built from a plan carry the plan's micro-batch count, the job's checkpoint_dir and the
restart count the caller gives (planner/core/placements.py)."""

from __future__ import annotations

import json
from dataclasses import replace

from hulk.wire.placement import parse_placement, parse_summary
from planner.core.costmodel import Placement, micro_batches
from planner.core.placements import build_node_placements, build_summary, plan_from_summary
from planner.core.plan import Plan
from tests.helpers.plans import manual_plan, two_city_net


def with_checkpoint_dir(plan: Plan, job: str, path: str) -> Plan:
    return Plan(plan.method, [replace(p, job=replace(p.job, checkpoint_dir=path)) if p.job.name == job
                              else p for p in plan.placements])


def test_roles_carry_micro_batches_checkpoint_dir_and_restart_count():
    net = two_city_net()
    plan = with_checkpoint_dir(manual_plan(net), "a", "/data/ckpt/a")
    placements = build_node_placements(plan, net, fleet="lab", plan_id="p1", restart_counts={"a": 2})
    a: Placement = plan.placements[0]
    m = micro_batches(a.job, a.replicas, a.micro_batch)           # ceil(512 / 2 / 2) = 128
    assert m == 128
    for node in ("n0", "n1", "n2", "n3"):
        role = placements[node].roles[0]
        assert (role.micro_batches, role.checkpoint_dir, role.restart_count) == (m, "/data/ckpt/a", 2)
        assert parse_placement(placements[node].to_bytes()) == placements[node]
    b = placements["n4"].roles[0]                                 # no checkpoint_dir, not restarted
    assert (b.micro_batches, b.checkpoint_dir, b.restart_count) == (256 // 8, None, 0)


def test_the_summary_keeps_checkpoint_dir_so_recovery_rebuilds_it():
    net = two_city_net()
    plan = with_checkpoint_dir(manual_plan(net), "a", "ckpt")
    placements = build_node_placements(plan, net, fleet="lab", plan_id="p1")
    doc = build_summary(plan, net, fleet="lab", plan_id="p1", issued_at_ms=5, node_placements=placements)
    assert doc["jobs"][0]["spec"]["checkpoint_dir"] == "ckpt"
    assert "checkpoint_dir" not in doc["jobs"][1]["spec"]
    rebuilt, _, _ = plan_from_summary(parse_summary(json.dumps(doc)), net)
    assert [p.job.checkpoint_dir for p in rebuilt.placements] == ["ckpt", None]
