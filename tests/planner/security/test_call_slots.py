"""Authentication before any resource: real gRPC over TLS against the real planner server.
Calls whose body never arrives, with no token or a valid one, and Health/Watch streams that never
end, 1,100 of them at once from one client (the issue's count), hold none of the server's
concurrent-call slots: an enrolled agent's Register, Heartbeat and Report are each answered
within 1 s while they are open."""

from __future__ import annotations

import time

import grpc

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.security.guard import CallLimits

from bench.call_holder import Holder
from tests.helpers.threaded_planner import (ThreadedPlanner, bearer, channel, register_request,
                                            sample)


def answered_within(stub, token: str, bound_s: float = 1.0) -> list[float]:
    """Seconds each of an enrolled node's Register, Heartbeat and Report took."""
    took = []
    for call, request in (
            (stub.Register, register_request("n1", "127.0.0.2")),
            (stub.Heartbeat, hulk_pb2.HeartbeatRequest(node_id="n1")),
            (stub.Report, hulk_pb2.ReportRequest(node_id="n1", batch_id="b1", samples=[sample("n2")]))):
        start = time.monotonic()
        call(request, metadata=bearer(token), timeout=bound_s)
        took.append(time.monotonic() - start)
    return took


def test_unauthenticated_half_open_calls_and_watchers_hold_no_slot(planner, stub_for, pki):
    n1 = planner.credentials.issue("n1")
    planner.credentials.issue("n2")
    stub = stub_for()
    holder = Holder(planner.target, pki["ca"].read_bytes(), 1100)
    try:
        took = answered_within(stub, n1.token)
        assert max(took) < 1.0, took
        # The Registers without a token were refused at once, not held waiting for a body;
        # the watchers beyond the per-source cap were refused, the rest stay open.
        assert holder.ended.get("UNAUTHENTICATED", 0) == 550, holder.ended
        limits = planner.guard.call_limits
        assert holder.open_count() == limits.watchers_per_source, holder.ended
        assert holder.ended.get("RESOURCE_EXHAUSTED", 0) == 550 - limits.watchers_per_source
    finally:
        holder.close()


def test_an_enrolled_token_cannot_hold_calls_past_the_body_deadline(tmp_path, pki):
    """Half-open calls with a valid token count against the per-source cap and end at the body
    deadline (DEADLINE_EXCEEDED), so even an enrolled node cannot pile them up."""
    planner = ThreadedPlanner(tmp_path / "planner.sqlite", pki,
                              call_limits=CallLimits(body_timeout_s=2.0))
    channels: list[grpc.Channel] = []

    def stub_for():
        channels.append(channel(planner.target, pki))
        return hulk_pb2_grpc.PlannerStub(channels[-1])

    n1 = planner.credentials.issue("n1")
    planner.credentials.issue("n2")
    limits = planner.guard.call_limits
    holder = Holder(planner.target, pki["ca"].read_bytes(), 2 * (limits.pending_per_source + 20),
                    token=n1.token)
    try:
        assert holder.ended.get("RESOURCE_EXHAUSTED", 0) >= 20, holder.ended
        deadline = time.monotonic() + limits.body_timeout_s + 5
        while time.monotonic() < deadline and holder.ended.get("DEADLINE_EXCEEDED", 0) < \
                limits.pending_per_source:
            time.sleep(0.2)
        assert holder.ended.get("DEADLINE_EXCEEDED", 0) == limits.pending_per_source, holder.ended
        assert max(answered_within(stub_for(), n1.token)) < 1.0
    finally:
        holder.close()
        for ch in channels:
            ch.close()
        planner.stop()
