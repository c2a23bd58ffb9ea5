"""The planner's gRPC face: a thin grpc.aio servicer over ``IngestService``, and the server.

- ``PlannerServicer``: proto in -> ``Record.from_proto`` -> one domain call on the store's
  thread -> ``.to_proto()`` out. Errors become gRPC status codes through ``hulk.errors.grpc_status``, the one table.
- ``create_server`` builds the grpc.aio server (health service included, interceptors passed
  through so authentication can be added without touching the servicer). Each method reads its
  request through :func:`tolerant_parser`: bytes over the method's size bound or that do not parse
  answer INVALID_ARGUMENT with a one-line reason (grpc's own parser failure answers UNKNOWN), and
  the server takes at most ``ServerLimits.max_concurrent_rpcs`` calls at once. One connection
  holds at most ``max_streams_per_connection`` streams, and its handshake, idle time and age are
  bounded (:func:`connection_options`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from hulk import errors
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.records import HeartbeatRequest, RegisterRequest, ReportRequest
from planner.service.ingest import IngestService, ServerLimits

log = logging.getLogger(__name__)

SERVICE_NAME = "hulk.v1.Planner"

class Unreadable(NamedTuple):
    """A request the server could not read; the servicer answers with ``error``."""

    error: errors.HulkError


def tolerant_parser(message: Any, limit: int) -> Callable[[bytes], Any]:
    """``message.FromString`` that returns :class:`Unreadable` instead of raising."""
    name = message.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        if len(data) > limit:
            return Unreadable(errors.BatchTooLargeError(
                f"a {name} of {len(data)} bytes; the limit is {limit}", field="request"))
        try:
            return message.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:
            return Unreadable(errors.InputError(f"not a {name} message ({exc})".splitlines()[0],
                                                field="request"))

    return parse


class StoreHealth:
    """Whether the store takes writes, as the standard health service says it.

    A failed store call turns every service NOT_SERVING (load balancers and probes stop sending
    agents here); the next successful one turns them SERVING again."""

    def __init__(self) -> None:
        self.health: HealthServicer | None = None
        self.serving = True

    async def report(self, ok: bool) -> None:
        if ok == self.serving or self.health is None:
            return
        self.serving = ok
        status = (health_pb2.HealthCheckResponse.SERVING if ok
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)
        if ok:
            log.info("the store takes writes again: health SERVING")
        else:
            log.error("the store failed: health NOT_SERVING until it takes a write again")


class PlannerServicer(hulk_pb2_grpc.PlannerServicer):
    """Proto in, one domain call on the store's thread, proto out."""

    def __init__(self, service: IngestService, executor: ThreadPoolExecutor,
                 store_health: StoreHealth | None = None):
        self.service = service
        self.executor = executor
        self.store_health = store_health or StoreHealth()

    async def _answer(self, context: grpc.aio.ServicerContext, call: Callable[[Any], Any],
                      record: type, request: Any) -> Any:
        """``call(record.from_proto(request)).to_proto()``, the call on the store's thread."""
        loop = asyncio.get_running_loop()
        try:
            if isinstance(request, Unreadable):
                raise request.error
            try:
                value = record.from_proto(request)
            except (ValueError, TypeError, OverflowError) as exc:
                raise errors.InputError(f"unreadable {type(request).__name__}: {exc}",
                                        field="request") from None
            try:
                result = await loop.run_in_executor(self.executor, call, value)
            except errors.StoreError:
                await self.store_health.report(False)
                raise
            await self.store_health.report(True)
            return result.to_proto()
        except errors.HulkError as exc:
            code = errors.grpc_status(exc)
            if code == grpc.StatusCode.UNAVAILABLE:
                log.error("%s", exc)
            await context.abort(code, str(exc))
        except Exception as exc:  # a bug: log it fully, answer INTERNAL without internals
            log.exception("unexpected error in %s", getattr(call, "__name__", call))
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")

    async def Register(self, request: hulk_pb2.RegisterRequest, context):
        return await self._answer(context, self.service.register, RegisterRequest, request)

    async def Report(self, request: hulk_pb2.ReportRequest, context):
        return await self._answer(context, self.service.report, ReportRequest, request)

    async def Heartbeat(self, request: hulk_pb2.HeartbeatRequest, context):
        return await self._answer(context, self.service.heartbeat, HeartbeatRequest, request)


def connection_options(limits: ServerLimits) -> list[tuple[str, int]]:
    """The gRPC server options that bound one connection, whoever holds it and before any token
    is checked: streams open at once, the handshake, time with no call open, and age (a GOAWAY,
    then the grace for the calls still open, then the connection is closed)."""
    def ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    return [("grpc.max_concurrent_streams", limits.max_streams_per_connection),
            ("grpc.server_handshake_timeout_ms", ms(limits.handshake_timeout_s)),
            ("grpc.max_connection_idle_ms", ms(limits.max_connection_idle_s)),
            ("grpc.max_connection_age_ms", ms(limits.max_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", ms(limits.max_connection_age_grace_s))]


async def create_server(service: IngestService, listen: str, executor: ThreadPoolExecutor, *,
                        credentials: grpc.ServerCredentials | None = None,
                        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                        limits: ServerLimits | None = None,
                        store_health: StoreHealth | None = None
                        ) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """A ready (not yet started) grpc.aio server with the Planner and health services.

    ``credentials`` None means plaintext. Returns (server, bound port, health servicer)."""
    limits = limits or service.limits
    server = grpc.aio.server(
        interceptors=list(interceptors),
        maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
        options=[("grpc.max_receive_message_length", limits.max_message_bytes),
                 ("grpc.max_send_message_length", limits.max_message_bytes),
                 ("grpc.so_reuseport", 0), *connection_options(limits)])
    store_health = store_health or StoreHealth()
    servicer = PlannerServicer(service, executor, store_health)
    methods = {
        "Register": (servicer.Register, hulk_pb2.RegisterRequest, hulk_pb2.RegisterResponse,
                     limits.max_register_bytes),
        "Report": (servicer.Report, hulk_pb2.ReportRequest, hulk_pb2.ReportResponse,
                   limits.max_message_bytes),
        "Heartbeat": (servicer.Heartbeat, hulk_pb2.HeartbeatRequest, hulk_pb2.HeartbeatResponse,
                      limits.max_heartbeat_bytes),
    }
    handlers = {name: grpc.unary_unary_rpc_method_handler(
                    call, request_deserializer=tolerant_parser(request, limit),
                    response_serializer=response.SerializeToString)
                for name, (call, request, response, limit) in methods.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health = HealthServicer()
    store_health.health = health
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as exc:
        raise errors.ConfigError(f"cannot listen on {listen}: {exc}", field="--listen") from None
    if port == 0:
        raise errors.ConfigError(f"cannot listen on {listen} (address in use or invalid)",
                                 field="--listen")
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health
