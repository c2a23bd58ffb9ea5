"""What serve's job lifecycle and recovery need of the world, as small protocols a test replaces.

- :class:`JobStore`: the job records (``hulk-planner jobs``) they follow and update.
- :class:`NodeDirectory`: the nodes (heartbeats, addresses, launch states) and the network
  measured between them.
- :class:`CurrentPlan`: the plan the fleet runs, read and replaced
  (``planner.service.publisher.RetainedPlan`` over the broker).

:class:`StoreDirectory` is the first two over serve's ``Store``, each call on the store's thread.
:class:`ServeOptions` holds what both tasks are configured with.

The current plan has one owner: the broker's retained signed summary (with each node's retained
placement). Agents act on it, ``plan --push`` writes it and it outlives a restart of serve, so
every decision about where jobs run starts from it. A job record's plan id and nodes are a view
derived from it, written after each push for ``hulk-planner jobs`` to show; no decision reads them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hulk.errors import NotFoundError
from hulk.wire.placement import NodePlacement, PlanSummary
from planner.core.fleet import Network
from planner.core.lifecycle import JobRecord
from planner.core.throughput_schedule import ScheduleOptions
from planner.service.node_rows import NodeRecord
from planner.service.store import Store


@dataclass(frozen=True)
class ServeOptions:
    """The lifecycle's, recovery's and throughput tests' settings: the fleet they push to, how
    long a node may be silent before it is down, the planner's seed, whether and how
    throughput tests run (every directed site pair once per period, within a daily budget,
    on servers of running jobs too or not), and how often the cost model is refitted to what
    was measured (0: never, plans use the reference model)."""

    fleet: str = "default"
    node_timeout_s: float = 30.0
    seed: int = 0
    throughput_tests: bool = True
    throughput_period_s: float = 6 * 3600.0
    throughput_budget_gb: float = 200.0       # a day, the whole fleet
    throughput_on_busy: bool = False
    calibration_interval_s: float = 600.0

    def throughput_schedule(self) -> ScheduleOptions:
        """The scheduler's options these settings give (the rest at their defaults)."""
        defaults = ScheduleOptions()
        return ScheduleOptions(period_s=self.throughput_period_s,
                               slip_s=min(defaults.slip_s, self.throughput_period_s / 10),
                               daily_budget_bytes=self.throughput_budget_gb * 1e9,
                               allow_busy=self.throughput_on_busy)


class JobStore(Protocol):
    async def unretired_jobs(self) -> list[JobRecord]:
        """Every job the lifecycle still acts on, oldest first."""

    async def job(self, job_id: int) -> JobRecord: ...

    async def update_job(self, job_id: int, *, state: str | None = None,
                         detail: str | None = None, plan_id: str | None = None,
                         nodes: Iterable[str] | None = None, estimate_s: float | None = None,
                         restart: bool = False, retired: bool = False,
                         stages: Mapping[str, Any] | None = None, failure: bool = False,
                         fenced: bool = False, started_ms: int | None = None) -> None:
        """As ``planner.service.job_records.JobRecords.update_job``."""

    async def job_named(self, name: str) -> JobRecord | None:
        """The latest job of that name, retired or not; None when there is none."""

    async def add_event(self, job_id: int, state: str, detail: str) -> None:
        """As ``planner.service.job_records.JobRecords.add_event``."""


class NodeDirectory(Protocol):
    async def nodes(self) -> list[NodeRecord]:
        """Every known node: imported ones too (``monitored`` False)."""

    async def network(self) -> Network:
        """The live network over the window's measurements (completed)."""


class CurrentPlan(Protocol):
    async def summary(self) -> PlanSummary | None:
        """The current plan's summary, verified; None when there is none. InputError when it
        does not verify (then nothing may be planned from it)."""

    async def placements(self, nodes: Iterable[str]) -> dict[str, NodePlacement]:
        """The retained placements of ``nodes`` that verify (the others are logged, left out)."""

    async def absent(self, nodes: Iterable[str]) -> set[str]:
        """The ``nodes`` with no retained placement at all (a deleted retained message)."""

    async def replace(self, placements: Mapping[str, NodePlacement],
                      summary: Mapping[str, Any] | None, *, issued_at_ms: int,
                      clear: Iterable[str] = ()) -> int:
        """Sign and retain ``placements`` and ``summary`` (None: no plan any more), clear the
        ``clear`` nodes (signed placements without roles); returns the number of messages the
        broker acknowledged."""

    async def resend(self, placements: Mapping[str, NodePlacement], *, issued_at_ms: int) -> int:
        """Re-sign ``placements`` (each node's next sequence number, fresh times) and retain them
        as they are (one without roles clears its node); the summary is untouched. Returns the
        number of messages the broker acknowledged."""


InStore = Callable[..., Awaitable[Any]]     # runs a function on the store's thread


class StoreDirectory:
    """:class:`JobStore` and :class:`NodeDirectory` over serve's store; ``in_store(fn, *args)``
    runs ``fn`` on the store's thread; the network is read over ``window_days``, its unmeasured
    site pairs completed with ``links()`` (serve's ``ServeLinkModel.prediction``) and, with
    ``calibrate`` (serve's ``ServeCalibration.apply``), calibrated: every plan serve makes is
    made on it."""

    def __init__(self, store: Store, in_store: InStore, *, fleet: str, window_days: int,
                 calibrate: Callable[[Network], Network] | None = None,
                 links: Callable[[], Any] | None = None):
        self.store, self.in_store = store, in_store
        self.fleet, self.window_days = fleet, window_days
        self.calibrate = calibrate
        self.links = links    # () -> the link model's LinkPrediction, or None (the formula)

    async def unretired_jobs(self) -> list[JobRecord]:
        return await self.in_store(self.store.job_records, unretired_only=True)

    async def job(self, job_id: int) -> JobRecord:
        return await self.in_store(self.store.job_record, job_id)

    async def update_job(self, job_id: int, *, state: str | None = None,
                         detail: str | None = None, plan_id: str | None = None,
                         nodes: Iterable[str] | None = None, estimate_s: float | None = None,
                         restart: bool = False, retired: bool = False,
                         stages: Mapping[str, Any] | None = None, failure: bool = False,
                         fenced: bool = False, started_ms: int | None = None) -> None:
        await self.in_store(self.store.update_job, job_id, state=state, detail=detail,
                            plan_id=plan_id, nodes=nodes, estimate_s=estimate_s, restart=restart,
                            retired=retired, stages=stages, failure=failure, fenced=fenced,
                            started_ms=started_ms)

    async def job_named(self, name: str) -> JobRecord | None:
        try:
            return await self.in_store(self.store.job_by_name, name)
        except NotFoundError:
            return None

    async def add_event(self, job_id: int, state: str, detail: str) -> None:
        await self.in_store(self.store.jobs.add_event, job_id, state, detail)

    async def nodes(self) -> list[NodeRecord]:
        return await self.in_store(self.store.node_records)

    async def network(self) -> Network:
        from planner.core.fleet import complete
        from planner.service.graph import fleet_from_store  # networkx: only serve needs it

        fleet = await self.in_store(fleet_from_store, self.store, self.window_days, self.fleet)
        net = complete(fleet, prediction=self.links() if self.links is not None else None)
        return net if self.calibrate is None else self.calibrate(net)
