"""Calls that hold a planner's slots: half-open Register calls and endless Health/Watch
streams, opened on their own event loop (tests/planner/security/test_call_slots.py and
bench/grpc_slots_bench.py)."""

from __future__ import annotations

import asyncio
import threading

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2

REGISTER = "/hulk.v1.Planner/Register"
WATCH = "/grpc.health.v1.Health/Watch"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


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
