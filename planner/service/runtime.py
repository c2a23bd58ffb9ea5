"""`hulk-planner serve` at run time: the store on its own thread, the gRPC server, periodic jobs.

``PlannerRuntime`` starts and stops them together; later features add themselves with
``add_task`` (a ``BackgroundTask``: MQTT, re-planning, GNN fine-tuning) and ``add_interceptor``
(authentication) before ``start``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1._async import HealthServicer

from hulk import errors
from hulk.wire.records import ProbeSettings
from planner.service.ingest import IngestService, ServerLimits
from planner.service.metrics import NO_EVENTS, ServeEvents
from planner.service.peer_plan import ProbePlanSettings
from planner.service.servicer import StoreHealth, create_server
from planner.service.store import Store

log = logging.getLogger(__name__)
STOP_SLACK_S = 5.0   # past the grace period, how long stop() waits for gRPC to finish


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
    retry_s: float = 60.0     # after a failure, the next try comes this soon (or at the interval)


class PlannerRuntime:
    """`hulk-planner serve`: the store, the gRPC server and periodic jobs, started and stopped
    together."""

    def __init__(self, db_path: str, listen: str, *, fleet: str = "default",
                 credentials: grpc.ServerCredentials | None = None,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 raw_days: int = 7, window_days: int = 90,
                 settings: ProbeSettings | None = None, limits: ServerLimits | None = None,
                 rollup_interval_s: float = 30.0, prune_interval_s: float = 3600.0,
                 store_factory: Callable[..., Store] = Store, events: ServeEvents = NO_EVENTS,
                 probe: ProbePlanSettings | None = None):
        self.db_path, self.listen, self.fleet = db_path, listen, fleet
        self.credentials = credentials
        self.interceptors = list(interceptors)
        self.window_days = window_days
        self.store_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        # The store lives on its executor's thread: every call goes through ``in_store``.
        self.store: Store = self.store_executor.submit(
            store_factory, db_path, raw_days=raw_days,
            rollup_days=max(window_days, 90)).result()
        self.events = events   # metrics (planner.service.metrics): ingest, recovery, jobs report here
        self.service = IngestService(self.store, fleet=fleet,
                                     settings=settings or ProbeSettings(),
                                     limits=limits or ServerLimits(), events=events,
                                     probe=probe or ProbePlanSettings())
        self.tasks: list[BackgroundTask] = [
            BackgroundTask("rollup", self.store.rollup_pending, rollup_interval_s),
            BackgroundTask("prune", self.store.prune, prune_interval_s, run_at_start=True),
        ]
        self.server: grpc.aio.Server | None = None
        self.health: HealthServicer | None = None
        self.port: int | None = None
        self._running: list[asyncio.Task] = []
        self._stopped: asyncio.Event | None = None  # made in start (needs a running loop)
        self.store_health = StoreHealth()

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
            interceptors=self.interceptors, limits=self.service.limits,
            store_health=self.store_health)
        await self.server.start()
        for task in self.tasks:
            self._running.append(asyncio.create_task(self._loop(task), name=task.name))
        return self.port

    async def _loop(self, task: BackgroundTask) -> None:
        wait = 0.0 if task.run_at_start else task.interval_s
        while True:
            await asyncio.sleep(wait)
            wait = task.interval_s
            try:
                if task.in_store_thread:
                    result = await self.in_store(task.run)
                    await self.store_health.report(True)
                else:
                    result = await task.run()
                log.debug("%s: %s", task.name, result)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # periodic jobs log, retry soon and go on
                wait = min(task.retry_s, task.interval_s)
                if isinstance(exc, errors.StoreError):
                    await self.store_health.report(False)
                    log.error("background task %s failed: %s; retrying in %.0f s", task.name,
                              exc, wait)
                else:
                    log.exception("background task %s failed; retrying in %.0f s", task.name,
                                  wait)

    def request_stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self, grace_s: float = 5.0) -> None:
        # Background tasks first: once the server refuses new calls every node falls silent to
        # this planner, and a recovery round still running would move their jobs.
        for t in self._running:
            t.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        if self.server is not None:
            try:
                await asyncio.wait_for(self.server.stop(grace_s), grace_s + STOP_SLACK_S)
            except TimeoutError:
                log.warning("the gRPC server did not stop within %.0f s; leaving it",
                            grace_s + STOP_SLACK_S)
        try:
            await self.in_store(self.store.rollup_pending)  # leave the rollups current
        except errors.HulkError as exc:
            log.error("final rollup failed: %s", exc)
        await self.in_store(self.store.close)
        self.store_executor.shutdown(wait=True)
