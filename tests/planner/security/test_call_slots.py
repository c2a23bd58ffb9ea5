"""Authentication before any resource: real gRPC over TLS against the real planner server.
Calls whose body never arrives, with no token or a valid one, and Health/Watch streams that never
end, 1,100 of them at once from one client (the issue's count), hold none of the server's
concurrent-call slots: an enrolled agent's Register, Heartbeat and Report are each answered
within 1 s while they are open."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.security.guard import CallLimits

from tests.helpers.threaded_planner import (ThreadedPlanner, bearer, channel, register_request,
                                            sample)

REGISTER = "/hulk.v1.Planner/Register"
WATCH = "/grpc.health.v1.Health/Watch"


class Holder:
    """``count`` calls opened on their own event loop and kept open: half of them Register calls
    whose message never comes (``token``: with that bearer token), half Health/Watch streams."""

    def __init__(self, target: str, ca: bytes, count: int, token: str | None = None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.ended: dict[str, int] = {}
        self.calls: list = []
        self.run(self._open(target, ca, count, token))

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _open(self, target: str, ca: bytes, count: int, token: str | None) -> None:
        self.channel = aio.secure_channel(target, grpc.ssl_channel_credentials(ca))

        async def never():
            await asyncio.sleep(3600)
            yield b""

        metadata = bearer(token) if token else ()
        register = self.channel.stream_unary(REGISTER)
        watch = self.channel.unary_stream(
            WATCH, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        for n in range(count):
            if n % 2:
                call = register(never(), metadata=metadata)
                self.calls.append(asyncio.ensure_future(self._end(call)))
            else:
                call = watch(health_pb2.HealthCheckRequest(service=""))
                self.calls.append(asyncio.ensure_future(self._drain(call)))
        await asyncio.sleep(1.0)      # every call has reached the server

    async def _end(self, call) -> None:
        try:
            await call
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        except asyncio.CancelledError:
            return
        self.ended[code] = self.ended.get(code, 0) + 1

    async def _drain(self, call) -> None:
        try:
            async for _ in call:
                pass
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        except asyncio.CancelledError:
            return
        self.ended[code] = self.ended.get(code, 0) + 1

    def open_count(self) -> int:
        return sum(not c.done() for c in self.calls)

    def close(self) -> None:
        async def stop():
            for c in self.calls:
                c.cancel()
            await self.channel.close()
        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


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
