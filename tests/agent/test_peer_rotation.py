"""The planner rotates an agent's peers (probing by plan): the running agent takes the new list
when a heartbeat says peers changed, without a restart, and its probe rate stays under its
cap however long the list (a real gRPC planner double; the pinger answers in-process)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from agent.config import load_config
from agent.peers import paced_interval_s
from agent.prober import PacketResult
from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk.v1 import hulk_pb2
from hulk.wire.records import Inventory
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.waits import wait_until_async


class RecordingPinger:
    def __init__(self):
        self.pings: list[tuple[float, str]] = []

    async def ping(self, address, count, timeout_s, payload_bytes, gap_s):
        self.pings.append((time.monotonic(), address))
        return [PacketResult(sent_at=time.time(), rtt_ms=0.5) for _ in range(count)]


class RotatingPlanner(PlannerDouble):
    """Heartbeats say peers changed once after ``rotate`` is called."""

    changed_pending = False

    def rotate(self, peers) -> None:
        self.peers = list(peers)
        self.changed_pending = True

    async def Heartbeat(self, request, context):
        answer = await super().Heartbeat(request, context)
        if self.changed_pending:
            self.changed_pending = False
            answer.peers_changed = True
        return answer


@pytest.mark.slow
async def test_a_changed_peer_list_is_probed_without_a_restart_and_paced(tmp_path: Path):
    planner = RotatingPlanner(peers=[("p1", "127.0.0.2", 0)],
                              settings=hulk_pb2.ProbeSettings(interval_s=0.3, packets_per_round=3))
    server, port = await start_server(planner)
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "n", "insecure": "1",
                          "address": "127.0.0.1", "state_dir": str(tmp_path)},
                         env_reader={"HULK_MAX_PROBE_RATE": "8"}.get)
    pinger = RecordingPinger()
    runtime = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True),
        spool=Spool(config.spool_path, config.spool_max), pinger=pinger,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=0.2, report_linger_s=0.2, rng=random.Random(2))
    task = asyncio.create_task(runtime.run())
    try:
        await wait_until_async(lambda: any(a == "127.0.0.2" for _, a in pinger.pings), timeout=20)
        assert runtime.prober.settings.interval_s == pytest.approx(0.375)  # 1 x 3 / 8 per s
        planner.rotate([("p2", "127.0.0.3", 0), ("p3", "127.0.0.4", 0), ("p4", "127.0.0.5", 0),
                        ("p5", "127.0.0.6", 0)])
        await wait_until_async(lambda: {"127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"}
                               <= {a for _, a in pinger.pings}, timeout=20)
        switched = time.monotonic()
        assert len(planner.seen.registers) >= 2 and runtime.prober.peer_count == 4
        assert runtime.prober.settings.interval_s == pytest.approx(1.5)    # 4 x 3 / 8 per s
        await asyncio.sleep(3.2)
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
        await server.stop(None)
    later = [(t, a) for t, a in pinger.pings if t > switched + 0.1]
    assert "127.0.0.2" not in {a for _, a in later}           # the old peer is dropped
    # Paced: 4 peers a round every 1.5 s (10 % jitter) is at most 3 rounds each in 3.2 s.
    assert 4 <= len(later) <= 12


@pytest.mark.parametrize("interval, peers, packets, rate, expected", [
    (60.0, 64, 3, 10.0, 60.0),          # the plan's default bound: 3.2 packets/s, unchanged
    (60.0, 10_000, 3, 10.0, 3000.0),    # every server of a big fleet: stretched to 10/s
    (1.0, 0, 3, 10.0, 1.0), (5.0, 4, 3, 0.0, 5.0)])
def test_paced_interval(interval, peers, packets, rate, expected):
    assert paced_interval_s(interval, peers, packets, rate) == expected
