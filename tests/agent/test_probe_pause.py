"""Probes keep quiet while this node is in a throughput test: a paused prober sends nothing and
hands on nothing, drops a round the pause began in, and resumes after; the throughput engine
says when the node is in a test; an agent holding a started slot skips its probe rounds.

The pinger is in-process (answers at once), so a round has no suspension point between its
pause check and its ping."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace
from pathlib import Path

from agent.clock import SystemClock, epoch_ms
from agent.config import load_config
from agent.prober import PacketResult, Prober
from agent.reporter import Backoff
from agent.runtime import AgentRuntime
from agent.spool import Spool
from agent.throughput import ThroughputTests
from hulk.wire.records import Inventory, Peer, PeerSummary, ProbeSettings, RegisterAnswer
from tests.helpers.throughput import SLOT, InProcessPlanner, StandInTests
from tests.helpers.ports import free_port
from tests.helpers.waits import wait_until_async

FAST = ProbeSettings(interval_s=0.05, packets_per_round=3, timeout_s=0.5, max_concurrency=8)
PEERS = [Peer("a", "10.0.0.1"), Peer("b", "10.0.0.2")]


class FakePinger:
    """Every packet answered in 1 ms; ``on_ping`` runs as a round pings."""

    def __init__(self, on_ping=lambda: None):
        self.calls = 0
        self.on_ping = on_ping

    async def ping(self, address, count, timeout_s, payload_bytes, gap_s):
        self.calls += 1
        self.on_ping()
        return [PacketResult(time.time(), 1.0) for _ in range(count)]


def prober_for(pinger: FakePinger, sink, paused) -> Prober:
    prober = Prober(FAST, sink, pinger=pinger, rng=random.Random(5), batch_window_s=0.01,
                    paused=paused)
    prober.set_peers(PEERS)
    return prober


async def test_a_paused_prober_takes_no_samples_and_resumes_after():
    paused = True
    batches: list = []
    pinger = FakePinger()
    prober = prober_for(pinger, batches.append, lambda: paused)
    task = asyncio.create_task(prober.run())
    try:
        await wait_until_async(lambda: prober.rounds_paused >= 6, what="paused rounds")
        assert pinger.calls == 0 and batches == [] and prober.rounds_done == 0
        paused = False
        await wait_until_async(lambda: prober.rounds_done >= 4, what="rounds after the pause")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert pinger.calls == prober.rounds_done == len(batches)
    summaries = [s for batch in batches for s in batch]
    assert all(isinstance(s, PeerSummary) and s.count == 3 for s in summaries)
    assert {s.peer_id for s in summaries} == {"a", "b"}


async def test_a_round_the_pause_begins_in_is_dropped_whole():
    paused = False

    def test_starts() -> None:
        nonlocal paused
        paused = True

    batches: list = []
    pinger = FakePinger(on_ping=test_starts)
    prober = prober_for(pinger, batches.append, lambda: paused)
    task = asyncio.create_task(prober.run())
    try:
        await wait_until_async(lambda: prober.rounds_paused >= 4, what="paused rounds")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert pinger.calls == 1            # the round in flight; every later one skipped
    assert batches == [] and prober.rounds_done == 0


async def test_the_engine_is_testing_from_a_slots_start_until_it_ends_or_its_test_finishes():
    clock = SystemClock()
    tests = ThroughputTests(port=free_port(), sink=lambda result: None, clock=clock,
                            bind_host="127.0.0.1")
    now = epoch_ms(clock)
    # A send slot whose receiver is not there: the sender gives up well before the slot ends.
    send = replace(SLOT, role="send", peer_address="127.0.0.1", port=free_port(),
                   start_ms=now - 1000, duration_s=30.0)
    later = replace(SLOT, test_id="12" * 16, port=tests.port, start_ms=now + 600_000)
    assert not tests.testing(now)
    tests.accept([send, later])
    assert tests.testing(now) and tests.testing(send.end_ms - 1)
    assert not tests.testing(send.start_ms - 1) and not tests.testing(send.end_ms)
    assert tests.testing(later.start_ms) and not tests.testing(later.start_ms - 1)
    run = asyncio.create_task(tests.run())
    try:
        await wait_until_async(lambda: not tests.testing(epoch_ms(clock)), timeout=20,
                               what="the failed send to finish")
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    assert epoch_ms(clock) < send.end_ms      # finished, not ended: quiet no longer


class PausingTests(StandInTests):
    """The stand-in engine, in a test from a slot's start until the test says it finished."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.finished: set[str] = set()

    def testing(self, now_ms: int) -> bool:
        return any(s.start_ms <= now_ms < s.end_ms and s.test_id not in self.finished
                   for s in self.accepted)


class PlannerWithPeers(InProcessPlanner):
    async def register(self, request):
        self.registers.append(request)
        return RegisterAnswer(tuple(PEERS), replace(FAST, interval_s=0.1), "lab", 1)


async def test_an_agent_in_a_throughput_test_skips_its_probe_rounds(tmp_path: Path):
    planner = PlannerWithPeers()
    config = load_config({"planner": "planner.test:50051", "node_id": "tokyo-1",
                          "address": "127.0.0.1", "state_dir": str(tmp_path)},
                         env_reader={"HULK_THROUGHPUT_PORT": "7500"}.get)
    pinger = FakePinger()
    runtime = AgentRuntime(
        config, client=planner, spool=Spool(config.spool_path, config.spool_max), pinger=pinger,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=0.02, report_linger_s=0.02, spool_write_s=0.02,
        report_backoff=Backoff(initial_s=0.02, cap_s=0.05, rng=random.Random(3)),
        rng=random.Random(4), throughput_tests=PausingTests)
    engine = runtime.throughput
    prober = runtime.prober
    task = asyncio.create_task(runtime.run())
    try:
        await wait_until_async(lambda: prober.rounds_done >= 4, timeout=20, what="probe rounds")
        assert prober.rounds_paused == 0
        # A slot that started a second ago and holds the node for half a minute.
        planner.slots = (replace(SLOT, start_ms=epoch_ms(runtime.clock) - 1000, duration_s=30.0),)
        await wait_until_async(lambda: engine.accepted, timeout=20, what="the slot accepted")
        done, calls = prober.rounds_done, pinger.calls
        await wait_until_async(lambda: prober.rounds_paused >= 6, timeout=20,
                               what="rounds skipped in the test")
        assert prober.rounds_done == done and pinger.calls == calls
        engine.finished.add(SLOT.test_id)
        await wait_until_async(lambda: prober.rounds_done > done, timeout=20,
                               what="probing again once the test finished")
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
