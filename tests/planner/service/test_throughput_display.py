"""Measured throughput where people look: `fleet show` (a row per site pair beside its RTT),
`fleet export` (bandwidth_gbps on the links, and on site links when rolled up), the dashboard's
links and the metrics (result counter, per-site-pair gauge). Real SQLite store."""

from __future__ import annotations

import json
import time

from prometheus_client import generate_latest

from hulk.wire.records import NodeLocation, RegisterRequest
from hulk.wire.throughput import ThroughputResult
from planner import cli
from planner.core.rollup import bucket_index
from planner.dashboard.view import pair_links, summarise_links
from planner.service.graph import fleet_from_store
from planner.service.metrics import PlannerMetrics, read_snapshot, snapshot_metrics
from planner.service.store import Store
from planner.service.throughput_store import ScheduledTest

NODES = {"a1": "dc-a", "a2": "dc-a", "b1": "dc-b"}


def make_store(path, gbps: float = 3.25) -> None:
    """Three agents in two sites, probed both ways, and one ok test dc-a -> dc-b."""
    now = int(time.time() * 1000)
    with Store(path) as store:
        refs = {n: store.register(RegisterRequest(n, location=NodeLocation("Paris", site=s),
                                                  throughput_port=7000))[0]
                for n, s in NODES.items()}
        for k, (a, b) in enumerate((("a1", "b1"), ("a2", "b1"), ("a1", "a2"))):
            rows = [(refs[a].idx, refs[b].idx, now - 1000 + i, 1, 56, 0, 20.0, bucket_index(20.0))
                    for i in range(3)]
            store.store_batch(refs[a], f"batch-{k}", rows)
        test_id = "ab" * 16
        store.throughput.add_scheduled([ScheduledTest(test_id, "a1", "b1", "dc-a", "dc-b",
                                                      now - 60_000, 1e9)])
        result = ThroughputResult(test_id, "a1", now - 59_000, 2.5, int(gbps * 1e9 / 8 * 2.5), 4,
                                  gbps, True)
        assert store.throughput.check_result(refs["b1"].idx, result) is None
        assert store.throughput.store_results(refs["b1"].idx, [result]) == [result]
        assert store.throughput.store_results(refs["b1"].idx, [result]) == []


def table_rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]
            for line in out.splitlines() if line[:1] in ("│", "┃")]


def test_fleet_show_lists_measured_throughput_beside_rtt(tmp_path, capsys):
    make_store(tmp_path / "p.db")
    assert cli.main(["fleet", "show", "--db", str(tmp_path / "p.db")]) == 0
    out = capsys.readouterr().out
    assert "measured throughput" in out
    rows = table_rows(out[out.index("measured throughput"):])
    assert rows[0] == ["from", "to", "RTT ms", "Gbit/s", "tests", "failed", "last test"]
    assert rows[1][:6] == ["dc-a", "dc-b", "20.0", "3.25", "1", "0"]
    assert rows[1][6].endswith("ago")


def test_fleet_export_carries_measured_bandwidth(tmp_path, capsys):
    make_store(tmp_path / "p.db")
    out = tmp_path / "fleet.json"
    assert cli.main(["fleet", "export", "--db", str(tmp_path / "p.db"), "--out", str(out)]) == 0
    links = {(k["src"], k["dst"]): k.get("bandwidth_gbps")
             for k in json.loads(out.read_text())["links"]}
    assert links[("a1", "b1")] == links[("a2", "b1")] == 3.25
    assert links[("a1", "a2")] is None      # inside dc-a: never tested
    assert cli.main(["fleet", "export", "--db", str(tmp_path / "p.db"), "--out", str(out),
                     "--site-links", "yes"]) == 0
    site_links = {(k["src"], k["dst"]): k.get("bandwidth_gbps")
                  for k in json.loads(out.read_text())["site_links"]}
    assert 3.25 in {site_links.get(("dc-a", "dc-b")), site_links.get(("dc-b", "dc-a"))}


def test_dashboard_links_and_metrics_show_it(tmp_path):
    make_store(tmp_path / "p.db")
    with Store(tmp_path / "p.db") as store:
        fleet = fleet_from_store(store)
        rows = store.nodes()
        snap = read_snapshot(store, node_timeout_s=30)
    summary = summarise_links({r["id"]: r["site"] for r in rows}, pair_links(fleet.links))
    (between,) = summary.between
    assert (between["a"], between["b"], between["bandwidth_gbps"]) == ("dc-a", "dc-b", 3.25)
    assert snap.throughput_gbps == {("dc-a", "dc-b"): 3.25}
    (gauge,) = [m for m in snapshot_metrics(snap) if m.name == "hulk_site_pair_throughput_gbps"]
    assert [(s.labels, s.value) for s in gauge.samples] == \
        [({"src_site": "dc-a", "dst_site": "dc-b"}, 3.25)]

    metrics = PlannerMetrics()
    metrics.throughput_result("ok", 3.25)
    metrics.throughput_result("rejected", None)
    text = generate_latest(metrics.registry).decode()
    assert 'hulk_throughput_tests_total{result="ok"} 1.0' in text
    assert 'hulk_throughput_tests_total{result="rejected"} 1.0' in text
    assert 'hulk_throughput_tests_total{result="failed"} 0.0' in text
    assert "hulk_throughput_measured_gbps_count 1.0" in text
