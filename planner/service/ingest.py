"""The planner's domain side of Register, Report and Heartbeat: validation, then the store.

``IngestService`` is plain Python: wire records in (``hulk.wire.records``), wire records out.
It validates every sample before anything is stored:

* a report from a node that never registered -> ``NotFoundError`` (the agent registers again);
* a malformed batch (a batch id that is not 1-64 letters, digits, '.', '_' or '-', too many
  samples, a number outside ``admission.WIRE_BOUNDS``: a timeout outside 1 ms-60 s, 0
  included, a negative, infinite or absurd RTT, an RTT above the probe's timeout; an unknown
  probe kind, a node probing itself) -> ``InputError``; nothing of the batch is stored, the
  rejected samples are counted;
* a sample faster than light between the two nodes' cities (``hulk.geo.min_rtt_ms``; unknown
  cities skip the check) or to an unknown peer is a measurement error: that sample is rejected,
  counted and logged, the rest of the batch is stored (``ReportResult.rejected``);
* sample times are read on the planner's clock (``admission.corrected_times``: the skew the
  node's heartbeats measured), so a wrong agent clock costs no sample; a sample older than the
  store's raw retention (``raw_days``, also 1970) is rejected and counted as ``too_old``: past
  that horizon a retried batch could no longer be recognised, and it would count twice.

Per-round summaries (``PeerSummary``) go the same way: a summary
whose figures cannot be true (``admission.check_summary``: lost > count, min > max, NaN, a
histogram not adding up, ...) refuses the batch with INVALID_ARGUMENT, counted; one to an
unknown peer, below the light-speed bound (its fastest RTT) or too old is rejected and counted
alone. A batch may mix raw samples and summaries; records are counted, a summary as one.

Throughput results (``ThroughputResult``) out of bounds refuse the batch; a result is stored
(once per test id, retries included) only from the receiver of a test serve scheduled and only
naming that test's sender; any other is rejected and counted (``throughput_unknown_test``,
``throughput_wrong_node``). Heartbeat answers a node with its throughput slots that have not
started (``planner.service.throughput``).

Registrations are checked field by field (``admission.check_registration``) before anything is
stored. A registration's peers, and Heartbeat's ``peers_changed``, come from the probe plan
(``planner.service.peer_plan``): the node's own site (the one its agent declares, else its
city) and a few representatives of every other site, at most ``probe.peer_bound``, rotated
every ``probe.epoch_s``. Its settings carry the report interval: ``settings.report_interval_s``
when set (serve --report-seconds), else one that grows with the fleet
(``auto_report_interval_s``: at most about 20 Reports a second in all).

The gRPC servicer (``planner.service.servicer``) only converts protos and calls this.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from hulk import errors, geo
from hulk.wire import histogram
from hulk.wire.records import (HeartbeatRequest, HeartbeatResult, Peer, PeerSummary, ProbeSample,
                               ProbeSettings, RegisterAnswer, RegisterRequest, ReportRequest,
                               ReportResult)
from hulk.wire.throughput import ThroughputResult
from planner.core.rollup import bucket_index
from planner.service.metrics import NO_EVENTS, ServeEvents
from planner.service.admission import (bounded_launch, check_batch_id, check_registration,
                                       check_sample, check_summary, corrected_times)
from planner.service.peer_plan import PeerPlanner, ProbePlanSettings
from planner.service.store import DAY_MS, NodeRef, SampleRow, Store, SummaryRow, micros
from planner.service.throughput_store import REASON_UNKNOWN_TEST, REASON_WRONG_NODE

THROUGHPUT_REASONS = (REASON_UNKNOWN_TEST, REASON_WRONG_NODE)

if TYPE_CHECKING:
    from planner.service.throughput import ThroughputTests

log = logging.getLogger(__name__)

AUTO_REPORTS_PER_S = 20.0        # what the whole fleet sends at most with the automatic interval
AUTO_REPORT_MIN_S = 5.0          # the agents' own interval: kept up to 100 nodes
AUTO_REPORT_MAX_S = 600.0        # an agent holds at most this long's summaries before sending
INTERVAL_DRIFT = 2.0             # a node given an interval this far off registers again


def auto_report_interval_s(nodes: int) -> float:
    """The report interval pushed to agents when serve runs without --report-seconds: 0 (the
    agents' own 5 s) up to 100 nodes, then ``nodes / 20`` seconds so the fleet sends
    about 20 Reports a second, at most 600 s (12,000 nodes and more). At 600 s an agent holds
    600 s of summaries (64 peers, a round a minute: 640) before sending: well inside its spool
    (spool_max, 1,000,000 by default) and a Report's max_batch (2,000; a full batch goes at once)."""
    if nodes <= AUTO_REPORTS_PER_S * AUTO_REPORT_MIN_S:
        return 0.0
    return min(AUTO_REPORT_MAX_S, max(AUTO_REPORT_MIN_S, nodes / AUTO_REPORTS_PER_S))

REASON_BELOW_LIGHT = "below_light_speed"
REASON_UNKNOWN_PEER = "unknown_peer"
REASON_INVALID_BATCH = "invalid_batch"
REASON_TOO_OLD = "too_old"


@dataclass(frozen=True)
class ServerLimits:
    max_batch_samples: int = 10_000          # a Report with more samples is refused
    max_message_bytes: int = 4 << 20         # gRPC receive limit, and a Report's
    max_register_bytes: int = 64 << 10       # 64 GPUs and every text at its bound fit in 16 KiB
    max_heartbeat_bytes: int = 1 << 20       # a launch report's detail is cut to 4 KiB after
    max_concurrent_rpcs: int = 1024          # past this a call gets RESOURCE_EXHAUSTED at once
    future_tolerance_ms: int = 60_000        # past this a batch's times are moved back to now
    # What one connection may hold, whoever holds it (gRPC server options, servicer.py
    # connection_options). An agent's channel makes a few calls at once, a heartbeat at least
    # every 10 s (so it is never idle for a minute), and no call longer than its 10 s timeout
    # plus the guard's 10 s body deadline (guard.CallLimits), well inside the grace; at the age
    # bound it gets a GOAWAY and its next call goes on a new connection, which gRPC opens itself.
    max_streams_per_connection: int = 100    # HTTP/2 MAX_CONCURRENT_STREAMS; more: UNAVAILABLE
    handshake_timeout_s: float = 10.0        # TCP accepted to TLS and HTTP/2 set up
    max_connection_idle_s: float = 60.0      # a connection with no call open is closed after this
    max_connection_age_s: float = 1800.0     # any connection is asked to go (GOAWAY) after this,
    max_connection_age_grace_s: float = 30.0  # and closed this much later, calls open or not


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
    events: ServeEvents = NO_EVENTS       # metrics (planner.service.metrics); no-op by default
    probe: ProbePlanSettings = field(default_factory=ProbePlanSettings)
    # serve's throughput tests (planner.service.throughput.ThroughputTests): heartbeats hand
    # out their slots; None: none are handed out (results of tests stored earlier still count).
    throughput: ThroughputTests | None = None
    # The node lease every Heartbeat answer grants (hulk.lease.lease_for of serve's node
    # timeout); 0: none is sent.
    lease_s: float = 0.0

    def __post_init__(self) -> None:
        self.peer_plan = PeerPlanner(self.store.probe_members(), self.probe, clock=self.clock)
        self._nodes: dict[str, NodeRef] = self.store.node_refs()
        self._bounds: dict[tuple[int, int], float] = {}
        self._skew_ms: dict[str, int] = self.store.clock_skews()
        self._given_interval_s: dict[str, float] = {}   # report interval each node registered with
        self._reloaded = False

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

    def register(self, request: RegisterRequest) -> RegisterAnswer:
        check_registration(request)
        node, _ = self.store.register(request)
        self._nodes[node.id] = node
        self.events.registered(node.id)
        self._bounds.clear()  # the node may have moved
        reason = request.inventory.unavailable_reason
        log.info("registered %s (%s, %s%s, %d GPUs%s)", request.node_id,
                 request.address or "no address", node.city or "no city",
                 f", site {node.site}" if request.location.site.strip() else "",
                 request.inventory.count, f": {reason}" if reason else "")
        self.peer_plan.update(Peer(node.id, request.address, request.probe_port), node.site)
        settings = self.pushed_settings()
        self._given_interval_s[node.id] = settings.report_interval_s
        return RegisterAnswer(self.peer_plan.answer(node.id), settings, self.fleet, self.clock())

    def interval_drifted(self, node_id: str) -> bool:
        """Whether the automatic report interval has moved a factor INTERVAL_DRIFT or more from
        the one this node was given at registration (as the fleet grew or shrank): the node
        then registers again to fetch it. The factor keeps a growing fleet from sending every
        agent back to Register at each newcomer (a few times from 100 to 12,000 nodes)."""
        given = self._given_interval_s.get(node_id)
        if given is None:
            return False
        now = self.report_interval_s()
        a, b = given or AUTO_REPORT_MIN_S, now or AUTO_REPORT_MIN_S   # 0: the agent's own 5 s
        return max(a, b) >= INTERVAL_DRIFT * min(a, b)

    def pushed_settings(self) -> ProbeSettings:
        """The settings a registration answers: the report interval automatic (grown with the
        registered agents) unless one was set."""
        interval = self.report_interval_s()
        if interval == self.settings.report_interval_s:
            return self.settings
        return replace(self.settings, report_interval_s=interval)

    def report_interval_s(self) -> float:
        """The report interval pushed now: the one set, else the automatic one (0: the agents'
        own)."""
        return self.settings.report_interval_s or auto_report_interval_s(self.peer_plan.node_count)

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        _check_count("spool_depth", request.spool_depth)
        _check_count("spool_dropped", request.spool_dropped)
        now = self.clock()
        # The agent stamps the request just before sending it: the difference is its clock's
        # skew plus half a round trip, close enough to read sample times on our clock.
        skew = request.time_ms - now if request.time_ms > 0 else None
        try:
            self.store.heartbeat(request.node_id, spool_depth=request.spool_depth,
                                 spool_dropped=request.spool_dropped,
                                 launch=bounded_launch(request.launch), clock_skew_ms=skew)
        except errors.NotFoundError:
            return HeartbeatResult(now, reregister=True, peers_changed=False)
        if skew is not None:
            self._skew_ms[request.node_id] = skew
        self.events.heartbeat(request.node_id)
        # The probe plan, not the store's peers version: a new node changes a few lists.
        # "Register again" also fetches a report interval that drifted with the fleet's size.
        slots = self.throughput.slots(request.node_id) if self.throughput is not None else ()
        return HeartbeatResult(now, reregister=False,
                               peers_changed=self.peer_plan.changed(request.node_id)
                               or self.interval_drifted(request.node_id),
                               throughput_slots=slots, lease_s=self.lease_s)

    # ------------------------------------------------------------------------------ reports

    def report(self, request: ReportRequest) -> ReportResult:
        _check_count("spool_dropped", request.spool_dropped)
        try:
            node = self._node(request.node_id)
        except errors.NotFoundError:
            self.events.report_refused("unregistered", len(request.samples))
            raise
        n_records = len(request.samples) + len(request.summaries) + len(request.throughput)
        try:
            rows, rejected = self._validate(node, request.batch_id, request.samples,
                                            len(request.summaries) + len(request.throughput))
            summaries = self._validate_summaries(node, request.summaries, rejected) \
                if request.summaries else []
            results = self._validate_throughput(node, request.throughput, rejected)
        except errors.InputError:
            self.store.count_rejected(node, REASON_INVALID_BATCH, n_records)
            self.events.report_refused("invalid", n_records, REASON_INVALID_BATCH)
            raise
        accepted, n_rejected, duplicate = self.store.store_batch(
            node, request.batch_id, rows, rejected, request.spool_dropped, summaries,
            throughput=len(results))
        # Stored by test id, once, whether or not the batch was seen (it may have been cut
        # off between the two).
        for r in self.store.throughput.store_results(node.idx, results):
            self.events.throughput_result("ok" if r.ok else "failed", r.gbps if r.ok else None)
        if not duplicate:
            for reason in THROUGHPUT_REASONS:
                for _ in range(rejected.get(reason, 0)):
                    self.events.throughput_result("rejected", None)
        # Throughput rejections have their own counter (above), not the samples'.
        self.events.reported(n_records, accepted, {k: v for k, v in rejected.items()
                                                   if k not in THROUGHPUT_REASONS}, duplicate)
        return ReportResult(accepted, n_rejected, duplicate)

    def _validate_throughput(self, node: NodeRef, results: Sequence[ThroughputResult],
                             rejected: dict[str, int]) -> list[ThroughputResult]:
        """The results this node may report (it is the receiver of a test this planner
        scheduled, from the sender it names); the others counted into ``rejected``. A result
        out of bounds refuses the batch (``ThroughputResult.check``)."""
        for i, r in enumerate(results):
            r.check(f"throughput[{i}]")
        out = []
        for r in results:
            reason = self.store.throughput.check_result(node.idx, r)
            if reason is None:
                out.append(r)
            else:
                rejected[reason] = rejected.get(reason, 0) + 1
                log.warning("rejected throughput result %s from %s: %s", r.test_id, node.id,
                            "no such test" if reason == REASON_UNKNOWN_TEST
                            else "not its receiver or not its sender")
        return out

    def _validate_summaries(self, node: NodeRef, summaries: Sequence[PeerSummary],
                            rejected: dict[str, int]) -> list[SummaryRow]:
        """Rows of the summaries worth storing; the others counted into ``rejected``."""
        now = self.clock()
        times, _ = corrected_times([s.round_start_ms for s in summaries], now,
                                   self._skew_ms.get(node.id, 0), self.limits.future_tolerance_ms)
        oldest = now - self.store.raw_days * DAY_MS
        self._reloaded = False
        rows: list[SummaryRow] = []
        tally = _Tally()
        for i, s in enumerate(summaries):
            check_summary(s, f"summaries[{i}]")
            peer = self._known_peer(node, s.peer_id, "summaries", i)
            if peer is None:
                tally.unknown += 1
            elif times[i] < oldest:
                tally.too_old += 1
            elif s.count == s.lost:
                rows.append((node.idx, peer.idx, times[i], s.kind, s.count, s.lost, 0.0, 0.0,
                             None, None, None))
            elif tally.above_light(s.rtt_min_ms, self._bound_ms(node, peer), peer.id):
                rows.append((node.idx, peer.idx, times[i], s.kind, s.count, s.lost, s.rtt_sum_ms,
                             s.rtt_sum_sq_ms2, micros(s.rtt_min_ms), micros(s.rtt_max_ms),
                             histogram.encode(dict(s.buckets))))
        for reason, count in tally.reasons().items():
            rejected[reason] = rejected.get(reason, 0) + count
        tally.log(node.id, "summaries", self.store.raw_days)
        return rows

    def _peer(self, peer_id: str) -> NodeRef | None:
        """The peer's node; the store is looked at again once per batch for one registered
        since (``_reloaded`` is reset per batch)."""
        peer = self._nodes.get(peer_id)
        if peer is None and not self._reloaded:
            self._nodes = self.store.node_refs()
            self._reloaded = True
            peer = self._nodes.get(peer_id)
        return peer

    def _known_peer(self, node: NodeRef, peer_id: str, section: str, i: int) -> NodeRef | None:
        """The registered peer a record measures (None: unknown); a record without a peer, or
        of a node probing itself, refuses the batch."""
        peer = self._nodes.get(peer_id)
        if peer is None:
            if not peer_id:
                raise errors.InputError("expected a peer id", field=f"{section}[{i}].peer_id")
            if peer_id != node.id:
                peer = self._peer(peer_id)
        if peer_id == node.id or (peer is not None and peer.idx == node.idx):
            raise errors.InputError("a node does not probe itself",
                                    field=f"{section}[{i}].peer_id")
        return peer

    def _check_batch(self, batch_id: str, n_samples: int, n_summaries: int) -> None:
        check_batch_id(batch_id)
        if n_samples + n_summaries > self.limits.max_batch_samples:
            raise errors.BatchTooLargeError(
                f"batch has {n_samples + n_summaries} records, the limit is "
                f"{self.limits.max_batch_samples}", field="summaries" if n_summaries else "samples")

    def _validate(self, node: NodeRef, batch_id: str, samples: Sequence[ProbeSample],
                  n_summaries: int = 0) -> tuple[list[SampleRow], dict[str, int]]:
        """Rows of the samples worth storing, and the count of the others by reason."""
        self._check_batch(batch_id, len(samples), n_summaries)
        now = self.clock()
        times, shift = corrected_times([s.sent_at_ms for s in samples], now,
                                       self._skew_ms.get(node.id, 0),
                                       self.limits.future_tolerance_ms)
        if shift:
            log.debug("%s: sample times moved by %d ms onto the planner's clock", node.id, -shift)
        oldest = now - self.store.raw_days * DAY_MS
        self._reloaded = False
        rows: list[SampleRow] = []
        tally = _Tally()
        src = node.idx
        for i, s in enumerate(samples):
            check_sample(s, f"samples[{i}]")
            peer = self._known_peer(node, s.peer_id, "samples", i)
            if peer is None:
                tally.unknown += 1
            elif times[i] < oldest:
                tally.too_old += 1
            elif s.lost:
                rows.append((src, peer.idx, times[i], s.kind, s.payload_bytes, 1, None, None))
            elif tally.above_light(s.rtt_ms, self._bound_ms(node, peer), peer.id):
                rows.append((src, peer.idx, times[i], s.kind, s.payload_bytes, 0, s.rtt_ms,
                             bucket_index(s.rtt_ms)))
        tally.log(node.id, "sample(s)", self.store.raw_days)
        return rows, tally.reasons()


@dataclass
class _Tally:
    """Records of one batch rejected alone, by reason, and one example below light speed."""

    below: int = 0
    unknown: int = 0
    too_old: int = 0
    example: tuple[str, float, float] | None = None

    def above_light(self, rtt_ms: float, bound_ms: float, peer_id: str) -> bool:
        """Whether ``rtt_ms`` may be true; counts it when it is below the light-speed bound."""
        if rtt_ms >= bound_ms:
            return True
        self.below += 1
        self.example = self.example or (peer_id, rtt_ms, bound_ms)
        return False

    def reasons(self) -> dict[str, int]:
        counts = {REASON_BELOW_LIGHT: self.below, REASON_UNKNOWN_PEER: self.unknown,
                  REASON_TOO_OLD: self.too_old}
        return {reason: count for reason, count in counts.items() if count}

    def log(self, node_id: str, what: str, raw_days: int) -> None:
        if self.example is not None:
            log.warning("rejected %d %s from %s below the speed-of-light bound, e.g. "
                        "%s -> %s %.3f ms < %.3f ms", self.below, what, node_id, node_id,
                        *self.example)
        if self.unknown:
            log.warning("rejected %d %s from %s to unregistered peers", self.unknown, what,
                        node_id)
        if self.too_old:
            log.warning("rejected %d %s from %s taken more than %d days ago (past the store's "
                        "raw retention a retried batch could count twice)", self.too_old, what,
                        node_id, raw_days)


def _check_count(name: str, value: int) -> None:
    """uint64 counters from the wire must fit SQLite's signed 64-bit INTEGER."""
    if not 0 <= value < 2 ** 63:
        raise errors.InputError(f"expected a count between 0 and 2**63-1, got {value}", field=name)


def _where(node: NodeRef) -> tuple[float, float] | None:
    if node.latitude is not None and node.longitude is not None:
        return (node.latitude, node.longitude)
    return geo.coordinates(node.city)
