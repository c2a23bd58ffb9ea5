"""The dashboard's documents, kept current by a periodic read of the store.

Each refresh is two steps. ``DashboardState.read(store)`` runs on the store's thread and only
reads: nodes and jobs every time, the window's links (``fleet_from_store``, the costly read on a
large fleet) at most every ``links_interval_s`` and never more often than twenty times as long as
the last such read took, so the store's thread spends at most about 5% of its time here.
``DashboardState.build(read)`` runs on another thread: it merges the links into site pairs when
the links or the nodes' sites changed, builds the documents with ``planner.dashboard.view`` and
offers the last plan's jobs to the ``ComparisonWorker``. HTTP threads only read the finished
documents, so any number of viewers costs the store nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hulk.errors import HulkError
from hulk.plural import count
from planner.core.fleet import Fleet
from planner.core.lifecycle import JobRecord
from planner.dashboard.compare import ComparisonWorker, comparison_json
from planner.dashboard.link_sources import marked_links
from planner.dashboard.view import (LinkSummary, PairLink, fleet_json, jobs_json, last_plan_records,
                                    node_sites, number, pair_links, summarise_links)

log = logging.getLogger(__name__)
DOCUMENTS = ("fleet", "jobs", "plan")
LINKS_READ_SHARE = 20.0    # links are read again after at least 20x the last read's duration


@dataclass(frozen=True)
class StoreRead:
    """What one refresh read from the store; ``fleet`` is None when the links were not due."""

    now_ms: int
    rows: list[dict[str, Any]]
    records: list[JobRecord]
    fleet: Fleet | None
    # job name -> (measured, estimated) seconds a step (Store.job_iterations)
    iterations: dict[str, tuple[float, float | None]] = field(default_factory=dict)


class DashboardState:
    """The latest documents (replaced whole on each build; readers never see a half-built one)."""

    def __init__(self, *, fleet: str, node_timeout_s: float, window_days: int,
                 worker: ComparisonWorker | None = None, links_interval_s: float = 30.0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic,
                 links: Callable[[], Any] | None = None):
        self.fleet, self.node_timeout_s, self.window_days = fleet, node_timeout_s, window_days
        self.worker = worker or ComparisonWorker()
        self.links_interval_s = links_interval_s
        self._clock_ms, self._monotonic = clock_ms, monotonic
        self._links_due = -float("inf")
        self._fleet: Fleet = Fleet((), (), name=fleet)
        self._pairs: list[PairLink] = []
        self._sites: dict[str, str] | None = None
        self._summary = LinkSummary()
        self._docs: dict[str, dict[str, Any]] = {}
        # () -> serve's link prediction (planner.service.link_model), or None: the map marks
        # each site pair measured, predicted or formula.
        self.links = links
        self._marked: tuple[Any, LinkSummary, LinkSummary] | None = None

    def read(self, store) -> StoreRead:
        """The store's part of a refresh (call it on the store's thread)."""
        from planner.service.graph import fleet_from_store   # networkx: only the planner has it

        fleet = None
        started = self._monotonic()
        if started >= self._links_due:
            fleet = fleet_from_store(store, self.window_days, name=self.fleet)
            took = self._monotonic() - started
            self._links_due = started + max(self.links_interval_s, LINKS_READ_SHARE * took)
        iterations = {j.job_name: (j.measured_iteration_s, j.estimated_iteration_s)
                      for j in store.job_iterations()}
        return StoreRead(self._clock_ms(), store.nodes(), store.job_records(), fleet, iterations)

    def build(self, read: StoreRead) -> str:
        """The documents from a read (any thread but the store's); a line for the debug log."""
        if read.fleet is not None:
            self._fleet, self._pairs, self._sites = read.fleet, pair_links(read.fleet.links), None
        sites = node_sites(read.rows)
        if sites != self._sites:
            self._sites, self._summary = sites, summarise_links(sites, self._pairs)
        planned = last_plan_records(read.records)
        jobs, names = [], []
        for record in planned:
            try:
                jobs.append(record.job)
                names.append(record.name)
            except (HulkError, KeyError, TypeError, ValueError) as exc:
                log.warning("dashboard: job %s left out of the comparison: %s", record.name, exc)
        key = (tuple((r.name, json.dumps(r.spec, sort_keys=True, default=str)) for r in planned),
               tuple((n.id, n.gpus, n.memory_gb) for n in self._fleet.nodes), len(self._fleet.links))
        self.worker.offer(key, jobs, self._fleet)
        estimates = [r.estimate_s for r in planned if r.estimate_s is not None]
        self._docs = {
            "fleet": fleet_json(read.rows, self._marked_summary(), fleet=self.fleet,
                                now_ms=read.now_ms,
                                node_timeout_s=self.node_timeout_s),
            "jobs": jobs_json(read.records, read.rows, now_ms=read.now_ms,
                              iterations=read.iterations),
            "plan": {"plan_ids": sorted({r.plan_id for r in planned if r.plan_id}),
                     "jobs": [{"name": r.name, "state": r.state, "nodes": len(r.nodes),
                               "estimate_s": number(r.estimate_s, 1)} for r in planned],
                     "compared": names,
                     "estimated_makespan_s": number(max(estimates), 1) if estimates else None},
        }
        return (f"{count(len(read.rows), 'node')}, {count(len(self._pairs), 'pair')}, "
                f"{count(len(read.records), 'job')}")

    def _marked_summary(self) -> LinkSummary:
        """The summary with each link's source, marked again only when it or the prediction
        changed (a prediction has a figure for every pair of sites)."""
        prediction = self.links() if self.links is not None else None
        cached = self._marked
        if cached is None or cached[0] is not prediction or cached[1] is not self._summary:
            self._marked = cached = (prediction, self._summary,
                                     marked_links(self._summary, prediction))
        return cached[2]

    def refresh(self, store) -> str:
        """``read`` and ``build`` on this thread (tests, and stores not shared with serve)."""
        return self.build(self.read(store))

    def document(self, name: str) -> dict[str, Any] | None:
        """The named document (``fleet``, ``jobs`` or ``plan``); None before the first build."""
        docs = self._docs
        if name not in docs:
            return None
        if name == "plan":
            return comparison_json(self.worker.result, computing=self.worker.computing,
                                   plan=docs["plan"])
        return docs[name]

    def close(self) -> None:
        self.worker.close()
