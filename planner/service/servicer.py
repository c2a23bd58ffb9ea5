"""The planner's gRPC face: a thin grpc.aio servicer over ``IngestService``, and the server.

- ``PlannerServicer``: proto in -> ``Record.from_proto`` -> one domain call on the store's
  thread -> ``.to_proto()`` out. Errors become gRPC status codes through ``hulk.errors.grpc_status``, the one table.
- ``create_server`` builds the grpc.aio server (health service included, message size limit set,
  interceptors passed through so authentication can be added without touching the servicer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from hulk import errors
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.records import HeartbeatRequest, RegisterRequest, ReportRequest
from planner.service.ingest import IngestService, ServerLimits

log = logging.getLogger(__name__)

SERVICE_NAME = "hulk.v1.Planner"

class PlannerServicer(hulk_pb2_grpc.PlannerServicer):
    """Proto in, one domain call on the store's thread, proto out."""

    def __init__(self, service: IngestService, executor: ThreadPoolExecutor):
        self.service = service
        self.executor = executor

    async def _answer(self, context: grpc.aio.ServicerContext, call: Callable[[Any], Any],
                      record: type, request: Any) -> Any:
        """``call(record.from_proto(request)).to_proto()``, the call on the store's thread."""
        loop = asyncio.get_running_loop()
        try:
            value = record.from_proto(request)
            result = await loop.run_in_executor(self.executor, call, value)
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


async def create_server(service: IngestService, listen: str, executor: ThreadPoolExecutor, *,
                        credentials: grpc.ServerCredentials | None = None,
                        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                        limits: ServerLimits | None = None
                        ) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """A ready (not yet started) grpc.aio server with the Planner and health services.

    ``credentials`` None means plaintext. Returns (server, bound port, health servicer)."""
    limits = limits or service.limits
    server = grpc.aio.server(
        interceptors=list(interceptors),
        options=[("grpc.max_receive_message_length", limits.max_message_bytes),
                 ("grpc.max_send_message_length", limits.max_message_bytes),
                 ("grpc.so_reuseport", 0)])
    hulk_pb2_grpc.add_PlannerServicer_to_server(PlannerServicer(service, executor), server)
    health = HealthServicer()
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
