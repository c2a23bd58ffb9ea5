"""The dashboard's documents from domain values (pure) and the comparison worker's scheduling."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from planner.core.fleet import Fleet, Link, Node
from planner.core.jobs import catalog_job
from planner.core.lifecycle import JobRecord
from planner.dashboard.compare import (Comparison, ComparisonWorker, MethodOutcome, compare_methods,
                                       comparison_json)
from planner.dashboard.view import (ALIVE, IMPORTED, SILENT, fleet_json, jobs_json,
                                    last_plan_records, pair_links, rtt_colour)

NOW = 1_800_000_000_000


def row(node_id, *, city=None, lat=None, lon=None, seen_s_ago=1.0, gpus=8, source="agent",
        memory_gb=320.0):
    return {"id": node_id, "city": city, "latitude": lat, "longitude": lon, "source": source,
            "last_seen_ms": None if seen_s_ago is None else NOW - int(seen_s_ago * 1000),
            "gpu_count": gpus, "gpu_name": "NVIDIA A100-SXM4-40GB", "memory_gb": memory_gb,
            "hostname": f"host-{node_id}"}


def test_rtt_colours_run_from_green_to_red_on_a_fixed_log_scale():
    assert rtt_colour(1.0) == "#1a9850" and rtt_colour(0.2) == "#1a9850"    # clamped below
    assert rtt_colour(300.0) == "#d73027" and rtt_colour(900.0) == "#d73027"
    reds = [int(rtt_colour(ms)[1:3], 16) for ms in (1, 3, 10, 17)]
    greens = [int(rtt_colour(ms)[3:5], 16) for ms in (17, 30, 100, 300)]
    assert reds == sorted(reds) and reds[0] < reds[-1]          # towards yellow
    assert greens == sorted(greens, reverse=True) and greens[0] > greens[-1]   # then to red
    assert rtt_colour(None) == rtt_colour(math.nan) == "#999999"


def test_pair_links_merge_both_directions_weighted_by_samples():
    links = [Link("b", "a", rtt_ms=30.0, samples=30), Link("a", "b", rtt_ms=10.0, samples=10),
             Link("a", "c", rtt_ms=5.0, imputed=True), Link("c", "c", rtt_ms=0.1)]
    (pair,) = pair_links(links)
    assert (pair.a, pair.b, pair.samples) == ("a", "b", 40)
    assert pair.rtt_ms == pytest.approx((30 * 30 + 10 * 10) / 40)


def test_fleet_document_groups_nodes_into_sites_with_links_between_them():
    rows = [row("bj-1", city="Beijing"), row("bj-2", city="beijing", seen_s_ago=90),
            row("tk-1", city="Tokyo", memory_gb=math.nan), row("p-1", lat=48.1, lon=11.6),
            row("x-1", seen_s_ago=None, source="import", gpus=0)]
    links = pair_links([Link("bj-1", "bj-2", rtt_ms=2.0), Link("bj-1", "tk-1", rtt_ms=40.0),
                        Link("bj-2", "tk-1", rtt_ms=60.0), Link("tk-1", "p-1", rtt_ms=250.0),
                        Link("x-1", "bj-1", rtt_ms=5.0)])
    doc = fleet_json(rows, links, fleet="f", now_ms=NOW, node_timeout_s=30)
    json.dumps(doc, allow_nan=False)     # NaN memory became a number or null
    states = {n["id"]: n["state"] for n in doc["nodes"]}
    assert states == {"bj-1": ALIVE, "bj-2": SILENT, "tk-1": ALIVE, "p-1": ALIVE, "x-1": IMPORTED}
    sites = {s["key"]: s for s in doc["sites"]}
    assert set(sites) == {"Beijing", "Tokyo", "48.10,11.60"}
    assert sites["Beijing"]["nodes"] == ["bj-1", "bj-2"] and sites["Beijing"]["gpus"] == 16
    assert (sites["Beijing"]["alive"], sites["Beijing"]["silent"]) == (1, 1)
    assert sites["Beijing"]["inside_rtt_ms"] == 2.0
    assert sites["Tokyo"]["lat"] == pytest.approx(35.68, abs=0.1)     # from hulk.geo
    between = {(l["a"], l["b"]): l for l in doc["links"]}
    assert set(between) == {("Beijing", "Tokyo"), ("48.10,11.60", "Tokyo")}
    bj_tk = between[("Beijing", "Tokyo")]
    assert (bj_tk["rtt_ms"], bj_tk["pairs"], bj_tk["min_ms"]) == (50.0, 2, 40.0)
    assert bj_tk["colour"] == rtt_colour(50.0)
    assert doc["links"][0] is bj_tk                       # shortest first
    assert doc["unlocated"] == ["x-1"]
    assert doc["totals"]["alive"] == 3 and doc["totals"]["gpus"] == 32


def test_declared_sites_in_one_city_are_drawn_as_two_sites():
    rows = [dict(row("dc1-a", city="Paris"), site="paris-dc1"),
            dict(row("dc1-b", city="Paris"), site="paris-dc1"),
            dict(row("dc2-a", city="Paris"), site="paris-dc2"),
            dict(row("plain", city="Tokyo"), site="Tokyo")]       # no declared site: its city
    links = pair_links([Link("dc1-a", "dc2-a", rtt_ms=1.5), Link("dc1-a", "plain", rtt_ms=220.0)])
    doc = fleet_json(rows, links, fleet="f", now_ms=NOW, node_timeout_s=30)
    sites = {s["key"]: s["nodes"] for s in doc["sites"]}
    assert sites == {"paris-dc1": ["dc1-a", "dc1-b"], "paris-dc2": ["dc2-a"], "Tokyo": ["plain"]}
    assert {(l["a"], l["b"]) for l in doc["links"]} == {("paris-dc1", "paris-dc2"),
                                                        ("Tokyo", "paris-dc1")}


def test_fleet_document_draws_at_most_max_links_and_says_how_many_it_left_out():
    rows = [row(f"n{i}", lat=float(i), lon=float(i)) for i in range(5)]
    links = pair_links([Link(f"n{i}", f"n{j}", rtt_ms=1.0 + i + j) for i in range(5)
                        for j in range(i + 1, 5)])
    doc = fleet_json(rows, links, fleet="f", now_ms=NOW, node_timeout_s=30, max_links=4)
    assert len(doc["links"]) == 4 and doc["links_hidden"] == 6
    assert max(l["rtt_ms"] for l in doc["links"]) <= min(l.rtt_ms for l in links[4:]) + 2


def record(id_, name, state, *, nodes=(), plan_id=None, changed=0, finished=None, started=None):
    return JobRecord(id=id_, name=name, state=state, spec={"model": "gpt2-xl"}, submitted_ms=NOW - 10_000,
                     changed_ms=NOW - changed, plan_id=plan_id, nodes=tuple(nodes),
                     started_ms=started, finished_ms=finished)


def test_jobs_document_lists_live_jobs_first_then_the_latest_finished():
    records = [record(1, "old", "succeeded", finished=NOW - 9000),
               record(2, "run", "running", nodes=("bj-1", "tk-1"), started=NOW - 4000),
               record(3, "newer", "failed", finished=NOW - 1000), record(4, "wait", "queued")]
    doc = jobs_json(records, [row("bj-1", city="Beijing"), row("tk-1", city="Tokyo")], now_ms=NOW,
                    limit=3)
    assert [j["name"] for j in doc["jobs"]] == ["run", "wait", "newer"]
    assert doc["hidden"] == 1 and doc["states"]["succeeded"] == 1
    run = doc["jobs"][0]
    assert run["cities"] == ["Beijing", "Tokyo"] and run["elapsed_s"] == 4.0
    assert run["nodes"] == ["bj-1", "tk-1"]


def test_the_last_plan_is_the_live_jobs_or_else_the_newest_plan():
    done = [record(1, "a", "succeeded", plan_id="p1", changed=9000),
            record(2, "b", "failed", plan_id="p2", changed=1000),
            record(3, "c", "cancelled", plan_id="p2", changed=2000), record(4, "d", "cancelled")]
    assert [r.name for r in last_plan_records(done)] == ["b", "c"]
    live = done + [record(5, "e", "placed", plan_id="p3")]
    assert [r.name for r in last_plan_records(live)] == ["e"]
    assert last_plan_records([]) == []


def test_comparison_document_gives_each_method_as_a_multiple_of_hulks_makespan():
    comparison = Comparison(("a",), 3, NOW, 50.0, (
        MethodOutcome("portfolio", "Hulk (portfolio)", 100.0, 150.0, 0.5),
        MethodOutcome("system-b", "System B (GPipe)", 250.0, 300.0, 0.1),
        MethodOutcome("system-a", "System A", None, None, 0.1, unplaced=("a",)),
        MethodOutcome("dtfm", "DT-FM", None, None, 0.1, error="no")))
    doc = comparison_json(comparison, computing=False, plan={"plan_ids": []})
    methods = {m["method"]: m for m in doc["comparison"]["methods"]}
    assert doc["status"] == "ready"
    assert doc["comparison"]["hulk"] == "portfolio"
    assert methods["portfolio"]["vs_hulk"] == 1.0 and methods["system-b"]["vs_hulk"] == 2.5
    assert methods["system-a"]["vs_hulk"] is None and methods["system-a"]["unplaced"] == ["a"]
    assert comparison_json(None, computing=True, plan={})["status"] == "computing"


def small_fleet() -> Fleet:
    nodes = tuple(Node(f"n{i}", city=city, gpus=8, gpu_name="NVIDIA A100-SXM4-40GB",
                       compute_capability=8.0, memory_gb=320.0)
                  for i, city in enumerate(["Beijing", "Beijing", "Tokyo"]))
    links = (Link("n0", "n1", rtt_ms=1.0), Link("n0", "n2", rtt_ms=40.0), Link("n1", "n2", rtt_ms=41.0))
    return Fleet(nodes, links)


@pytest.mark.slow
def test_compare_methods_judges_every_method_no_faster_than_the_compute_bound():

    jobs = [catalog_job("gpt2-xl", "a"), catalog_job("bert-large", "b")]
    result = compare_methods(jobs, small_fleet())
    assert [m.method for m in result.methods] == ["portfolio", "system-a", "system-b", "system-c",
                                                  "dtfm"]
    assert result.nodes == 3 and result.compute_bound_s > 0
    done = [m for m in result.methods if m.makespan_s is not None]
    assert any(m.method == "portfolio" for m in done) and len(done) >= 3
    for m in done:
        assert m.makespan_s >= result.compute_bound_s * (1 - 1e-9), m


def test_worker_computes_again_only_for_new_inputs_and_keeps_the_latest_offer():
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[str, ...]] = []

    def compare(jobs, fleet):
        calls.append(tuple(j.name for j in jobs))
        started.set()
        release.wait(5)
        return Comparison(tuple(j.name for j in jobs), len(fleet.nodes), NOW, None, ())

    worker = ComparisonWorker(compare)
    job = lambda name: catalog_job("gpt2-xl", name)  # noqa: E731
    try:
        worker.offer("k1", [job("a")], small_fleet())
        assert started.wait(5) and worker.computing
        worker.offer("k1", [job("a")], small_fleet())       # the run in progress: nothing new
        worker.offer("k2", [job("b")], small_fleet())       # dropped: a newer offer follows
        worker.offer("k3", [job("c")], small_fleet())
        release.set()
        for _ in range(100):
            if not worker.computing:
                break
            time.sleep(0.05)
        assert calls == [("a",), ("c",)] and worker.result.jobs == ("c",)
        worker.offer("k3", [job("c")], small_fleet())       # same inputs, fresh result: no run
        assert not worker.computing and len(calls) == 2
        worker.offer("k4", [], small_fleet())               # no jobs: no comparison
        assert worker.result is None
    finally:
        release.set()
        worker.close()


@pytest.mark.process
@pytest.mark.slow
def test_the_child_process_compares_as_in_process_and_close_ends_a_run(tmp_path):
    from planner.dashboard.compare import ChildComparer
    jobs = [catalog_job("gpt2-xl", "a"), catalog_job("bert-large", "b")]
    comparer = ChildComparer()
    here, there = compare_methods(jobs, small_fleet()), comparer(jobs, small_fleet())
    assert [(m.method, m.makespan_s, m.unplaced, m.error) for m in there.methods] == \
        [(m.method, m.makespan_s, m.unplaced, m.error) for m in here.methods]

    outcome: list[BaseException] = []

    def run():
        try:
            comparer([catalog_job("gpt2-xl", f"j{i}") for i in range(40)], small_fleet())
        except BaseException as exc:   # noqa: BLE001 (what the run ended with is the point)
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)          # the child is spawned and importing or planning
    started = time.monotonic()
    comparer.close()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - started < 5
    assert outcome and "ended with" in str(outcome[0]), outcome      # killed, not failed
    with pytest.raises(RuntimeError, match="closed"):
        comparer(jobs, small_fleet())
