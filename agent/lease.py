"""The node lease on the agent's side: renewed by acknowledged heartbeats, kept in each job's folder.

serve grants a lease with every Heartbeat answer (hulk/lease.py: ``lease_s``, from its node
timeout). The runtime calls :meth:`NodeLease.granted` with the time the acknowledged heartbeat
was *sent*; the deadline is that time plus the terms' ``renew_s``, never later, so the lease can
never outlast serve's own view of this node. The deadline goes into ``lease.json`` in the folder
of every job this agent runs or left running (written atomically), where the job's wrapper
(agent/jobproc.py) reads it every ``poll_s``: once it has passed, the wrapper stops the whole
job (SIGTERM, SIGKILL ``grace_s`` later) and records that it fenced it. The file outlives the
agent, so a job whose agent died or lost the planner stops by itself; an agent restarted in
time renews the file of the job it adopts before it lapses.

Times are CLOCK_BOOTTIME seconds (:func:`lease_clock`): one clock for every process of the host,
whatever their namespaces, and it goes on counting while the host is suspended (the planner's
clock does too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from agent.jobproc import LEASE_FILE, is_alive, read_records
from hulk.atomic import write_atomic
from hulk.lease import DEFAULT_LEASE_S, LEASE_RANGE_S, FenceTerms, fence_terms, usable_lease

log = logging.getLogger(__name__)


def lease_clock() -> float:
    """Seconds on the host's boot clock (the wrapper reads the same one)."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


def write_lease(job_dir: Path, deadline: float, terms: FenceTerms) -> Path:
    """``lease.json`` in ``job_dir``: the deadline and how the wrapper enforces it."""
    path = job_dir / LEASE_FILE
    write_atomic(path, json.dumps({"deadline": deadline, "poll_s": terms.poll_s,
                                   "grace_s": terms.grace_s}))
    return path


def read_lease(job_dir: Path) -> float | None:
    """The deadline ``lease.json`` in ``job_dir`` holds (None: none, or unreadable)."""
    try:
        value = json.loads((job_dir / LEASE_FILE).read_text())["deadline"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


class NodeLease:
    """This node's lease: its deadline, the terms it is kept on, and the job folders it guards."""

    def __init__(self, jobs_dir: Path | None, *, clock: Callable[[], float] = lease_clock,
                 lease_s: float = DEFAULT_LEASE_S):
        self.jobs_dir = Path(jobs_dir) if jobs_dir is not None else None
        self.clock = clock
        self.terms = fence_terms(lease_s)
        self.deadline: float | None = None      # None: no heartbeat acknowledged yet
        self._tracked: set[Path] = set()        # folders of jobs being started (no run.json yet)
        self._changed: asyncio.Event | None = None
        self._warned: set[str] = set()

    def set_lease_s(self, value: float) -> None:
        """The planner's lease (0: it sent none). An unusable one is not used (warned once): the
        agent then keeps DEFAULT_LEASE_S, what a serve at its default node timeout grants."""
        if value == 0:
            value = DEFAULT_LEASE_S
        elif not usable_lease(value):
            why = f"{value!r} is outside {LEASE_RANGE_S[0]:g}-{LEASE_RANGE_S[1]:g} s"
            if why not in self._warned:
                self._warned.add(why)
                log.warning("ignoring the planner's lease_s: %s; using %g s", why, DEFAULT_LEASE_S)
            value = DEFAULT_LEASE_S
        if value != self.terms.lease_s:
            self.terms = fence_terms(value)
            log.info("node lease %g s: a job stops by itself %.1f s after the last acknowledged "
                     "heartbeat was sent (SIGKILL %.1f s after SIGTERM)", value,
                     self.terms.renew_s + self.terms.poll_s + self.terms.grace_s, self.terms.grace_s)

    def granted(self, sent_at: float, lease_s: float = 0.0) -> None:
        """A heartbeat sent at ``sent_at`` (lease_clock) was acknowledged with ``lease_s``: renew
        every guarded job's lease to ``sent_at + renew_s``."""
        self.set_lease_s(lease_s)
        self.deadline = sent_at + self.terms.renew_s
        self.renew_jobs()
        self._event().set()

    def witnessed(self, sent_at: float) -> None:
        """The broker said serve is offline in answer to a read sent at ``sent_at``
        (agent/presence.py): renew to ``sent_at + renew_s`` on the current terms, never
        shortening a later heartbeat's deadline."""
        deadline = sent_at + self.terms.renew_s
        if self.deadline is not None and self.deadline >= deadline:
            return
        self.deadline = deadline
        self.renew_jobs()
        self._event().set()

    def valid(self) -> bool:
        return self.deadline is not None and self.clock() < self.deadline

    def remaining_s(self) -> float:
        return 0.0 if self.deadline is None else max(0.0, self.deadline - self.clock())

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def wait_valid(self) -> None:
        """Until the lease is valid (a job starts only while this node holds it)."""
        while not self.valid():
            event = self._event()
            event.clear()
            try:
                async with asyncio.timeout(1.0):
                    await event.wait()
            except TimeoutError:
                pass

    def track(self, job_dir: Path) -> Path:
        """Guard ``job_dir`` (a job about to start there) and write its lease now."""
        self._tracked.add(job_dir)
        return write_lease(job_dir, self.deadline or 0.0, self.terms)

    def untrack(self, job_dir: Path) -> None:
        self._tracked.discard(job_dir)

    def renew_jobs(self) -> int:
        """Write the deadline into the folder of every tracked job and every recorded job whose
        process is alive; returns how many were written. A folder that cannot be written is
        logged and skipped (its job then stops at its last deadline: the safe side)."""
        if self.deadline is None:
            return 0
        folders = set(self._tracked)
        folders.update(r.job_dir for r in read_records(self.jobs_dir)
                       if is_alive(r.pid, r.start_ticks))
        written = 0
        for folder in sorted(folders):
            try:
                write_lease(folder, self.deadline, self.terms)
                written += 1
            except OSError as err:
                log.warning("cannot renew the lease of %s: %s", folder, err)
        return written
