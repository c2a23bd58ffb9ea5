"""A low-communication job through the plan's outputs: the hulk-plan/1 document (sync, islands,
outer group) read back into the same placement, `plan`'s printing, each node's Role, and the job
spec serve re-plans from. Jobs that sync every step keep their documents as they were."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from rich.console import Console

from hulk.errors import InputError
from hulk.wire import placement as wire
from hulk.wire.placement import parse_placement, parse_summary
from planner.commands.plan import MethodResult, print_plan
from planner.core.costmodel import OuterSync, Placement, Stage, estimate
from planner.core.evaluate import evaluate
from planner.core.jobs import COMPRESSION_BYTES, JOB_BOUNDS, SYNC_BOUNDS, Sync
from planner.core.placements import (build_node_placements, build_summary, job_from_spec,
                                     job_spec, placement_from_stages, plan_from_summary,
                                     stages_doc)
from planner.core.plan import Plan
from planner.files.plan import parse_plan, plan_to_json
from tests.helpers.plans import job, two_city_net

NET = two_city_net()      # n0..n2 in Beijing, n3..n5 in Tokyo, 80 ms between
JOB = replace(job("a"), sync=Sync("diloco", 50, ("int8",), 4))


def small_plan() -> Plan:
    p = Placement(JOB, (Stage(0, 24, (0, 3)), Stage(24, 48, (1, 4))), micro_batch=4,
                  islands=(1, 1), outer=OuterSync(50, "int8", 4))
    return Plan("manual", [p])


def test_plan_json_says_sync_islands_and_outer_group_and_reads_back():
    plan = small_plan()
    doc = plan_to_json(plan, NET)
    job_doc = doc["jobs"][0]
    assert job_doc["sync"] == {"mode": "diloco", "inner_steps": 50, "compression": "int8",
                               "streaming_fragments": 4,
                               "outer_sync_s": round(estimate(plan.placements[0], NET)
                                                     .outer_sync_s, 6)}
    assert job_doc["islands"] == {"replicas": [1, 1], "outer_group": [["n0", "n3"], ["n1", "n4"]]}
    read = parse_plan(json.loads(json.dumps(doc)), "plan.json", NET.ids)
    assert read.placements([JOB], NET) == plan.placements


def test_a_step_job_document_has_no_sync_keys():
    p = replace(small_plan().placements[0], islands=(), outer=None)
    doc = plan_to_json(Plan("manual", [p]), NET)
    assert set(doc["jobs"][0]) == {"name", "phase", "micro_batch", "stages", "estimate"}
    assert parse_plan(doc, "plan.json").placements([JOB], NET)[0].outer is None


@pytest.mark.parametrize("mutate, field", [
    (lambda j: j["sync"].update(mode="auto"), "jobs[0].sync.mode"),
    (lambda j: j["sync"].update(inner_steps=0), "jobs[0].sync.inner_steps"),
    (lambda j: j["sync"].update(compression="zip"), "jobs[0].sync.compression"),
    (lambda j: j["sync"].update(streaming_fragments=49), "jobs[0].sync.streaming_fragments"),
    (lambda j: j["sync"].pop("inner_steps"), "jobs[0].sync.inner_steps"),
    (lambda j: j["islands"].update(replicas=[2, 1]), "jobs[0].islands.replicas"),
    (lambda j: j["islands"].update(replicas=[0, 2]), "jobs[0].islands.replicas"),
    (lambda j: j["islands"].update(outer_group=[["n0", "n3"], ["n4", "n1"]]),
     "jobs[0].islands.outer_group"),
    (lambda j: j.pop("islands"), "jobs[0].islands"),
])
def test_a_bad_sync_or_islands_names_the_field(mutate, field):
    doc = json.loads(json.dumps(plan_to_json(small_plan(), NET)))
    mutate(doc["jobs"][0])
    with pytest.raises(InputError) as err:
        parse_plan(doc, "plan.json")
    assert f"plan.json: {field}: " in str(err.value), str(err.value)


def test_plan_prints_islands_and_outer_group():
    plan = small_plan()
    console = Console(record=True, width=240)
    print_plan(console, MethodResult("search", plan, evaluate(plan, NET), 0.1), NET)
    text = console.export_text()
    assert "sync: diloco, every 50 inner steps an outer all-reduce at int8" in text
    assert "streaming in 4 fragments" in text
    assert "2 islands of 1/1 replicas (replicas 0, 1); outer group stage 0: n0, n3; " \
           "stage 1: n1, n4" in text


def test_roles_carry_island_and_outer_sync():
    net = two_city_net(per_city=4)
    p = Placement(JOB, (Stage(0, 24, (0, 1, 4, 5)), Stage(24, 48, (2, 3, 6, 7))), micro_batch=4,
                  islands=(1, 3), outer=OuterSync(50, "int8", 4))
    placements = build_node_placements(Plan("manual", [p]), net, fleet="lab", plan_id="p1")
    roles = {node: np_.roles[0] for node, np_ in placements.items()}
    assert [roles[f"n{i}"].island for i in (0, 1, 4, 5, 2, 3, 6, 7)] == [0, 1, 1, 1] * 2
    r = roles["n5"]
    assert (r.sync, r.inner_steps, r.outer_compression, r.streaming_fragments, r.num_islands,
            r.replica, r.num_replicas) == ("diloco", 50, "int8", 4, 2, 3, 4)
    again = parse_placement(placements["n5"].to_bytes()).roles[0]
    assert again == r


def test_step_roles_are_byte_identical_without_the_sync_fields():
    p = replace(small_plan().placements[0], islands=(), outer=None)
    data = build_node_placements(Plan("manual", [p]), NET, fleet="lab", plan_id="p1")["n0"]
    text = data.to_bytes().decode()
    for key in ("sync", "inner_steps", "outer_compression", "streaming_fragments", "island"):
        assert f'"{key}"' not in text


@pytest.mark.parametrize("sync", [Sync(), Sync("diloco", 50, ("int8",), 4),
                                  Sync("auto", 500, ("none", "bf16"), 0)])
def test_job_spec_carries_the_sync(sync):
    j = replace(JOB, sync=sync)
    spec = json.loads(json.dumps(job_spec(j)))
    assert job_from_spec(j.name, spec) == j
    assert ("sync" in spec) == (sync.mode != "step")


def test_a_bad_spec_sync_names_the_field():
    spec = dict(job_spec(JOB), outer_compression="zip")
    with pytest.raises(InputError) as err:
        job_from_spec("a", spec)
    assert "a.spec.outer_compression" in str(err.value)


def test_the_plan_summary_and_the_job_record_keep_islands_and_outer_sync():
    plan = small_plan()
    nodes = build_node_placements(plan, NET, fleet="lab", plan_id="p1")
    doc = build_summary(plan, NET, fleet="lab", plan_id="p1", issued_at_ms=1,
                        node_placements=nodes, jobs=[JOB])
    back, _, missing = plan_from_summary(parse_summary(json.dumps(doc)), NET)
    assert missing == [] and back.placements == plan.placements
    p = plan.placements[0]
    kept = json.loads(json.dumps(stages_doc(p, NET)))
    assert placement_from_stages(JOB, kept, NET) == p
    step = replace(p, islands=(), outer=None)
    assert "outer" not in stages_doc(step, NET)
    with pytest.raises(InputError, match="a.stages.outer"):
        placement_from_stages(JOB, dict(kept, islands=[3]), NET)


def test_a_bad_summary_outer_names_the_field():
    plan = small_plan()
    nodes = build_node_placements(plan, NET, fleet="lab", plan_id="p1")
    doc = build_summary(plan, NET, fleet="lab", plan_id="p1", issued_at_ms=1,
                        node_placements=nodes, jobs=[JOB])
    doc["jobs"][0]["outer"]["compression"] = "zip"
    with pytest.raises(InputError, match=r"jobs\[0\].outer.compression"):
        parse_summary(json.dumps(doc))
    doc["jobs"][0]["outer"]["compression"] = "int8"
    doc["jobs"][0]["islands"] = [1, 2]
    with pytest.raises(InputError, match=r"jobs\[0\].islands"):
        parse_summary(json.dumps(doc))


def test_the_wire_and_the_planner_agree_on_the_sync_values():
    assert wire.OUTER_COMPRESSIONS == tuple(COMPRESSION_BYTES)
    assert wire.MAX_INNER_STEPS == SYNC_BOUNDS["inner_steps"].high
    assert wire.MAX_FRAGMENTS == SYNC_BOUNDS["streaming_fragments"].high == JOB_BOUNDS["layers"].high
