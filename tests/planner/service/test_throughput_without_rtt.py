"""A measured throughput between two sites whose RTT was never measured (ICMP blocked, every RTT
sample refused) reaches plans: `fleet export` writes it as a measured site link whose RTT is
completion's and marked so (`rtt_source`), `fleet complete` keeps it, and the network the
planners read carries the measured throughput. Real SQLite store."""

from __future__ import annotations

import json
import time

import pytest

from hulk.wire.records import NodeLocation, RegisterRequest
from hulk.wire.throughput import ThroughputResult
from planner import cli
from planner.core.fleet import GBIT, complete, rtt_from_bandwidth
from planner.core.rollup import bucket_index
from planner.files.fleet import load_fleet
from planner.linkpred.complete import network_with_links
from planner.service.graph import fleet_from_store
from planner.service.store import Store
from planner.service.throughput_store import ScheduledTest

GBPS = 0.19   # the tbf-shaped 200 Mbit/s link of issue 42


def make_store(path, nodes: dict[str, str], probed: dict[tuple[str, str], float]) -> None:
    """Agents in Paris at ``nodes``' sites, RTT samples only for the ``probed`` pairs, and one
    ok throughput test a1 -> b1."""
    now = int(time.time() * 1000)
    with Store(path) as store:
        refs = {n: store.register(RegisterRequest(n, location=NodeLocation("Paris", site=s),
                                                  throughput_port=7000))[0]
                for n, s in nodes.items()}
        for k, ((a, b), rtt) in enumerate(probed.items()):
            rows = [(refs[a].idx, refs[b].idx, now - 1000 + i, 1, 56, 0, rtt, bucket_index(rtt))
                    for i in range(3)]
            store.store_batch(refs[a], f"batch-{k}", rows)
        test_id = "ab" * 16
        store.throughput.add_scheduled([ScheduledTest(test_id, "a1", "b1", nodes["a1"],
                                                      nodes["b1"], now - 60_000, 1e9)])
        result = ThroughputResult(test_id, "a1", now - 59_000, 2.5, int(GBPS * 1e9 / 8 * 2.5), 4,
                                  GBPS, True)
        assert store.throughput.check_result(refs["b1"].idx, result) is None
        assert store.throughput.store_results(refs["b1"].idx, [result]) == [result]


NO_RTT_BETWEEN = ({"a1": "dc-a", "a2": "dc-a", "b1": "dc-b"}, {("a1", "a2"): 20.0})


def test_fleet_export_and_complete_keep_a_throughput_without_rtt(tmp_path, capsys):
    db, exported, done = tmp_path / "p.db", tmp_path / "fleet.json", tmp_path / "done.json"
    make_store(db, *NO_RTT_BETWEEN)
    assert cli.main(["fleet", "export", "--db", str(db), "--out", str(exported)]) == 0
    (link,) = json.loads(exported.read_text())["site_links"]
    assert (link["src"], link["dst"], link["bandwidth_gbps"]) == ("dc-a", "dc-b", GBPS)
    assert (link["source"], link["rtt_source"], link["samples"]) == ("measured", "formula", 0)
    # No measured path joins the sites: the window formula's RTT of the throughput, never 0.
    assert link["rtt_ms"] == pytest.approx(rtt_from_bandwidth(GBPS)) and link["rtt_ms"] > 0

    capsys.readouterr()
    assert cli.main(["fleet", "complete", str(exported), "--out", str(done)]) == 0
    text = capsys.readouterr().out
    assert "throughput: 1 measured, 0 predicted, 0 formula" in text
    assert "unreachable" not in text
    (kept,) = load_fleet(done).site_links
    assert (kept.source, kept.rtt_source, kept.bandwidth_gbps) == ("measured", "formula", GBPS)
    net = complete(load_fleet(done))
    a1, b1 = net.index["a1"], net.index["b1"]
    assert net.bw[a1, b1] == pytest.approx(GBPS * GBIT)
    assert net.rtt_ms[a1, b1] == pytest.approx(link["rtt_ms"])


def test_plans_from_the_store_use_the_measured_throughput(tmp_path):
    make_store(tmp_path / "p.db", *NO_RTT_BETWEEN)
    with Store(tmp_path / "p.db", read_only=True) as store:
        fleet = fleet_from_store(store)
    for net in (complete(fleet), network_with_links(fleet)):
        a1, a2, b1 = (net.index[n] for n in ("a1", "a2", "b1"))
        assert len(net.components()) == 1                 # b1 is no longer cut off
        assert net.bw[a1, b1] == net.bw[a2, b1] == pytest.approx(GBPS * GBIT)
        assert 0 < net.rtt_ms[a1, b1] < float("inf")
        assert net.rtt_ms[a1, a2] == 20.0                 # measured pairs as before


def test_the_rtt_is_relayed_over_measured_rtts_where_a_path_exists(tmp_path, capsys):
    nodes = {"a1": "dc-a", "b1": "dc-b", "c1": "dc-c"}
    make_store(tmp_path / "p.db", nodes, {("a1", "c1"): 10.0, ("c1", "b1"): 15.0})
    with Store(tmp_path / "p.db", read_only=True) as store:
        fleet = fleet_from_store(store)
    (link,) = fleet.site_links
    assert (link.src, link.dst, link.bandwidth_gbps) == ("dc-a", "dc-b", GBPS)
    assert (link.rtt_ms, link.rtt_source, link.rtt_measured) == (25.0, "formula", False)
    net = complete(fleet)
    assert net.bw[net.index["a1"], net.index["b1"]] == pytest.approx(GBPS * GBIT)
    # `fleet show` does not pass the completed RTT off as measured.
    assert cli.main(["fleet", "show", "--db", str(tmp_path / "p.db")]) == 0
    out = capsys.readouterr().out
    assert "1 site link with a measured throughput and no measured RTT" in out
    row = next(line for line in out[out.index("measured throughput"):].splitlines()
               if "dc-a" in line and "dc-b" in line)
    assert [c.strip() for c in row.split("│")[1:-1]][2:4] == ["-", "0.19"]
