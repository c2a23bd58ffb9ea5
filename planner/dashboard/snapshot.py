"""The dashboard's documents, kept current by a periodic read of the store.

``DashboardState.refresh(store)`` runs on the store's thread (a serve ``BackgroundTask``): it reads
nodes and jobs every time and the window's links every ``links_interval_s`` (the costly part on a
large fleet), builds the documents with ``planner.dashboard.view`` and offers the last plan's jobs
to the ``ComparisonWorker``. HTTP threads only read the finished documents, so any number of
viewers costs the store nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from hulk.errors import HulkError
from planner.core.fleet import Fleet
from planner.dashboard.compare import ComparisonWorker, comparison_json
from planner.dashboard.view import (PairLink, fleet_json, jobs_json, last_plan_records, number,
                                    pair_links)

log = logging.getLogger(__name__)
DOCUMENTS = ("fleet", "jobs", "plan")


class DashboardState:
    """The latest documents (replaced whole on each refresh; readers never see a half-built one)."""

    def __init__(self, *, fleet: str, node_timeout_s: float, window_days: int,
                 worker: ComparisonWorker | None = None, links_interval_s: float = 30.0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic):
        self.fleet, self.node_timeout_s, self.window_days = fleet, node_timeout_s, window_days
        self.worker = worker or ComparisonWorker()
        self.links_interval_s = links_interval_s
        self._clock_ms, self._monotonic = clock_ms, monotonic
        self._links_at: float | None = None
        self._fleet: Fleet = Fleet((), (), name=fleet)
        self._links: list[PairLink] = []
        self._docs: dict[str, dict[str, Any]] = {}

    def refresh(self, store) -> str:
        """Read the store (on its thread) and rebuild the documents; a line for the debug log."""
        from planner.service.graph import fleet_from_store   # networkx: only the planner has it

        now = self._clock_ms()
        if self._links_at is None or self._monotonic() - self._links_at >= self.links_interval_s:
            self._fleet = fleet_from_store(store, self.window_days, name=self.fleet)
            self._links = pair_links(self._fleet.links)
            self._links_at = self._monotonic()
        rows = store.nodes()
        records = store.job_records()
        planned = last_plan_records(records)
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
            "fleet": fleet_json(rows, self._links, fleet=self.fleet, now_ms=now,
                                node_timeout_s=self.node_timeout_s),
            "jobs": jobs_json(records, rows, now_ms=now),
            "plan": {"plan_ids": sorted({r.plan_id for r in planned if r.plan_id}),
                     "jobs": [{"name": r.name, "state": r.state, "nodes": len(r.nodes),
                               "estimate_s": number(r.estimate_s, 1)} for r in planned],
                     "compared": names,
                     "estimated_makespan_s": number(max(estimates), 1) if estimates else None},
        }
        return f"{len(rows)} nodes, {len(self._links)} pairs, {len(records)} jobs"

    def document(self, name: str) -> dict[str, Any] | None:
        """The named document (``fleet``, ``jobs`` or ``plan``); None before the first refresh."""
        docs = self._docs
        if name not in docs:
            return None
        if name == "plan":
            return comparison_json(self.worker.result, computing=self.worker.computing,
                                   plan=docs["plan"])
        return docs[name]

    def close(self) -> None:
        self.worker.close()
