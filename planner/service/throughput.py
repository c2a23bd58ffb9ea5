"""serve's throughput tests: plans them every few seconds and hands each node its slots.

``ThroughputTests.plan`` (a background task on the store's thread) gathers the nodes that take
tests (a throughput port, an address, alive within the node timeout), the servers of running jobs,
each directed site pair's last test and today's bytes, asks the pure scheduler
(``planner.core.throughput_schedule.schedule``) for the next tests, records them in the store
(only a receiver of a recorded test may report its result) and keeps both slots of each test
in memory. ``slots(node)`` answers every heartbeat of the node with its slots until they start;
the agent drops the repeats (by test id and role).

A node that holds slots is planned only into slots starting after the last of them ends (the
scheduler's ``busy_until``), so it is never in two tests at once, whether or not tests may use
busy servers, and it goes on testing slot after slot while pairs are due. Slots not yet handed
out when serve stops are lost; their tests simply bring no result and the pair is tested again a
period later.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hulk.wire.throughput import ThroughputSlot
from planner.core.throughput_schedule import Candidate, ScheduleOptions, schedule, slots_for
from planner.service.runtime import BackgroundTask
from planner.service.seams import ServeOptions
from planner.service.store import DAY_MS, Store
from planner.service.throughput_store import ScheduledTest, launched_nodes, test_nodes

log = logging.getLogger(__name__)

BUSY_JOB_STATES = ("placed", "running")   # a job in these holds its nodes
PLAN_INTERVAL_S = 5.0   # well inside the scheduler's lead (30 s): a slot reaches its agents


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class ThroughputTests:
    """Planned tests and each node's slots. Call from the store's thread only."""

    store: Store
    options: ScheduleOptions = field(default_factory=ScheduleOptions)
    node_timeout_s: float = 30.0
    horizon_s: float = 60.0
    clock: Callable[[], int] = _now_ms
    # Test ids and one-time secrets come from here: unpredictable in serve.
    rng: random.Random = field(default_factory=random.SystemRandom)
    _slots: dict[str, list[ThroughputSlot]] = field(default_factory=dict)

    def plan(self) -> int:
        """Plan the next tests and keep their slots; returns how many were planned."""
        now = self.clock()
        self._drop_ended(now)
        held = {node: max(s.end_ms for s in slots) for node, slots in self._slots.items()}
        candidates = [Candidate(n.node_id, n.site, n.address, n.port)
                      for n in test_nodes(self.store.database,
                                          now - int(self.node_timeout_s * 1000))
                      if n.site is not None]
        if len(candidates) < 2:
            return 0
        records = self.store.throughput
        expected = {pair: gbps for pair, (gbps, _) in records.throughput_by_site_pair().items()
                    if gbps > 0}
        tests = schedule(candidates, records.last_tested_ms(), self._busy(), now, self.options,
                         rng=self.rng, spent_today_bytes=records.spent_bytes(now - now % DAY_MS),
                         expected_gbps=expected, horizon_s=self.horizon_s, busy_until=held)
        if not tests:
            return 0
        records.add_scheduled(ScheduledTest(t.test_id, t.sender.node_id, t.receiver.node_id,
                                            t.src_site, t.dst_site, t.start_ms, t.expected_bytes)
                              for t in tests)
        for t in tests:
            send, receive = slots_for(t)
            self._slots.setdefault(t.sender.node_id, []).append(send)
            self._slots.setdefault(t.receiver.node_id, []).append(receive)
            log.info("throughput test %s: %s (%s) -> %s (%s) at %d", t.test_id[:8],
                     t.sender.node_id, t.src_site, t.receiver.node_id, t.dst_site, t.start_ms)
        return len(tests)

    def slots(self, node_id: str) -> tuple[ThroughputSlot, ...]:
        """The node's slots that have not started yet (every heartbeat until they start)."""
        now = self.clock()
        return tuple(s for s in self._slots.get(node_id, ()) if s.start_ms > now)

    def _drop_ended(self, now: int) -> None:
        for node_id in list(self._slots):
            left = [s for s in self._slots[node_id] if s.end_ms > now]
            if left:
                self._slots[node_id] = left
            else:
                del self._slots[node_id]

    def _busy(self) -> set[str]:
        """Servers of jobs placed or running, and those whose agent runs a training process."""
        busy = launched_nodes(self.store.database)
        for job in self.store.job_records(unretired_only=True):
            if job.state in BUSY_JOB_STATES:
                busy.update(job.nodes)
        return busy


def add_to_runtime(runtime: Any, options: ServeOptions, *,
                   interval_s: float = PLAN_INTERVAL_S) -> ThroughputTests | None:
    """Serve's throughput tests on ``runtime`` (a PlannerRuntime): planned on the store's thread
    every ``interval_s``, slots handed out by its heartbeats. None when the options turn them
    off."""
    if not options.throughput_tests:
        return None
    tests = ThroughputTests(runtime.store, options.throughput_schedule(),
                            node_timeout_s=options.node_timeout_s)
    runtime.service.throughput = tests
    runtime.add_task(BackgroundTask("throughput-tests", tests.plan, interval_s,
                                    in_store_thread=True, retry_s=interval_s))
    log.info("throughput tests: every site pair once per %.0f s, at most %g GB a day%s",
             options.throughput_period_s, options.throughput_budget_gb,
             ", servers of running jobs too" if options.throughput_on_busy else "")
    return tests
