"""Calls that hold a planner's slots: half-open Register and Health/Check calls and endless
Health/Watch streams, opened on their own event loop (tests/planner/security/test_call_slots.py
and bench/grpc_slots_bench.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2

REGISTER = "/hulk.v1.Planner/Register"
WATCH = "/grpc.health.v1.Health/Watch"
CHECK = "/grpc.health.v1.Health/Check"
KINDS = ("register", "watch", "check")


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class Holder:
    """``count`` calls opened on their own event loop and kept open, over ``connections``
    channels (each its own connection) per target: call n goes to ``targets[n % len(targets)]``,
    and each target's calls take ``kinds`` in turn, then its connections in turn. "register": a
    Register call whose message never comes (``token``: with that bearer token), "watch": a
    Health/Watch stream, "check": a Health/Check call whose message never comes. A target that
    is another loopback address of the planner's host (127.0.0.2, ...) makes its calls come from
    that source address where the host routes it so (bench/grpc_slots_bench.py)."""

    def __init__(self, targets: str | Sequence[str], ca: bytes, count: int,
                 token: str | None = None, kinds: Sequence[str] = ("watch", "register"),
                 connections: int = 1):
        unknown = set(kinds) - set(KINDS)
        if unknown or not kinds:
            raise ValueError(f"kinds must be some of {KINDS}, not {sorted(unknown)}")
        self.targets = [targets] if isinstance(targets, str) else list(targets)
        self.kinds = tuple(kinds)
        self.connections = connections
        # Each channel its own connection (gRPC would share one among channels to one target).
        self.options = [("grpc.use_local_subchannel_pool", 1)]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.ended: dict[str, int] = {}
        self.details: dict[str, str] = {}
        self.calls: list = []
        self.channels: list[aio.Channel] = []
        self.run(self._open(ca, count, token))

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _open(self, ca: bytes, count: int, token: str | None) -> None:
        credentials = grpc.ssl_channel_credentials(ca)
        self.channels = [aio.secure_channel(t, credentials, options=self.options)
                         for t in self.targets for _ in range(self.connections)]

        async def never():
            await asyncio.sleep(3600)
            yield b""

        metadata = bearer(token) if token else ()
        register = [ch.stream_unary(REGISTER) for ch in self.channels]
        check = [ch.stream_unary(CHECK) for ch in self.channels]
        watch = [ch.unary_stream(
            WATCH, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
            for ch in self.channels]
        sources, kinds = len(self.targets), len(self.kinds)
        for n in range(count):
            turn = n // sources
            at = (n % sources) * self.connections + (turn // kinds) % self.connections
            kind = self.kinds[turn % kinds]
            if kind == "register":
                call = register[at](never(), metadata=metadata)
            elif kind == "check":
                call = check[at](never())
            else:
                call = watch[at](health_pb2.HealthCheckRequest(service=""))
            self.calls.append(asyncio.ensure_future(self._end(call)))
        await asyncio.sleep(1.0)      # every call has reached the server

    async def _end(self, call) -> None:
        """Wait for ``call`` to end (a stream: read to its end) and count how it ended, keeping
        the first status details seen for each code."""
        try:
            if isinstance(call, aio.UnaryStreamCall):
                async for _ in call:
                    pass
            else:
                await call
            code, details = "OK", ""
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details() or ""
        except asyncio.CancelledError:
            return
        self.ended[code] = self.ended.get(code, 0) + 1
        self.details.setdefault(code, details)

    def open_count(self) -> int:
        return sum(not c.done() for c in self.calls)

    def close(self) -> None:
        async def stop():
            for c in self.calls:
                c.cancel()
            for ch in self.channels:
                await ch.close()
        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
