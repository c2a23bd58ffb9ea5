"""Node state is told the same everywhere: `fleet show` marks a node silent past --node-timeout
(instead of the launch it last reported) and a revoked node "revoked"; the metrics count them
the same way; `plan --db` never places anything on a revoked node. Real stores, set clocks."""

from __future__ import annotations

import json
import time

import pytest

from hulk.wire.records import (GpuInfo, Inventory, LaunchState, LaunchStatus, NodeLocation,
                               RegisterRequest)
from planner import cli
from planner.commands.fleet import node_marks
from planner.core.fleet import Fleet, Link, Node
from planner.security.credentials import CredentialStore
from planner.service.graph import fleet_from_store
from planner.service.metrics import read_snapshot
from planner.service.store import Store

A100 = GpuInfo("NVIDIA A100-SXM4-40GB", "", 8.0, 40 * 10**9)


def agent(store: Store, node: str, job: str | None) -> None:
    """``node`` registers and sends a heartbeat at the store's clock, running ``job``."""
    store.register(RegisterRequest(node, hostname=node, address="127.0.0.1",
                                   location=NodeLocation("Beijing", None),
                                   inventory=Inventory(gpus=(A100,) * 2)))
    launch = None if job is None else LaunchStatus(LaunchState.RUNNING, plan_id="p1", job=job)
    store.heartbeat(node, launch=launch)


def revoke(db, node: str) -> None:
    credentials = CredentialStore(db)
    try:
        credentials.issue(node)
        credentials.revoke(node)
    finally:
        credentials.close()


@pytest.fixture
def fleet_db(tmp_path):
    """alive-1 running job-a now; dead-1 last heard 2 minutes ago running job-c; gone-1
    running job-b now but revoked; fresh-1 enrolled (a live token) and idle."""
    db = tmp_path / "planner.sqlite"
    now = int(time.time() * 1000)
    with Store(db, clock=lambda: now - 125_000) as store:
        agent(store, "dead-1", "job-c")
    with Store(db) as store:
        agent(store, "alive-1", "job-a")
        agent(store, "gone-1", "job-b")
        agent(store, "fresh-1", None)
    revoke(db, "gone-1")
    credentials = CredentialStore(db)
    credentials.issue("fresh-1")
    credentials.close()
    return db


def rows_of(out: str) -> dict[str, str]:
    return {line.split()[1]: line for line in out.splitlines()
            if line.startswith("│") and line.split()[1].endswith("-1")}


def test_fleet_show_marks_silent_and_revoked_nodes_instead_of_their_launch(fleet_db, capsys):
    assert cli.main(["fleet", "show", "--db", str(fleet_db)]) == 0
    rows = rows_of(capsys.readouterr().out)
    assert set(rows) == {"alive-1", "dead-1", "gone-1", "fresh-1"}
    assert "running" in rows["alive-1"] and "job-a" in rows["alive-1"]
    assert "silent 2m" in rows["dead-1"]
    assert "running" not in rows["dead-1"] and "job-c" not in rows["dead-1"]
    assert "revoked" in rows["gone-1"] and "job-b" not in rows["gone-1"]
    assert "revoked" not in rows["fresh-1"] and "silent" not in rows["fresh-1"]

    # A longer timeout than its silence: dead-1 shows what it last reported again.
    assert cli.main(["fleet", "show", "--db", str(fleet_db), "--node-timeout", "600"]) == 0
    rows = rows_of(capsys.readouterr().out)
    assert "running" in rows["dead-1"] and "job-c" in rows["dead-1"]
    assert "revoked" in rows["gone-1"]


def test_a_bad_node_timeout_is_one_line_exit_2(fleet_db, capsys):
    assert cli.main(["fleet", "show", "--db", str(fleet_db), "--node-timeout", "0"]) == 2
    err = capsys.readouterr().err
    assert "--node-timeout" in err and "Traceback" not in err


def test_the_metrics_count_nodes_as_fleet_show_marks_them(fleet_db):
    now = int(time.time() * 1000)
    with Store(fleet_db) as store:
        snap = read_snapshot(store, node_timeout_s=30, now_ms=now)
        rows = store.nodes()
        records = store.node_records()
    # Serve's recovery reads the same mark (it takes a revoked node down at once).
    assert {r.id for r in records if r.revoked} == {"gone-1"}
    assert snap.nodes == {"alive": 2, "silent": 1, "revoked": 1, "imported": 0}
    # Only alive nodes' launches count: job-c's and job-b's nodes are not "running".
    assert snap.launch_states["running"] == 1 and snap.launch_states["idle"] == 0
    assert (snap.launch_states["silent"], snap.launch_states["revoked"]) == (1, 1)
    assert snap.node_up == {"alive-1": 1, "dead-1": 0, "fresh-1": 1}   # no alert for gone-1

    for r in rows:
        r["revoked"] = r["id"] == "gone-1"
    marks = node_marks(rows, now_ms=now, node_timeout_s=30)
    assert {n: m.split()[0] for n, m in marks.items()} == {"dead-1": "silent", "gone-1": "revoked"}
    assert sum(snap.launch_states[m.split()[0]] for m in marks.values()) == len(marks)


def test_enrolling_a_revoked_node_again_brings_it_back(fleet_db):
    with Store(fleet_db) as store:
        assert "gone-1" not in {n.id for n in fleet_from_store(store).nodes}
        assert "gone-1" in {n.id for n in fleet_from_store(store, keep_revoked=True).nodes}
    credentials = CredentialStore(fleet_db)
    credentials.issue("gone-1")
    credentials.close()
    with Store(fleet_db) as store:
        assert "gone-1" in {n.id for n in fleet_from_store(store).nodes}


def plan_nodes(tmp_path, db) -> set[str]:
    jobs, out = tmp_path / "jobs.yaml", tmp_path / "plan.json"
    jobs.write_text("jobs:\n  - {name: bert, model: bert-large, steps: 10}\n")
    assert cli.main(["plan", str(jobs), "--db", str(db), "--method", "system-b", "--no-compare",
                     "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    return {n for job in doc["jobs"] for stage in job["stages"] for n in stage["nodes"]}


def test_plan_db_never_places_on_a_revoked_node(tmp_path, capsys):
    db = tmp_path / "planner.sqlite"
    nodes = tuple(Node(n, city="Beijing", gpus=g, gpu_name=A100.name, compute_capability=8.0,
                       memory_gb=40.0 * g) for n, g in (("big-1", 8), ("a-1", 2), ("a-2", 2)))
    links = tuple(Link(a, b, rtt_ms=2.0, samples=10)
                  for a, b in (("big-1", "a-1"), ("big-1", "a-2"), ("a-1", "a-2")))
    with Store(db) as store:
        store.import_fleet(Fleet(nodes, links))
    assert "big-1" in plan_nodes(tmp_path, db)
    revoke(db, "big-1")
    placed = plan_nodes(tmp_path, db)
    assert placed and "big-1" not in placed
    capsys.readouterr()
