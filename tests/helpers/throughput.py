"""Shared set-ups for the agent's throughput tests: a slot, a stand-in engine with
ThroughputTests' constructor, accept(), testing() and run(), and an in-process planner client."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from hulk import errors
from hulk.wire.records import HeartbeatResult, ProbeSettings, RegisterAnswer, ReportResult
from hulk.wire.throughput import SECRET_BYTES, ThroughputResult, ThroughputSlot

SLOT = ThroughputSlot(test_id="ab" * 16, role="receive", peer_id="osaka-1",
                      peer_address="10.0.0.9", port=7500, start_ms=1_764_150_000_000,
                      duration_s=3.0, streams=4, secret=bytes(SECRET_BYTES))
SEND = replace(SLOT, test_id="cd" * 16, role="send", peer_id="osaka-2")
BAD = replace(SLOT, test_id="ef" * 16, streams=99)


def result_of(slot: ThroughputSlot) -> ThroughputResult:
    return ThroughputResult(test_id=slot.test_id, sender_id=slot.peer_id,
                            start_ms=slot.start_ms + 1000, duration_s=2.5, bytes=3_125_000_000,
                            streams=slot.streams, gbps=10.0, ok=True)


class StandInTests:
    """ThroughputTests as the spec has it: dedupes slots by (test_id, role), skips malformed
    ones; run() 'receives' each accepted receive slot and hands its result to the sink."""

    made: list[StandInTests] = []

    def __init__(self, *, port, sink, clock, bind_host):
        self.port, self.sink, self.clock, self.bind_host = port, sink, clock, bind_host
        self.accepted: list[ThroughputSlot] = []
        self._due: asyncio.Queue[ThroughputSlot] = asyncio.Queue()
        self.offered: list[ThroughputSlot] = []
        StandInTests.made.append(self)

    def accept(self, slots) -> None:
        self.offered.extend(slots)
        for slot in slots:
            try:
                slot.check()
            except errors.InputError:
                continue
            if (slot.test_id, slot.role) not in {(s.test_id, s.role) for s in self.accepted}:
                self.accepted.append(slot)
                self._due.put_nowait(slot)

    def testing(self, now_ms: int) -> bool:
        return False

    async def run(self) -> None:
        while True:
            slot = await self._due.get()
            if slot.role == "receive":
                self.sink(result_of(slot))


class InProcessPlanner:
    """A PlannerClient: every heartbeat answers ``slots``; Report stores a batch once by its id
    and loses the first ``lose_acks`` answers after storing."""

    def __init__(self, slots=(), lose_acks: int = 0):
        self.slots = tuple(slots)
        self.lose_acks = lose_acks
        self.registers = []
        self.heartbeats = 0
        self.reports: list[tuple[str, tuple]] = []
        self.stored: dict[str, tuple] = {}

    async def register(self, request):
        self.registers.append(request)
        return RegisterAnswer((), ProbeSettings(), "lab", 1)

    async def report(self, node_id, batch_id, samples, spool_dropped):
        self.reports.append((batch_id, samples))
        duplicate = batch_id in self.stored
        self.stored.setdefault(batch_id, samples)
        if self.lose_acks:
            self.lose_acks -= 1
            raise errors.UnavailableError("planner Report: the answer was lost")
        return ReportResult(0 if duplicate else len(samples), 0, duplicate)

    async def heartbeat(self, node_id, time_ms, spool_depth, spool_dropped, launch):
        self.heartbeats += 1
        return HeartbeatResult(2, throughput_slots=self.slots)

    async def close(self):
        pass

    def stored_results(self) -> list[ThroughputResult]:
        return [r for batch in self.stored.values() for r in batch
                if isinstance(r, ThroughputResult)]
