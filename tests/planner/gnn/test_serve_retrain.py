"""`hulk-planner serve --model-dir`: a fleet change fine-tunes the GNN in the background while
agents keep registering and reporting (real serve process, real SQLite file, real gRPC)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.core.generate import generate_fleet
from planner.files.fleet import save_fleet_json
from planner.gnn import checkpoint as ckpt
from planner.gnn.online import ACTIVE_NAME, RESULTS_NAME
from tests.helpers.processes import run_cli, start_planner
from tests.helpers.waits import wait_until

pytestmark = pytest.mark.process


def sub_fleet(fleet, keep: int):
    ids = {n.id for n in fleet.nodes[:keep]}
    return replace(fleet, nodes=fleet.nodes[:keep],
                   links=tuple(l for l in fleet.links if l.src in ids and l.dst in ids))


def results(model_dir: Path) -> list[dict]:
    path = model_dir / RESULTS_NAME
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_fleet_change_fine_tunes_in_background_without_blocking_ingestion(tiny_checkpoint,
                                                                          tmp_path):
    full = generate_fleet(14, seed=3)
    first, grown = tmp_path / "first.json", tmp_path / "grown.json"
    save_fleet_json(sub_fleet(full, 10), first)
    save_fleet_json(full, grown)
    db, model_dir = tmp_path / "planner.db", tmp_path / "model"
    model_dir.mkdir()
    active = model_dir / ACTIVE_NAME
    active.write_bytes(tiny_checkpoint.read_bytes())
    seeded = active.read_bytes()

    assert run_cli("fleet", "import", str(first), "--db", str(db)).returncode == 0
    planner = start_planner(db, extra=(
        "--model-dir", str(model_dir), "--retrain-check-interval", "0.5",
        "--retrain-job-sets", "4", "--retrain-epochs", "2", "--retrain-teacher-budget", "3"))
    try:
        # The fleet present at start is tuned for first.
        wait_until(lambda: len(results(model_dir)) >= 1, 40, "the first fine-tuning run",
                   detail=planner.output)
        after_first = active.read_bytes()
        started = planner.output().count("GNN fine-tuning started")
        assert started == 1, planner.output()

        imported = run_cli("fleet", "import", str(grown), "--db", str(db))
        assert imported.returncode == 0, imported.stderr
        wait_until(lambda: planner.output().count("GNN fine-tuning started") == 2, 10,
                   "the fleet change to be noticed", detail=planner.output)

        # Ingestion while the fine-tune runs: every call answers promptly.
        stub = hulk_pb2_grpc.PlannerStub(planner.channel())
        nodes = [n.id for n in full.nodes]
        calls: list[tuple[float, float]] = []          # (wall-clock end in ms, latency in s)
        k = 0
        while len(results(model_dir)) < 2:
            node = nodes[k % len(nodes)]
            t0 = time.monotonic()
            reg = stub.Register(hulk_pb2.RegisterRequest(
                node_id=node, hostname=f"host-{node}", location=hulk_pb2.Location(city="Cairo"),
                agent_version="test", address="127.0.0.1",
                inventory=hulk_pb2.GpuInventory(unavailable_reason="NVML library not found")),
                timeout=5)
            rep = stub.Report(hulk_pb2.ReportRequest(
                node_id=node, batch_id=f"b{k}", samples=[hulk_pb2.Sample(
                    peer_id=nodes[(k + 1) % len(nodes)], sent_at_ms=int(time.time() * 1000),
                    kind=hulk_pb2.PROBE_KIND_ICMP, payload_bytes=56, rtt_ms=20.0,
                    timeout_ms=2000.0)]), timeout=5)
            calls.append((time.time() * 1000, time.monotonic() - t0))
            assert reg is not None and rep is not None
            k += 1
            assert k < 5000, "the second fine-tuning run never finished"

        second = results(model_dir)[1]
        assert second["error"] is None and second["examples"] >= 2, second
        assert second["fleet"] == "default"
        during = [lat for end_ms, lat in calls if end_ms <= second["time_ms"]]
        assert during, "no Register/Report call overlapped the fine-tuning run"
        assert max(during) < 1.0, f"ingestion waited for the fine-tune: {max(during):.2f} s"

        # Switched -> the replaced checkpoint is kept as *.prev.pt; else the active one is unchanged.
        prev = model_dir / (active.stem + ".prev.pt")
        if second["switched"]:
            assert second["new_held_out_s"] < second["old_held_out_s"]
            assert prev.read_bytes() == after_first
            assert ckpt.load(active).meta["fine_tuned_on"]["nodes"] == 14
        else:
            assert active.read_bytes() == after_first
        if not any(r["switched"] for r in results(model_dir)):
            assert active.read_bytes() == seeded and not prev.exists()
    finally:
        code = planner.stop()
    assert code == 0, planner.output()


def test_retrain_without_a_model_dir_is_a_one_line_error(tmp_path):
    result = run_cli("serve", "--db", str(tmp_path / "p.db"), "--listen", "127.0.0.1:0",
                     "--insecure", "--retrain")
    assert result.returncode == 2
    assert "--retrain" in result.stderr and "--model-dir" in result.stderr
    assert "Traceback" not in result.stderr
