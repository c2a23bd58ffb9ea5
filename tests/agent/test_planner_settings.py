"""Absurd probe settings in the planner's answer (untrusted input): the agent uses its
own value instead, says so once, and goes on probing and reporting (real gRPC planner double)."""

from __future__ import annotations

import asyncio
import logging
import math
import random

import pytest
from pathlib import Path

from agent.config import PROBE_DEFAULTS, load_config
from agent.prober import PacketResult
from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime, effective_settings, unusable_planner_settings
from agent.spool import Spool
from hulk.v1 import hulk_pb2
from hulk.wire.records import Inventory, ProbeSettings
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.waits import wait_until_async


class AnsweringPinger:
    async def ping(self, address, count, timeout_s, payload_bytes, gap_s):
        return [PacketResult(sent_at=1_700_000_000.0, rtt_ms=0.5) for _ in range(count)]


class ReregisteringPlanner(PlannerDouble):
    async def Heartbeat(self, request, context):
        self.reregister_next = True
        return await super().Heartbeat(request, context)


@pytest.mark.slow
async def test_absurd_planner_settings_are_ignored_with_one_warning(tmp_path: Path, caplog):
    planner = ReregisteringPlanner(
        peers=[("p1", "127.0.0.2", 0)],
        settings=hulk_pb2.ProbeSettings(interval_s=0.5, packets_per_round=1_000_000,
                                        timeout_s=math.inf, payload_bytes=2_000_000,
                                        max_concurrency=4_000_000_000, max_batch=4_000_000_000))
    server, port = await start_server(planner)
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "n", "insecure": "1",
                          "address": "127.0.0.1", "state_dir": str(tmp_path)},
                         env_reader=lambda name: None)
    runtime = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True),
        spool=Spool(config.spool_path, config.spool_max), pinger=AnsweringPinger(),
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=0.2, report_linger_s=0.2, rng=random.Random(1))
    caplog.set_level(logging.INFO)
    task = asyncio.create_task(runtime.run())
    try:
        await wait_until_async(lambda: len(planner.seen.registers) >= 3
                         and sum(r.packets for r in planner.stored_rounds())
                         >= 2 * PROBE_DEFAULTS.packets_per_round,
                         timeout=20)
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
        await server.stop(None)
    assert runtime.prober.settings == ProbeSettings(interval_s=0.5)   # the usable one only
    assert runtime.reporter.max_batch == PROBE_DEFAULTS.max_batch
    ignored = [r.getMessage() for r in caplog.records if "ignoring the planner's" in r.getMessage()]
    assert len(ignored) == 5, ignored                                 # once each, not per answer
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_unusable_planner_settings():
    assert unusable_planner_settings(None) == {}
    assert unusable_planner_settings(ProbeSettings()) == {}
    bad = ProbeSettings(interval_s=math.nan, packets_per_round=0, timeout_s=-1.0,
                        payload_bytes=1473, max_concurrency=4097, max_batch=10_001)
    assert set(unusable_planner_settings(bad)) == {"interval_s", "timeout_s", "payload_bytes",
                                                   "max_concurrency", "max_batch"}
    config = load_config({"planner": "p:1", "node_id": "n"}, env_reader=lambda name: None)
    assert effective_settings(config, bad) == ProbeSettings()
