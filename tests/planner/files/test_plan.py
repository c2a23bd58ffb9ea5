"""hulk-plan/1 of docs/DESIGN.md: its validation, and a round trip through the cost model."""

from __future__ import annotations

import copy
import json

import pytest

from hulk.errors import InputError
from planner.baselines.systems import plan_system_b, plan_system_c
from planner.core.costmodel import estimate, estimate_plan
from planner.core.fleet import complete
from planner.core.generate import generate_fleet, generate_jobs
from planner.core.evaluate import evaluate
from planner.files.plan import parse_plan, plan_to_json, read_plan, write_plan


@pytest.fixture(scope="module")
def setting():
    net = complete(generate_fleet(30, seed=11))
    jobs = generate_jobs(3, seed=2, max_params=15e9)
    return net, jobs


def test_document_matches_design_and_round_trips(setting, tmp_path):
    net, jobs = setting
    plan = plan_system_b(jobs, net)
    path = tmp_path / "out" / "plan.json"
    doc = write_plan(plan, net, path)
    loaded = json.loads(path.read_text())
    assert loaded == doc
    assert list(doc) == ["format", "method", "fleet", "jobs", "totals", "unplaced"]
    assert doc["format"] == "hulk-plan/1" and doc["method"] == "system-b"
    assert doc["fleet"] == {"nodes": 30}
    for job in doc["jobs"]:
        assert list(job) == ["name", "phase", "micro_batch", "stages", "estimate"]
        assert list(job["estimate"]) == ["iteration_s", "compute_s", "communication_s", "job_s"]
        for st in job["stages"]:
            assert all(isinstance(i, str) and i in net.index for i in st["nodes"])
    parsed = read_plan(path, node_ids=net.ids)
    placements = parsed.placements(jobs, net)
    totals = estimate_plan(placements, net)
    for jd, p in zip(parsed.jobs, placements):
        e = estimate(p, net)
        assert jd.estimate["job_s"] == pytest.approx(e.job_s, rel=1e-9, abs=5e-7)  # the file keeps 6 decimals
        assert jd.estimate["compute_s"] == pytest.approx(e.compute_s, rel=1e-6)
    assert doc["totals"]["makespan_s"] == pytest.approx(totals.makespan_s, rel=1e-9, abs=5e-7)
    assert doc["totals"]["sum_jct_s"] == pytest.approx(totals.sum_jct_s, rel=1e-9, abs=5e-7)


def test_unplaced_jobs_are_listed(setting):
    net, jobs = setting
    from planner.core.jobs import Job

    huge = Job(name="huge", params=1e13, layers=8, hidden=1024, seq_len=512, global_batch=8)
    doc = plan_to_json(plan_system_b(jobs + [huge], net), net)
    assert doc["unplaced"][0]["name"] == "huge" and doc["unplaced"][0]["reason"]
    assert "huge" not in [j["name"] for j in doc["jobs"]]


def test_tensor_parallel_plans_are_not_written(setting):
    net, jobs = setting
    plan = plan_system_c(jobs, net)
    report = evaluate(plan, net)
    assert report.makespan_s == pytest.approx(sum(plan.job_s_override.values()))
    with pytest.raises(InputError, match="cannot be written as pipeline stages"):
        plan_to_json(plan, net)


def _mutations():
    def drop_format(d): del d["format"]
    def bad_format(d): d["format"] = "hulk-plan/2"
    def gap(d): d["jobs"][0]["stages"][-1]["layers"][0] += 1
    def uneven(d): d["jobs"][0]["stages"][-1]["nodes"].append(d["jobs"][0]["stages"][0]["nodes"][0])
    def unknown_node(d): d["jobs"][0]["stages"][0]["nodes"][0] = "nowhere"
    def reuse(d):
        d["jobs"][1]["phase"] = d["jobs"][0]["phase"]
        d["jobs"][1]["stages"][0]["nodes"][0] = d["jobs"][0]["stages"][0]["nodes"][0]
    def negative(d): d["jobs"][0]["estimate"]["job_s"] = -1
    def extra(d): d["jobs"][0]["replicas"] = 2
    def micro(d): d["jobs"][0]["micro_batch"] = 0
    def dup(d): d["jobs"][1]["name"] = d["jobs"][0]["name"]
    return [("format: missing", drop_format), ("format: expected 'hulk-plan/1'", bad_format),
            ("contiguous", gap), ("one per replica", uneven), ("unknown node 'nowhere'", unknown_node),
            ("in the same phase", reuse), ("job_s: expected a number >= 0", negative),
            ("replicas: unknown key", extra), ("micro_batch: expected an integer >= 1", micro),
            ("duplicate job", dup)]


@pytest.mark.parametrize("expected, mutate", _mutations())
def test_validation(setting, expected, mutate):
    net, jobs = setting
    doc = plan_to_json(plan_system_b(jobs, net), net)
    parse_plan(doc, "plan.json", net.ids)  # the original is valid
    bad = copy.deepcopy(doc)
    mutate(bad)
    with pytest.raises(InputError) as info:
        parse_plan(bad, "plan.json", net.ids)
    assert expected in str(info.value) and str(info.value).startswith("plan.json: ")


def test_not_json(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{\n  nope")
    with pytest.raises(InputError, match=r"plan.json:2: not valid JSON"):
        read_plan(path)
