"""A small in-test Planner servicer on 127.0.0.1: records what agents send, stores batches once.

A test double for hulk-planner serve; real gRPC, real sockets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from hulk.v1 import hulk_pb2, hulk_pb2_grpc


@dataclass
class Recorded:
    registers: list[hulk_pb2.RegisterRequest] = field(default_factory=list)
    reports: list[hulk_pb2.ReportRequest] = field(default_factory=list)       # every call
    heartbeats: list[hulk_pb2.HeartbeatRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    stored: dict[str, list[hulk_pb2.Sample]] = field(default_factory=dict)    # batch_id -> samples
    stored_summaries: dict[str, list[hulk_pb2.PeerSummary]] = field(default_factory=dict)


@dataclass(frozen=True)
class Round:
    """A stored record read as a round: a raw sample is a round of one packet."""

    peer_id: str
    at_ms: int
    packets: int
    lost: int
    max_rtt_ms: float


class PlannerDouble(hulk_pb2_grpc.PlannerServicer):
    def __init__(self, peers=(), settings: hulk_pb2.ProbeSettings | None = None,
                 fleet: str = "test", require_token: str | None = None):
        self.peers = list(peers)
        self.settings = settings or hulk_pb2.ProbeSettings()
        self.fleet = fleet
        self.require_token = require_token
        self.seen = Recorded()
        self.fail_after_store = 0       # Report: store, then answer UNAVAILABLE (a lost ack)
        self.reregister_next = False    # next Heartbeat answers reregister=True
        self.changed = asyncio.Event()

    async def _check(self, context) -> None:
        metadata = {k: v for k, v in context.invocation_metadata()}
        self.seen.metadata.append(metadata)
        if self.require_token is not None and \
                metadata.get("authorization") != f"Bearer {self.require_token}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    async def Register(self, request, context):
        await self._check(context)
        self.seen.registers.append(request)
        self.changed.set()
        return hulk_pb2.RegisterResponse(
            peers=[hulk_pb2.Peer(node_id=n, address=a, probe_port=p) for n, a, p in self.peers],
            settings=self.settings, fleet=self.fleet, server_time_ms=1)

    async def Report(self, request, context):
        await self._check(context)
        self.seen.reports.append(request)
        duplicate = request.batch_id in self.seen.stored
        if not duplicate:
            self.seen.stored[request.batch_id] = list(request.samples)
            self.seen.stored_summaries[request.batch_id] = list(request.summaries)
        self.changed.set()
        if self.fail_after_store > 0:
            self.fail_after_store -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "ack lost on purpose")
        return hulk_pb2.ReportResponse(accepted=0 if duplicate else
                                       len(request.samples) + len(request.summaries),
                                       duplicate=duplicate)

    async def Heartbeat(self, request, context):
        await self._check(context)
        self.seen.heartbeats.append(request)
        self.changed.set()
        reregister, self.reregister_next = self.reregister_next, False
        return hulk_pb2.HeartbeatResponse(server_time_ms=2, reregister=reregister)

    def stored_samples(self) -> list[hulk_pb2.Sample]:
        return [s for batch in self.seen.stored.values() for s in batch]

    def stored_summaries(self) -> list[hulk_pb2.PeerSummary]:
        return [s for batch in self.seen.stored_summaries.values() for s in batch]

    def stored_rounds(self) -> list[Round]:
        """Every stored record, summaries and raw samples alike, as rounds."""
        return ([Round(s.peer_id, s.sent_at_ms, 1, int(s.lost), 0.0 if s.lost else s.rtt_ms)
                 for s in self.stored_samples()]
                + [Round(s.peer_id, s.round_start_ms, s.count, s.lost, s.rtt_max_ms)
                   for s in self.stored_summaries()])


async def start_server(servicer: PlannerDouble, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    hulk_pb2_grpc.add_PlannerServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound
