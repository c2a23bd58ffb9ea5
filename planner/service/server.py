"""The planner's gRPC side: a domain service (validation + store) and a thin grpc.aio servicer.

- ``IngestService`` is plain Python: registration, reports and heartbeats in, plain results out.
  It validates every sample before anything is stored:
    * a report from a node that never registered -> ``NotFoundError`` (the agent registers again);
    * a malformed batch (no batch id, too many samples, a negative RTT, an RTT above the probe's
      timeout, an impossible timestamp, a node probing itself) -> ``InputError``; nothing of the
      batch is stored, the rejected samples are counted;
    * a sample faster than light between the two nodes' cities (``hulk.geo.min_rtt_ms``; unknown
      cities skip the check) or to an unknown peer is a measurement error: that sample is
      rejected, counted and logged, the rest of the batch is stored (``ReportResponse.rejected``).
- ``PlannerServicer`` converts protos to domain values, runs the domain call on the store's
  thread, converts back. Errors become gRPC status codes in one place: ``STATUS_FOR``.
- ``create_server`` builds the grpc.aio server (health service included, message size limit set,
  interceptors passed through so authentication can be added without touching the servicer).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from hulk import errors, geo
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.core.rollup import bucket_index
from planner.service.store import GpuInfo, LaunchInfo, NodeRef, Registration, Store

log = logging.getLogger(__name__)

SERVICE_NAME = "hulk.v1.Planner"
DAY_MS = 86_400_000


@dataclass(frozen=True)
class ProbeSettings:
    """What agents are told to do (RegisterResponse.settings)."""

    interval_s: float = 60.0
    packets_per_round: int = 3
    timeout_s: float = 2.0
    payload_bytes: int = 56
    max_concurrency: int = 64
    max_batch: int = 2000


@dataclass(frozen=True)
class ServerLimits:
    max_batch_samples: int = 10_000          # a Report with more samples is refused
    max_message_bytes: int = 16 << 20        # gRPC receive limit
    future_tolerance_ms: int = DAY_MS        # clock skew allowed on sent_at_ms


class SampleIn(NamedTuple):
    """One probe sample as the domain sees it."""

    peer_id: str
    sent_at_ms: int
    kind: int
    payload_bytes: int
    lost: bool
    rtt_ms: float
    timeout_ms: float


@dataclass(frozen=True)
class RegisterResult:
    peers: list[dict[str, Any]]
    settings: ProbeSettings
    fleet: str
    server_time_ms: int


@dataclass(frozen=True)
class ReportResult:
    accepted: int
    rejected: int
    duplicate: bool


@dataclass(frozen=True)
class HeartbeatResult:
    server_time_ms: int
    reregister: bool
    peers_changed: bool


class BatchTooLargeError(errors.InputError):
    """A Report over the server's sample limit."""


REASON_BELOW_LIGHT = "below_light_speed"
REASON_UNKNOWN_PEER = "unknown_peer"
REASON_INVALID_BATCH = "invalid_batch"


