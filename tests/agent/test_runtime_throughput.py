"""The runtime and the throughput tests: an agent with throughput_port set registers it, hands
the slots of every heartbeat to its test engine (a malformed one too, without costing the
heartbeat: the engine skips it), and reports each result the engine hands back through the
spool, once, even when an acknowledgement is lost. With throughput_port 0 nothing of it exists.

The planner is an in-process PlannerClient and the engine a stand-in with ThroughputTests'
constructor, accept() and run() (agent/throughput.py's own tests cover the engine)."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import replace
from pathlib import Path

from agent.config import load_config
from agent.prober import summarize_round
from agent.reporter import Backoff, GrpcPlannerClient
from agent.runtime import AgentRuntime
from agent.spool import Spool
from agent.throughput import ThroughputTests
from hulk.wire.records import Inventory, ProbeKind, ProbeSample
from hulk.wire.throughput import ThroughputResult
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.throughput import (BAD, SEND, SLOT, InProcessPlanner, StandInTests,
                                      result_of)
from tests.helpers.waits import wait_until_async


def runtime_for(tmp_path: Path, planner: InProcessPlanner, port: str | None,
                engine=StandInTests) -> AgentRuntime:
    env = {"HULK_THROUGHPUT_PORT": port} if port is not None else {}
    config = load_config({"planner": "planner.test:50051", "node_id": "tokyo-1",
                          "address": "127.0.0.1", "state_dir": str(tmp_path)},
                         env_reader=env.get)
    return AgentRuntime(
        config, client=planner, spool=Spool(config.spool_path, config.spool_max), pinger=None,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=0.02, report_linger_s=0.02, spool_write_s=0.02,
        report_backoff=Backoff(initial_s=0.02, cap_s=0.05, rng=random.Random(3)),
        rng=random.Random(4), throughput_tests=engine)


async def test_slots_reach_the_engine_and_a_result_reaches_the_planner_once_across_a_retry(
        tmp_path: Path):
    StandInTests.made.clear()
    planner = InProcessPlanner(slots=(SLOT, BAD, SEND), lose_acks=1)
    runtime = runtime_for(tmp_path, planner, "7500")
    task = asyncio.create_task(runtime.run())
    try:
        await wait_until_async(lambda: planner.stored_results() and runtime.spool.depth == 0
                               and planner.heartbeats >= 3, timeout=20,
                               what="the result acknowledged")
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
    [engine] = StandInTests.made
    assert engine is runtime.throughput
    assert (engine.port, engine.bind_host, engine.clock) == (7500, "127.0.0.1", runtime.clock)
    assert planner.registers[0].throughput_port == 7500
    assert engine.offered[:3] == [SLOT, BAD, SEND]         # every beat's slots, as sent
    assert len(engine.offered) == 3 * planner.heartbeats and engine.accepted == [SLOT, SEND]
    assert runtime.heartbeats_sent == planner.heartbeats   # the malformed slot cost no beat
    carrying = [batch_id for batch_id, samples in planner.reports
                if result_of(SLOT) in samples]
    assert len(carrying) == 2 and carrying[0] == carrying[1]   # the retry reuses the batch id
    assert planner.stored_results() == [result_of(SLOT)]       # stored once


async def test_an_agent_without_a_throughput_port_takes_no_tests(tmp_path: Path):
    StandInTests.made.clear()
    planner = InProcessPlanner(slots=(SLOT,))
    runtime = runtime_for(tmp_path, planner, None)
    task = asyncio.create_task(runtime.run())
    try:
        await wait_until_async(lambda: planner.heartbeats >= 3, timeout=20)
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
    assert runtime.throughput is None and StandInTests.made == []
    assert planner.registers[0].throughput_port == 0
    assert planner.stored_results() == []


def test_the_real_engine_is_built_with_the_agents_port_address_and_clock(tmp_path: Path):
    runtime = runtime_for(tmp_path, InProcessPlanner(), "7500", engine=None)
    assert isinstance(runtime.throughput, ThroughputTests)
    assert (runtime.throughput.port, runtime.throughput.bind_host) == (7500, "127.0.0.1")
    assert runtime.throughput.clock is runtime.clock
    runtime.spool.close()


async def test_a_result_that_fails_the_wire_checks_is_not_spooled(tmp_path: Path, caplog):
    runtime = runtime_for(tmp_path, InProcessPlanner(), "7500")
    sink = runtime.throughput.sink
    caplog.set_level(logging.INFO)
    sink(replace(result_of(SLOT), gbps=float("nan")))       # an engine bug: not worth a batch
    sink(result_of(SLOT))
    assert runtime.spool.held_batch(10) == (result_of(SLOT),)
    assert any("throughput_result.gbps" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)
    runtime.spool.close()


async def test_the_grpc_client_sends_results_in_their_own_field():
    planner = PlannerDouble()
    server, port = await start_server(planner)
    client = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True)
    try:
        summary = summarize_round([ProbeSample("b", 1000, ProbeKind.ICMP, 56, False, 1.5,
                                               2000.0)])[0]
        await client.report("tokyo-1", "b-1", (summary, result_of(SLOT)), 0)
    finally:
        await client.close()
        await server.stop(None)
    [request] = planner.seen.reports
    assert [ThroughputResult.from_proto(r) for r in request.throughput] == [result_of(SLOT)]
    assert len(request.summaries) == 1 and len(request.samples) == 0
