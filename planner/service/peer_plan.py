"""Whom each agent probes now: the probe plan (``planner.core.probe_plan``) over the registered
agents, per epoch, with what each agent was last given.

- The plan is recomputed lazily: when a node's epoch moves on, or when agents joined or changed
  site. A change recomputes it only once the last computation is ``replan_gap`` times its own
  duration ago (at most a tenth of the store thread by default: immediate for a small fleet,
  whose plan takes under ``throttle_from_s`` (10 ms) to compute, every few seconds at 10,000
  agents), so a fleet rolling out does not recompute it per
  registration; an agent that registers in between gets its own site's nodes until then.
- Epochs are staggered: node X enters epoch e at ``e * epoch_s + phase(X)`` (phase from a hash
  of its id), so a fleet's re-registrations at a new epoch spread over the whole epoch instead
  of arriving in one heartbeat interval. A node uses the plan of its own epoch; every plan
  keeps its guarantees, so the rotation period holds within one epoch more.
- ``changed(node)`` (for Heartbeat's ``peers_changed``) compares the node's list now with what
  its last registration answered. After a planner restart nothing is known of earlier
  answers: the first heartbeat takes the current list as given (the next epoch corrects a
  stale one), so a restart does not make the whole fleet register again at once.

Not thread-safe: IngestService calls it from the store's thread.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hulk.plural import count
from hulk.wire.records import Peer
from planner.core.probe_plan import (DEFAULT_PEER_BOUND, DEFAULT_SITE_REPS, PlanShape, plan_shape,
                                     probe_plan)

log = logging.getLogger(__name__)

DEFAULT_EPOCH_S = 600.0
THROTTLE_FROM_S = 0.01   # plans quicker to compute than this are never held back


@dataclass(frozen=True)
class ProbePlanSettings:
    """How the planner plans probing (serve's --probe-peers, --probe-site-reps, --probe-epoch)."""

    peer_bound: int = DEFAULT_PEER_BOUND    # most peers an agent probes
    site_reps: int = DEFAULT_SITE_REPS      # probes per ordered site pair per epoch
    epoch_s: float = DEFAULT_EPOCH_S        # how often each agent's peers rotate


class PeerPlanner:
    """The probe plan as serve uses it (see the module doc)."""

    def __init__(self, members: Iterable[tuple[Peer, str | None]],
                 settings: ProbePlanSettings = ProbePlanSettings(), *,
                 clock: Callable[[], int], replan_gap: float = 10.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 throttle_from_s: float = THROTTLE_FROM_S):
        self.throttle_from_s = throttle_from_s
        self.settings = settings
        self._clock = clock
        self._monotonic = monotonic
        self.replan_gap = replan_gap
        self._last_compute_s = 0.0
        self._peers: dict[str, Peer] = {}
        self._site: dict[str, str | None] = {}
        for peer, site in members:
            self._peers[peer.node_id] = peer
            self._site[peer.node_id] = site
        self._version = 0                 # goes up when the nodes or their sites change
        self._shape: tuple[int, PlanShape, int | None] | None = None  # version, shape, period
        # epoch -> (membership version, computed at (monotonic), serial, {node: peer ids})
        self._plans: dict[int, tuple[int, float, int, dict[str, tuple[str, ...]]]] = {}
        self._given: dict[str, int] = {}  # node -> hash of the list its registration answered
        self._addresses = 0               # goes up when a node's address or port changes
        self._digests: dict[str, tuple[tuple[int, int, int, int], int]] = {}
        self.replans = 0

    # ------------------------------------------------------------------------- membership
    def update(self, peer: Peer, site: str | None) -> None:
        """A node registered (new, or perhaps moved address, port or site)."""
        known = self._site.get(peer.node_id, object())
        if self._peers.get(peer.node_id, peer) != peer:
            self._addresses += 1
        self._peers[peer.node_id] = peer
        if known != site:
            self._site[peer.node_id] = site
            self._version += 1

    @property
    def node_count(self) -> int:
        return len(self._peers)

    # ------------------------------------------------------------------------------ epochs
    def epoch_of(self, node_id: str) -> int:
        """The node's current epoch (staggered by a phase from its id)."""
        period_ms = max(1, int(self.settings.epoch_s * 1000))
        phase = zlib.crc32(node_id.encode()) % period_ms
        return max(0, (self._clock() - phase) // period_ms)

    def _plan(self, epoch: int) -> tuple[int, dict[str, tuple[str, ...]]]:
        """(serial, plan) of ``epoch``, recomputed when stale and not too recently made."""
        cached = self._plans.get(epoch)
        if cached is not None:
            version, at, serial, plan = cached
            # A plan computed in under throttle_from_s is simply computed again (a small fleet).
            if version == self._version or (self._last_compute_s >= self.throttle_from_s and
                    self._monotonic() - at < self.replan_gap * self._last_compute_s):
                return serial, plan  # a node missing from a recent plan gets a provisional list
        started = time.perf_counter()
        if self._shape is None or self._shape[0] != self._version:
            shape = plan_shape(self._site, self.settings.peer_bound, self.settings.site_reps)
            self._shape = (self._version, shape, shape.rotation_period)
        _, shape, period = self._shape
        plan = probe_plan(self._site, epoch, shape=shape)
        self._plans[epoch] = (self._version, self._monotonic(), self.replans, plan)
        for old in [e for e in self._plans if e < epoch - 1]:
            del self._plans[old]  # nodes are at most one epoch apart
        self.replans += 1
        self._last_compute_s = time.perf_counter() - started
        log.info("probe plan for epoch %d: %s in %s, at most %s each, every "
                 "server probed from every other site within %s (%.2f s to compute)", epoch,
                 count(len(self._site), "agent"), count(len(shape.sites), "site"),
                 count(max(map(len, plan.values()), default=0), "peer"),
                 f"{count(period, 'epoch')} ({period * self.settings.epoch_s / 3600:.1f} h)"
                 if period else "no bound (peer bound too small)", self._last_compute_s)
        return self.replans - 1, plan

    # ------------------------------------------------------------------------------- peers
    def peers_for(self, node_id: str) -> tuple[Peer, ...]:
        """The node's peers now (empty for a node that never registered)."""
        if node_id not in self._peers:
            return ()
        return self._list(node_id, self._plan(self.epoch_of(node_id))[1])

    def _list(self, node_id: str, plan: dict[str, tuple[str, ...]]) -> tuple[Peer, ...]:
        ids = plan.get(node_id)
        if ids is None:  # joined since the plan was made: its own site until the next one
            site = self._site[node_id]
            ids = tuple(sorted(n for n, s in self._site.items()
                               if s == site and n != node_id))[:self.settings.peer_bound]
        return tuple(self._peers[i] for i in ids)

    def answer(self, node_id: str) -> tuple[Peer, ...]:
        """The peers a registration answers, remembered for ``changed``."""
        if node_id not in self._peers:
            return ()
        peers, digest = self._current(node_id, listed=True)
        self._given[node_id] = digest
        return peers

    def changed(self, node_id: str) -> bool:
        """Whether the node's list differs from what its last registration answered."""
        if node_id not in self._peers:
            return False
        _, digest = self._current(node_id, listed=False)
        given = self._given.setdefault(node_id, digest)
        return given != digest

    def _current(self, node_id: str, listed: bool) -> tuple[tuple[Peer, ...], int]:
        """(the node's list, when ``listed`` or not cached, and its digest). Hashing 64 peers
        costs more than a heartbeat should: the digest is kept until the plan or a peer changes."""
        serial, plan = self._plan(self.epoch_of(node_id))
        key = (serial, self._version, self._addresses, len(self._peers))
        cached = self._digests.get(node_id)
        if cached is not None and cached[0] == key and not listed:
            return (), cached[1]
        peers = self._list(node_id, plan)
        digest = hash(peers)
        self._digests[node_id] = (key, digest)
        return peers, digest