@dataclass
class IngestService:
    """The domain side of Register/Report/Heartbeat. Not thread-safe: call from one thread."""

    store: Store
    fleet: str = "default"
    settings: ProbeSettings = field(default_factory=ProbeSettings)
    limits: ServerLimits = field(default_factory=ServerLimits)
    light_bound: Callable[[tuple[float, float] | None, tuple[float, float] | None], float] = \
        geo.min_rtt_ms
    clock: Callable[[], int] = lambda: int(time.time() * 1000)

    def __post_init__(self) -> None:
        self._nodes: dict[str, NodeRef] = self.store.node_refs()
        self._bounds: dict[tuple[int, int], float] = {}

    # -------------------------------------------------------------------------------- nodes

    def _node(self, node_id: str) -> NodeRef:
        node = self._nodes.get(node_id)
        if node is None:
            # Another process (fleet import) may have added it; look once more before refusing.
            self._nodes = self.store.node_refs()
            node = self._nodes.get(node_id)
        if node is None:
            raise errors.NotFoundError(f"node {node_id!r} is not registered; call Register first")
        return node

    def _bound_ms(self, a: NodeRef, b: NodeRef) -> float:
        key = (a.idx, b.idx)
        bound = self._bounds.get(key)
        if bound is None:
            bound = self.light_bound(_where(a), _where(b))
            self._bounds[key] = bound
        return bound

    def register(self, reg: Registration) -> RegisterResult:
        if not reg.node_id or not reg.node_id.strip():
            raise errors.InputError("expected a non-empty node id", field="node_id")
        if reg.latitude is not None and not (-90 <= reg.latitude <= 90
                                             and -180 <= reg.longitude <= 180):
            raise errors.InputError(f"expected latitude in [-90, 90] and longitude in "
                                    f"[-180, 180], got {reg.latitude}, {reg.longitude}",
                                    field="location")
        node, _ = self.store.register(reg)
        self._nodes[node.id] = node
        self._bounds.clear()  # the node may have moved
        log.info("registered %s (%s, %s, %d GPUs%s)", reg.node_id, reg.address or "no address",
                 reg.city or "no city", len(reg.gpus),
                 f": {reg.gpu_unavailable_reason}" if reg.gpu_unavailable_reason else "")
        return RegisterResult(self.store.peers(reg.node_id), self.settings, self.fleet,
                              self.clock())

    def heartbeat(self, node_id: str, *, spool_depth: int = 0, spool_dropped: int = 0,
                  launch: LaunchInfo | None = None) -> HeartbeatResult:
        _check_count("spool_depth", spool_depth)
        _check_count("spool_dropped", spool_dropped)
        try:
            changed = self.store.heartbeat(node_id, spool_depth=spool_depth,
                                           spool_dropped=spool_dropped, launch=launch)
        except errors.NotFoundError:
            return HeartbeatResult(self.clock(), reregister=True, peers_changed=False)
        return HeartbeatResult(self.clock(), reregister=False, peers_changed=changed)

    # ------------------------------------------------------------------------------ reports

    def report(self, node_id: str, batch_id: str, samples: Sequence[SampleIn],
               spool_dropped: int = 0) -> ReportResult:
        _check_count("spool_dropped", spool_dropped)
        node = self._node(node_id)
        try:
            rows, rejected = self._validate(node, batch_id, samples)
        except errors.InputError:
            self.store.count_rejected(node, REASON_INVALID_BATCH, len(samples))
            raise
        accepted, n_rejected, duplicate = self.store.store_batch(node, batch_id, rows, rejected,
                                                                 spool_dropped)
        return ReportResult(accepted, n_rejected, duplicate)

    def _validate(self, node: NodeRef, batch_id: str, samples: Sequence[SampleIn]):
        if not batch_id:
            raise errors.InputError("expected a non-empty batch id", field="batch_id")
        if len(samples) > self.limits.max_batch_samples:
            raise BatchTooLargeError(f"batch has {len(samples)} samples, the limit is "
                                     f"{self.limits.max_batch_samples}", field="samples")
        now = self.clock()
        latest = now + self.limits.future_tolerance_ms
        default_timeout = self.settings.timeout_s * 1000.0
        nodes = self._nodes
        rows = []
        below = unknown = 0
        reloaded = False
        example = None
        src = node.idx
        for i, s in enumerate(samples):
            peer = nodes.get(s.peer_id)
            if peer is None:
                if not s.peer_id:
                    raise errors.InputError("expected a peer id", field=f"samples[{i}].peer_id")
                if s.peer_id == node.id:
                    raise errors.InputError("a node does not probe itself",
                                            field=f"samples[{i}].peer_id")
                if not reloaded:  # registered since we last looked? check once per batch
                    nodes = self._nodes = self.store.node_refs()
                    reloaded = True
                    peer = nodes.get(s.peer_id)
                if peer is None:
                    unknown += 1
                    continue
            if peer.idx == src:
                raise errors.InputError("a node does not probe itself",
                                        field=f"samples[{i}].peer_id")
            if not 0 < s.sent_at_ms <= latest:
                raise errors.InputError(f"expected a time in epoch ms up to now, got "
                                        f"{s.sent_at_ms}", field=f"samples[{i}].sent_at_ms")
            if s.lost:
                rows.append((src, peer.idx, s.sent_at_ms, s.kind, s.payload_bytes, 1, None, None))
                continue
            rtt = s.rtt_ms
            if not (rtt >= 0.0) or math.isinf(rtt):
                raise errors.InputError(f"expected an RTT >= 0 ms, got {rtt}",
                                        field=f"samples[{i}].rtt_ms")
            limit = s.timeout_ms if s.timeout_ms > 0 else default_timeout
            if rtt > limit:
                raise errors.InputError(f"RTT {rtt} ms is above the probe's timeout of {limit} ms",
                                        field=f"samples[{i}].rtt_ms")
            bound = self._bound_ms(node, peer)
            if rtt < bound:
                below += 1
                if example is None:
                    example = (peer.id, rtt, bound)
                continue
            rows.append((src, peer.idx, s.sent_at_ms, s.kind, s.payload_bytes, 0, rtt,
                         bucket_index(rtt)))
        rejected = {}
        if below:
            rejected[REASON_BELOW_LIGHT] = below
            peer_id, rtt, bound = example
            log.warning("rejected %d sample(s) from %s below the speed-of-light bound, e.g. "
                        "%s -> %s %.3f ms < %.3f ms", below, node.id, node.id, peer_id, rtt, bound)
        if unknown:
            rejected[REASON_UNKNOWN_PEER] = unknown
            log.warning("rejected %d sample(s) from %s to unregistered peers", unknown, node.id)
        return rows, rejected


