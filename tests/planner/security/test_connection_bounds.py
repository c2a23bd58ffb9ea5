"""What one connection may hold before (or without) any token: real gRPC over TLS against the
real planner server with its connection bounds shortened (ServerLimits, set as the gRPC
server's options in planner/service/servicer.py connection_options). A connection that never
finishes its handshake, one that opens no call, and one that holds a Health/Watch stream are
each closed after their bound; an enrolled agent's calls, in flight across the age bound or made
every 0.2 s across several, are all answered."""

from __future__ import annotations

import asyncio
import inspect
import socket
import time

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.security.guard import CallLimits
from planner.service.ingest import ServerLimits
from planner.service.servicer import connection_options

from tests.helpers.threaded_planner import ThreadedPlanner, bearer, channel, register_request

SHORT = ServerLimits(handshake_timeout_s=1.0, max_connection_idle_s=1.0,
                     max_connection_age_s=1.5, max_connection_age_grace_s=2.0)


def _default(cls, parameter: str):
    return inspect.signature(cls.__init__).parameters[parameter].default


@pytest.fixture
def short_planner(tmp_path, pki):
    p = ThreadedPlanner(tmp_path / "planner.sqlite", pki, limits=SHORT)
    try:
        yield p
    finally:
        p.stop()


def test_a_connection_that_never_starts_tls_is_closed_after_the_handshake_bound(short_planner):
    host, port = short_planner.target.rsplit(":", 1)
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        assert s.recv(1) == b""                 # closed by the server, nothing sent
    assert time.monotonic() - start < SHORT.handshake_timeout_s + 2


def test_a_connection_with_no_call_is_closed_after_the_idle_bound(short_planner, pki):
    ch = channel(short_planner.target, pki)
    try:
        grpc.channel_ready_future(ch).result(timeout=5)
        states: list[grpc.ChannelConnectivity] = []
        start = time.monotonic()
        ch.subscribe(states.append)
        while grpc.ChannelConnectivity.IDLE not in states and time.monotonic() - start < 10:
            time.sleep(0.05)
        # The server's GOAWAY: the channel is idle again (it would reconnect for a next call).
        assert grpc.ChannelConnectivity.IDLE in states, states
        assert time.monotonic() - start < SHORT.max_connection_idle_s + 2
    finally:
        ch.close()


def test_a_watcher_that_never_authenticates_is_closed_after_the_age_bound(short_planner, pki):
    ch = channel(short_planner.target, pki)
    start = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:
            for _ in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(),
                                                          timeout=20):
                pass
        took = time.monotonic() - start
    finally:
        ch.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
    # age (with gRPC's jitter of up to 10 %) and grace, then the connection is closed
    bound = SHORT.max_connection_age_s * 1.1 + SHORT.max_connection_age_grace_s
    assert SHORT.max_connection_age_s * 0.9 <= took < bound + 1.5, took


def test_an_agents_calls_are_answered_across_the_age_bound(tmp_path, pki):
    """A call in flight when the connection reaches its age finishes within the grace; calls
    made every 0.2 s across several ages all go through (each GOAWAY moves the channel to a
    new connection by itself)."""
    planner = ThreadedPlanner(tmp_path / "planner.sqlite", pki, limits=SHORT,
                              call_limits=CallLimits(body_timeout_s=5.0))
    n1 = planner.credentials.issue("n1")
    ca = pki["ca"].read_bytes()

    async def slow_register() -> hulk_pb2.RegisterResponse:
        """A Register whose body comes 0.2 s after the connection's age bound."""
        async with aio.secure_channel(planner.target, grpc.ssl_channel_credentials(ca)) as ch:
            await ch.channel_ready()
            opened = time.monotonic()

            async def body():
                await asyncio.sleep(SHORT.max_connection_age_s * 1.1 + 0.2
                                    - (time.monotonic() - opened))
                yield register_request("n1").SerializeToString()

            register = ch.stream_unary("/hulk.v1.Planner/Register",
                                       response_deserializer=hulk_pb2.RegisterResponse.FromString)
            return await register(body(), metadata=bearer(n1.token), timeout=10)

    try:
        assert asyncio.run(slow_register()).ByteSize() >= 0
        ch = channel(planner.target, pki)
        stub = hulk_pb2_grpc.PlannerStub(ch)
        failed, calls, start = [], 0, time.monotonic()
        while time.monotonic() - start < 3 * SHORT.max_connection_age_s + 1:
            try:
                stub.Heartbeat(hulk_pb2.HeartbeatRequest(node_id="n1"),
                               metadata=bearer(n1.token), timeout=1)
            except grpc.RpcError as exc:
                failed.append(exc.code())
            calls += 1
            time.sleep(0.2)
        ch.close()
        assert calls >= 15 and not failed, failed
    finally:
        planner.stop()


def test_the_default_bounds_leave_an_agent_alone():
    """serve's defaults: an agent (a heartbeat every 10 s at most, a 10 s call timeout, the
    guard's 10 s body deadline, a few calls at once) never reaches the idle bound, and the
    grace outlasts any call it can have in flight at the age bound."""
    limits = ServerLimits()
    options = dict(connection_options(limits))
    assert options == {"grpc.max_concurrent_streams": 100,
                       "grpc.server_handshake_timeout_ms": 10_000,
                       "grpc.max_connection_idle_ms": 60_000,
                       "grpc.max_connection_age_ms": 1_800_000,
                       "grpc.max_connection_age_grace_ms": 30_000}
    agent_call_s = _default(GrpcPlannerClient, "call_timeout_s")
    assert limits.max_connection_age_grace_s > agent_call_s + CallLimits().body_timeout_s
    assert limits.max_connection_idle_s > _default(AgentRuntime, "heartbeat_interval_s")
    assert limits.max_connection_age_s >= 60 * limits.max_connection_age_grace_s
