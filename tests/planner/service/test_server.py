"""A real `hulk-planner serve` process, a real SQLite file, a real gRPC client on loopback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.files.fleet import load_fleet
from planner.service.store import Store

from tests.helpers.processes import PlannerProcess, run_cli, start_planner

pytestmark = pytest.mark.process


def register(stub, node_id: str, city: str = "", coords=None, address: str = "127.0.0.1"):
    loc = hulk_pb2.Location(city=city)
    if coords:
        loc.has_coordinates = True
        loc.latitude, loc.longitude = coords
    return stub.Register(hulk_pb2.RegisterRequest(
        node_id=node_id, hostname=f"host-{node_id}", location=loc, agent_version="test",
        address=address, inventory=hulk_pb2.GpuInventory(
            unavailable_reason="NVML library not found")), timeout=10)


def sample(peer: str, rtt: float, *, lost: bool = False, timeout_ms: float = 2000.0,
           sent: int | None = None) -> hulk_pb2.Sample:
    return hulk_pb2.Sample(peer_id=peer, sent_at_ms=sent or int(time.time() * 1000),
                           kind=hulk_pb2.PROBE_KIND_ICMP, payload_bytes=56, lost=lost,
                           rtt_ms=rtt, timeout_ms=timeout_ms)


def report(stub, node: str, batch: str, samples):
    return stub.Report(hulk_pb2.ReportRequest(node_id=node, batch_id=batch, samples=samples),
                       timeout=10)


def stored(db: Path) -> int:
    with Store(db) as store:
        return store.sample_count()


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_serve_end_to_end_with_a_grpc_client(planner: PlannerProcess, tmp_path: Path):
    with planner.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "hulk.v1.Planner"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        stub = hulk_pb2_grpc.PlannerStub(channel)
        first = register(stub, "bj-1", "Beijing", address="127.0.0.2")
        assert list(first.peers) == [] and first.settings.payload_bytes == 56
        assert first.settings.max_batch > 0 and first.fleet == "default"
        register(stub, "tk-1", "Tokyo", address="127.0.0.3")
        third = register(stub, "bj-2", coords=(39.9, 116.4), address="127.0.0.4")
        assert sorted(p.node_id for p in third.peers) == ["bj-1", "tk-1"]
        assert {p.address for p in third.peers} == {"127.0.0.2", "127.0.0.3"}

        beat = stub.Heartbeat(hulk_pb2.HeartbeatRequest(node_id="bj-1"), timeout=10)
        assert not beat.reregister and beat.peers_changed  # two nodes joined after bj-1
        assert stub.Heartbeat(hulk_pb2.HeartbeatRequest(node_id="ghost"), timeout=10).reregister
        running = hulk_pb2.LaunchStatus(plan_id="p1", job="gpt", state=hulk_pb2.LAUNCH_STATE_RUNNING)
        stub.Heartbeat(hulk_pb2.HeartbeatRequest(node_id="tk-1", launch=running), timeout=10)
        newer = hulk_pb2.LaunchStatus(state=42)  # an enum value from a newer agent
        code, details = code_of(lambda: stub.Heartbeat(
            hulk_pb2.HeartbeatRequest(node_id="tk-1", launch=newer), timeout=10))
        assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT,
                                   "launch.state: unknown LaunchState value 42")

        # Beijing - Tokyo is about 2,100 km: at least 21 ms round trip.
        good = [sample("tk-1", 60.0 + i) for i in range(10)] + [sample("tk-1", 0, lost=True)]
        ok = report(stub, "bj-1", "batch-1", good)
        assert (ok.accepted, ok.rejected, ok.duplicate) == (11, 0, False)
        again = report(stub, "bj-1", "batch-1", good)
        assert again.duplicate and again.accepted == 11
        assert stored(planner.db) == 11  # the retried batch was stored once

        code, details = code_of(lambda: report(stub, "nobody", "b", [sample("tk-1", 60.0)]))
        assert code == grpc.StatusCode.NOT_FOUND and "nobody" in details

        for bad, field in ([sample("tk-1", -1.0)], "rtt_ms"), \
                ([sample("tk-1", 2500.0, timeout_ms=2000.0)], "timeout"), \
                ([sample("tk-1", 60.0), sample("bj-1", 1.0)], "itself"), \
                ([sample("tk-1", 60.0, timeout_ms=float("inf"))], "timeout_ms"):
            # (A sample dated in the future is no longer refused: see test_ingest_hostile.py.)
            code, details = code_of(lambda: report(stub, "bj-1", f"bad-{field}", bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert field in details
        assert stored(planner.db) == 11  # a rejected batch stores nothing

        code, details = code_of(lambda: report(stub, "bj-1", "huge",
                                               [sample("tk-1", 60.0)] * 10_001))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit" in details

        # Faster than light between Beijing and Tokyo: that sample is rejected and counted, the
        # batch's good sample is stored. Same-city pairs (bj-2 has coordinates) pass at 0.3 ms.
        mixed = report(stub, "bj-2", "batch-2", [sample("tk-1", 5.0), sample("tk-1", 70.0),
                                                 sample("bj-1", 0.3)])
        assert (mixed.accepted, mixed.rejected) == (2, 1)
        only_bad = report(stub, "bj-2", "batch-3", [sample("tk-1", 3.0)])
        assert (only_bad.accepted, only_bad.rejected) == (0, 1)
        assert stored(planner.db) == 13
        code, _ = code_of(lambda: report(stub, "bj-1", "", [sample("tk-1", 60.0)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT

    with Store(planner.db) as store:
        rejected = store.rejected_counts()
        assert rejected["bj-2"]["below_light_speed"] == 2
        assert all(s["rtt_ms"] is None or s["rtt_ms"] >= 0.3 for s in store.raw_samples())
        pairs = {(p.src, p.dst): p.rollup.stats() for p in store.window_rollups(90)}
        st = pairs[("bj-1", "tk-1")]
        assert st.samples == 11 and st.lost == 1 and st.mean_ms == pytest.approx(64.5)
        nodes = {r["id"]: r for r in store.nodes()}
        assert nodes["bj-1"]["gpu_unavailable_reason"] == "NVML library not found"
        assert (nodes["tk-1"]["launch_state"], nodes["tk-1"]["launch_job"]) == ("running", "gpt")
    assert "below the speed-of-light bound" in planner.output()

    # Restart on the same store: the batch id is still known, nothing is stored twice.
    assert planner.stop() == 0
    assert "stopped" in planner.output()
    second = start_planner(planner.db)
    try:
        with second.channel() as channel:
            stub = hulk_pb2_grpc.PlannerStub(channel)
            assert report(stub, "bj-1", "batch-1", good).duplicate
        assert stored(planner.db) == 13
    finally:
        assert second.stop() == 0

    # The fleet commands on the result.
    show = run_cli("fleet", "show", "--db", str(planner.db))
    assert show.returncode == 0, show.stderr
    assert "bj-1" in show.stdout and "tk-1" in show.stdout and "link coverage" in show.stdout
    assert "NVML library not found" in show.stdout
    out = tmp_path / "fleet.json"
    export = run_cli("fleet", "export", "--db", str(planner.db), "--out", str(out))
    assert export.returncode == 0, export.stderr
    fleet = load_fleet(out)
    links = {(k.src, k.dst): k for k in fleet.links}
    assert links[("bj-1", "tk-1")].rtt_ms == pytest.approx(64.5)
    assert links[("bj-1", "tk-1")].samples == 11
    png = tmp_path / "fleet.png"
    plot = run_cli("fleet", "plot", "--db", str(planner.db), "--out", str(png))
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fleet_import_show_plot(tmp_path: Path, paper_fleet_dir: Path):
    db = tmp_path / "p.db"
    imp = run_cli("fleet", "import", str(paper_fleet_dir / "Hulk_data.zip"), "--db", str(db))
    assert imp.returncode == 0, imp.stderr
    warnings = [line for line in imp.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == len(set(warnings)) == 6
    assert any("edge.txt:116: self-loop" in w for w in warnings)
    with Store(db) as store:
        links = store.imported_links()
        assert len(links) == 613 and all(k["src"] != k["dst"] for k in links)
        before = (len(store.nodes()), len(links))

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes": [{"id": "new", "memory_gb": 1}],
                               "links": [{"src": "new", "dst": "0", "rtt_ms": "x"}]}))
    failed = run_cli("fleet", "import", str(bad), "--db", str(db))
    assert failed.returncode == 2
    assert failed.stderr.strip().count("\n") == 0 and "links[0]" in failed.stderr
    assert "Traceback" not in failed.stderr
    with Store(db) as store:  # a malformed file changes nothing already stored
        assert (len(store.nodes()), len(store.imported_links())) == before

    show = run_cli("fleet", "show", "--db", str(db))
    assert show.returncode == 0 and "613 of 1081 pairs measured" in show.stdout
    show_file = run_cli("fleet", "show", "--fleet", str(paper_fleet_dir))
    assert show_file.returncode == 0 and "Neimeng" in show_file.stdout
    png = tmp_path / "paper.png"
    assert run_cli("fleet", "plot", "--fleet", str(paper_fleet_dir), "--out",
                   str(png)).returncode == 0
    assert png.stat().st_size > 10_000


def test_serve_refuses_bad_settings(tmp_path: Path):
    plain = run_cli("serve", "--db", str(tmp_path / "x.db"), "--listen", "127.0.0.1:0")
    assert plain.returncode == 2 and "--insecure" in plain.stderr and "Traceback" not in plain.stderr
    busy = start_planner(tmp_path / "a.db")
    try:
        clash = run_cli("serve", "--db", str(tmp_path / "b.db"), "--listen", busy.address,
                        "--insecure")
        assert clash.returncode == 2 and "cannot listen" in clash.stderr, clash.stderr
    finally:
        busy.stop()