def _check_count(name: str, value: int) -> None:
    """uint64 counters from the wire must fit SQLite's signed 64-bit INTEGER."""
    if not 0 <= value < 2 ** 63:
        raise errors.InputError(f"expected a count between 0 and 2**63-1, got {value}", field=name)


def _where(node: NodeRef) -> tuple[float, float] | None:
    if node.latitude is not None and node.longitude is not None:
        return (node.latitude, node.longitude)
    return geo.coordinates(node.city)


# ------------------------------------------------------------------------------ the servicer

# The one place where domain errors become gRPC status codes. First match wins (subclasses first).
STATUS_FOR: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (BatchTooLargeError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.InputError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.RateLimitedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.StoreError, grpc.StatusCode.UNAVAILABLE),
    (errors.UnavailableError, grpc.StatusCode.UNAVAILABLE),
]


def status_for(exc: BaseException) -> grpc.StatusCode:
    for kind, code in STATUS_FOR:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


class PlannerServicer(hulk_pb2_grpc.PlannerServicer):
    """Proto in, one domain call on the store's thread, proto out."""

    def __init__(self, service: IngestService, executor: ThreadPoolExecutor):
        self.service = service
        self.executor = executor

    async def _call(self, context: grpc.aio.ServicerContext, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))
        except errors.HulkError as exc:
            code = status_for(exc)
            if code == grpc.StatusCode.UNAVAILABLE:
                log.error("%s", exc)
            await context.abort(code, str(exc))
        except Exception as exc:  # a bug: log it fully, answer INTERNAL without internals
            log.exception("unexpected error in %s", getattr(fn, "__name__", fn))
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")

    async def Register(self, request: hulk_pb2.RegisterRequest, context):
        loc = request.location
        inv = request.inventory
        reg = Registration(
            node_id=request.node_id, hostname=request.hostname, city=loc.city.strip() or None,
            latitude=loc.latitude if loc.has_coordinates else None,
            longitude=loc.longitude if loc.has_coordinates else None,
            agent_version=request.agent_version,
            gpus=tuple(GpuInfo(g.name, g.uuid, g.compute_capability, g.memory_bytes)
                       for g in inv.gpus),
            driver_version=inv.driver_version, gpu_unavailable_reason=inv.unavailable_reason,
            address=request.address, probe_port=request.probe_port)
        result: RegisterResult = await self._call(context, self.service.register, reg)
        s = result.settings
        return hulk_pb2.RegisterResponse(
            peers=[hulk_pb2.Peer(node_id=p["node_id"], address=p["address"],
                                 probe_port=p["probe_port"]) for p in result.peers],
            settings=hulk_pb2.ProbeSettings(
                interval_s=s.interval_s, packets_per_round=s.packets_per_round,
                timeout_s=s.timeout_s, payload_bytes=s.payload_bytes,
                max_concurrency=s.max_concurrency, max_batch=s.max_batch),
            fleet=result.fleet, server_time_ms=result.server_time_ms)

    async def Report(self, request: hulk_pb2.ReportRequest, context):
        samples = [SampleIn(s.peer_id, s.sent_at_ms, s.kind, s.payload_bytes, s.lost, s.rtt_ms,
                            s.timeout_ms) for s in request.samples]
        result: ReportResult = await self._call(context, self.service.report, request.node_id,
                                                request.batch_id, samples, request.spool_dropped)
        return hulk_pb2.ReportResponse(accepted=result.accepted, rejected=result.rejected,
                                       duplicate=result.duplicate)

    async def Heartbeat(self, request: hulk_pb2.HeartbeatRequest, context):
        launch = None
        if request.HasField("launch") and request.launch.state:
            l_ = request.launch
            if l_.state not in hulk_pb2.LaunchState.values():  # an enum value from a newer agent
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"launch.state: unknown LaunchState value {l_.state}")
            launch = LaunchInfo(plan_id=l_.plan_id, job=l_.job,
                                state=hulk_pb2.LaunchState.Name(l_.state).removeprefix(
                                    "LAUNCH_STATE_").lower(),
                                exit_code=l_.exit_code, detail=l_.detail,
                                changed_at_ms=l_.changed_at_ms)
        result: HeartbeatResult = await self._call(
            context, self.service.heartbeat, request.node_id, spool_depth=request.spool_depth,
            spool_dropped=request.spool_dropped, launch=launch)
        return hulk_pb2.HeartbeatResponse(server_time_ms=result.server_time_ms,
                                          reregister=result.reregister,
                                          peers_changed=result.peers_changed)


async def create_server(service: IngestService, listen: str, executor: ThreadPoolExecutor, *,
                        credentials: grpc.ServerCredentials | None = None,
                        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                        limits: ServerLimits | None = None
                        ) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """A started-ready (not yet started) grpc.aio server with the Planner and health services.

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


# ------------------------------------------------------------------------------- the runtime

@dataclass
class BackgroundTask:
    """A periodic job of the serve runtime. ``run`` is called every ``interval_s`` seconds; a
    failure is logged and the job goes on. ``in_store_thread`` runs a sync function on the store's
    thread (for jobs that touch the store); otherwise ``run`` is an async function."""

    name: str
    run: Callable[[], Any]
    interval_s: float
    in_store_thread: bool = True
    run_at_start: bool = False


class PlannerRuntime:
    """`hulk-planner serve`: the store, the gRPC server and periodic jobs, started and stopped
    together. Later features add themselves with ``add_task`` (e.g. MQTT, re-planning) and
    ``interceptors`` (authentication) before ``start``."""

    def __init__(self, db_path: str, listen: str, *, fleet: str = "default",
                 credentials: grpc.ServerCredentials | None = None,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 raw_days: int = 7, window_days: int = 90,
                 settings: ProbeSettings | None = None, limits: ServerLimits | None = None,
                 rollup_interval_s: float = 30.0, prune_interval_s: float = 3600.0,
                 store_factory: Callable[..., Store] = Store):
        self.db_path, self.listen, self.fleet = db_path, listen, fleet
        self.credentials = credentials
        self.interceptors = list(interceptors)
        self.window_days = window_days
        self.store_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        # The store lives on its executor's thread: every call goes through ``in_store``.
        self.store: Store = self.store_executor.submit(
            store_factory, db_path, raw_days=raw_days,
            rollup_days=max(window_days, 90)).result()
        self.service = IngestService(self.store, fleet=fleet,
                                     settings=settings or ProbeSettings(),
                                     limits=limits or ServerLimits())
        self.tasks: list[BackgroundTask] = [
            BackgroundTask("rollup", self.store.rollup_pending, rollup_interval_s),
            BackgroundTask("prune", self.store.prune, prune_interval_s, run_at_start=True),
        ]
        self.server: grpc.aio.Server | None = None
        self.health: HealthServicer | None = None
        self.port: int | None = None
        self._running: list[asyncio.Task] = []
        self._stopped: asyncio.Event | None = None  # made in start (needs a running loop)

    def add_task(self, task: BackgroundTask) -> None:
        self.tasks.append(task)

    def add_interceptor(self, interceptor: grpc.aio.ServerInterceptor) -> None:
        if self.server is not None:
            raise RuntimeError("interceptors must be added before start()")
        self.interceptors.append(interceptor)

    async def in_store(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the store's thread (the only thread that touches the store)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.store_executor, lambda: fn(*args, **kwargs))

    async def start(self) -> int:
        self._stopped = asyncio.Event()
        self.server, self.port, self.health = await create_server(
            self.service, self.listen, self.store_executor, credentials=self.credentials,
            interceptors=self.interceptors, limits=self.service.limits)
        await self.server.start()
        for task in self.tasks:
            self._running.append(asyncio.create_task(self._loop(task), name=task.name))
        return self.port

    async def _loop(self, task: BackgroundTask) -> None:
        first = True
        while True:
            if not (first and task.run_at_start):
                await asyncio.sleep(task.interval_s)
            first = False
            try:
                if task.in_store_thread:
                    result = await self.in_store(task.run)
                else:
                    result = await task.run()
                log.debug("%s: %s", task.name, result)
            except asyncio.CancelledError:
                raise
            except Exception:  # periodic jobs log and go on
                log.exception("background task %s failed; retrying in %.0f s", task.name,
                              task.interval_s)

    def request_stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self, grace_s: float = 5.0) -> None:
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(grace_s)
        for t in self._running:
            t.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()
        try:
            await self.in_store(self.store.rollup_pending)  # leave the rollups current
        except errors.HulkError as exc:
            log.error("final rollup failed: %s", exc)
        await self.in_store(self.store.close)
        self.store_executor.shutdown(wait=True)
