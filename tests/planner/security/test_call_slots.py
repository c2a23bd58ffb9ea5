"""Authentication before any resource: real gRPC over TLS against the real planner server.
Calls whose body never arrives, with no token or a valid one, and Health/Watch streams that never
end, 1,100 of them at once from one client (the issue's count), hold none of the server's
concurrent-call slots: an enrolled agent's Register, Heartbeat and Report are each answered
within 1 s while they are open. Unauthenticated half-open calls wait apart from enrolled nodes'
ones, and an enrolled node's ones are counted per node, so neither refuses an agent that shares
their source address (a NAT, a host with several agents)."""

from __future__ import annotations

import time

import grpc

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.security.guard import CallLimits
from planner.service.ingest import ServerLimits

from bench.call_holder import Holder
from tests.helpers.threaded_planner import (ThreadedPlanner, bearer, channel, register_request,
                                            sample)


def answered_within(stub, token: str, bound_s: float = 1.0, node: str = "n1",
                    peer: str = "n2") -> list[float]:
    """Seconds each of an enrolled node's Register, Heartbeat and Report took."""
    took = []
    for call, request in (
            (stub.Register, register_request(node, "127.0.0.2")),
            (stub.Heartbeat, hulk_pb2.HeartbeatRequest(node_id=node)),
            (stub.Report, hulk_pb2.ReportRequest(node_id=node, batch_id="b1",
                                                 samples=[sample(peer)]))):
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
        # Every call but the watchers under the per-source cap was refused at once: the
        # Registers without a token by the guard (UNAUTHENTICATED), the watchers past the cap
        # by the guard (RESOURCE_EXHAUSTED), and whatever the one connection opened past its
        # streams (ServerLimits.max_streams_per_connection) by the transport (REFUSED_STREAM,
        # UNAVAILABLE); none was held waiting for a body, none dropped by the server (CANCELLED).
        limits = planner.guard.call_limits
        assert holder.open_count() == limits.watchers_per_source, holder.ended
        assert sum(holder.ended.values()) == 1100 - limits.watchers_per_source, holder.ended
        assert set(holder.ended) <= {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}, \
            holder.ended
        assert holder.ended.get("UNAUTHENTICATED", 0) > 0, holder.ended
        assert planner.guard.pending.open == 0
    finally:
        holder.close()


def test_an_enrolled_token_cannot_hold_calls_past_the_body_deadline(tmp_path, pki):
    """Half-open calls with a valid token count against their node's cap and end at the body
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
    cap = limits.enrolled_pending_per_node
    holder = Holder(planner.target, pki["ca"].read_bytes(), 2 * (cap + 20), token=n1.token)
    try:
        assert holder.ended.get("RESOURCE_EXHAUSTED", 0) >= 20, holder.ended
        deadline = time.monotonic() + limits.body_timeout_s + 5
        while time.monotonic() < deadline and holder.ended.get("DEADLINE_EXCEEDED", 0) < cap:
            time.sleep(0.2)
        assert holder.ended.get("DEADLINE_EXCEEDED", 0) == cap, holder.ended
        assert max(answered_within(stub_for(), n1.token)) < 1.0
    finally:
        holder.close()
        for ch in channels:
            ch.close()
        planner.stop()


def test_unauthenticated_half_open_calls_from_an_agents_address_do_not_refuse_it(
        planner, stub_for, pki):
    """Health/Check is open to anyone: half-open ones from the agent's own address (a NAT it
    shares, its own host) fill that address's cap, and the agent is still answered; before,
    they took the places its calls wait in and it was refused (RESOURCE_EXHAUSTED)."""
    n1 = planner.credentials.issue("n1")
    planner.credentials.issue("n2")
    limits = planner.guard.call_limits
    holder = Holder(planner.target, pki["ca"].read_bytes(), limits.pending_per_source + 20,
                    kinds=("check",))
    try:
        assert holder.open_count() == limits.pending_per_source, holder.ended
        assert planner.guard.pending.by_source == {"127.0.0.1": limits.pending_per_source}
        assert max(answered_within(stub_for(), n1.token)) < 1.0
    finally:
        holder.close()


def test_one_nodes_half_open_calls_do_not_refuse_another_node_at_its_address(planner, stub_for,
                                                                            pki):
    """An enrolled node that holds its cap of half-open calls refuses only itself: another node
    behind the same address is answered (the cap is per node, not per address)."""
    n1, n2 = planner.credentials.issue("n1"), planner.credentials.issue("n2")
    cap = planner.guard.call_limits.enrolled_pending_per_node
    holder = Holder(planner.target, pki["ca"].read_bytes(), cap + 4, token=n1.token,
                    kinds=("register",))
    try:
        assert holder.open_count() == cap, holder.ended
        assert holder.ended == {"RESOURCE_EXHAUSTED": 4}, holder.ended
        assert max(answered_within(stub_for(), n2.token, node="n2", peer="n1")) < 1.0
    finally:
        holder.close()


def test_one_connection_holds_at_most_its_streams(tmp_path, pki):
    """Past ``max_streams_per_connection`` a connection's further calls are refused by the
    transport or wait on the client's side; the server never holds more of them."""
    streams = 6
    planner = ThreadedPlanner(tmp_path / "planner.sqlite", pki,
                              limits=ServerLimits(max_streams_per_connection=streams))
    n1 = planner.credentials.issue("n1")
    holder = Holder(planner.target, pki["ca"].read_bytes(), 30, token=n1.token,
                    kinds=("register",))
    try:
        held = planner.guard.enrolled_pending.by_source.get("n1", 0)
        assert 0 < held <= streams < planner.guard.call_limits.enrolled_pending_per_node, \
            (held, holder.ended)
        assert set(holder.ended) <= {"UNAVAILABLE"}, holder.ended
    finally:
        holder.close()
        planner.stop()


def test_unauthenticated_callers_cannot_take_more_than_their_share_of_the_slots():
    """What unauthenticated calls may hold at once (waiting for a body, or a Health/Watch
    stream), and what enrolled ones may hold waiting, leave calls being served their room."""
    limits, server = CallLimits(), ServerLimits()
    unauthenticated = limits.pending_total + limits.watchers_total
    assert unauthenticated + limits.enrolled_pending_total < server.max_concurrent_rpcs
    assert limits.pending_per_source < limits.pending_total
    assert limits.enrolled_pending_per_node < limits.enrolled_pending_total
