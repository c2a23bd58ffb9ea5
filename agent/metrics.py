"""Prometheus metrics of `hulk-agent` (``--metrics HOST:PORT``; docs/METRICS.md).

The runtime, reporter and placement subscriber report events to an :class:`AgentEvents`; the
default, ``NO_EVENTS``, does nothing (an agent without ``--metrics``). :class:`AgentMetrics`
counts them into its own registry and, at scrape time, reads the spool's depth and drops and
whether the agent is registered (:meth:`AgentMetrics.watch`).

Labels stay bounded: fixed sets of reasons and outcomes, and per peer for at most
``MAX_PEER_LABELS`` peers (the rest share ``peer="_other"``): summed over every agent, per-peer
series grow with the square of the fleet, so large fleets read links from the planner's
per-city-pair metrics. The RTT histogram has no peer label for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from agent.spool_store import RESTART_REASONS
from hulk import errors
from hulk.wire.records import ExitCause, LaunchState, LaunchStatus, PeerSummary, ProbeSample

# Closed label sets, exported at 0 from the start so alerts see them before the first event.
REFUSAL_REASONS = ("malformed", "no_key", "bad_signature", "misaddressed", "expired", "future",
                   "validity", "replayed", "command_not_allowed")
REPORT_FAILURES = ("unavailable", "unregistered", "refused", "denied", "spool", "error")
MAX_PEER_LABELS = 64
OTHER_PEERS = "_other"
# RTT histogram buckets (seconds): a rack, a metro, a continent, across the world, a bad link.
RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.5)


def report_failure_reason(err: errors.HulkError) -> str:
    """The ``reason`` label of a failed Report."""
    if isinstance(err, errors.UnavailableError):
        return "unavailable"
    if isinstance(err, errors.NotFoundError):
        return "unregistered"
    if isinstance(err, errors.InputError):
        return "refused"
    if isinstance(err, (errors.UnauthenticatedError, errors.PermissionDeniedError,
                        errors.RateLimitedError)):
        return "denied"
    if isinstance(err, errors.StoreError):
        return "spool"
    return "error"


class AgentEvents:
    """What the agent's parts report as it happens. This base does nothing."""

    def probed(self, samples: Sequence[ProbeSample | PeerSummary]) -> None: ...

    def reported(self, samples: int, rejected: int, duplicate: bool) -> None: ...

    def report_failed(self, err: errors.HulkError) -> None: ...

    def heartbeat(self, ok: bool, sent_ms: int = 0, answered_ms: int = 0,
                  server_ms: int = 0) -> None: ...

    def placement_refused(self, reason: str) -> None: ...

    def launch_changed(self, old: LaunchStatus, new: LaunchStatus) -> None: ...


NO_EVENTS = AgentEvents()


class AgentMetrics(AgentEvents):
    """The agent's metrics in their own registry (``registry``)."""

    def __init__(self, node_id: str, *, registry: Any = None):
        from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                                       disable_created_metrics)

        disable_created_metrics()   # no *_created series: the process's start time says the same
        self.registry = r = registry or CollectorRegistry()
        Gauge("hulk_agent_info", "This agent: its node id and version (always 1)",
              ["node", "version"], registry=r).labels(node_id, _version()).set(1)
        self.probes = Counter("hulk_agent_probes", "Probe packets (or TCP connects) sent, by peer",
                              ["peer"], registry=r)
        self.losses = Counter("hulk_agent_probe_losses", "Probes that got no answer in time, by "
                              "peer", ["peer"], registry=r)
        self.rtt = Histogram("hulk_agent_rtt_seconds", "Round-trip times of answered probes to "
                             "every peer", buckets=RTT_BUCKETS, registry=r)
        self.last_rtt = Gauge("hulk_agent_peer_rtt_seconds", "The last answered probe's RTT, by "
                              f"peer (past {MAX_PEER_LABELS} peers: the latest of the others)",
                              ["peer"], registry=r)
        self.reports = Counter("hulk_agent_reports", "Report batches the planner acknowledged",
                               registry=r)
        self.reported_samples = Counter("hulk_agent_reported_samples", "Samples the planner "
                                        "acknowledged", registry=r)
        self.planner_rejected = Counter("hulk_agent_samples_rejected_by_planner", "Samples the "
                                        "planner acknowledged but rejected (speed of light, "
                                        "unknown peer, too old)", registry=r)
        self.report_failures = Counter("hulk_agent_report_failures", "Report calls that failed, "
                                       "by reason", ["reason"], registry=r)
        self.heartbeats = Counter("hulk_agent_heartbeats", "Heartbeat calls, by result",
                                  ["result"], registry=r)
        self.skew = Gauge("hulk_agent_clock_skew_seconds", "This node's clock minus the "
                          "planner's, from the last heartbeat (half its round trip taken off)",
                          registry=r)
        self.refusals = Counter("hulk_agent_placement_refusals", "Placements refused, by reason",
                                ["reason"], registry=r)
        self.launches = Counter("hulk_agent_launches", "Training processes started", registry=r)
        self.launch_failures = Counter("hulk_agent_launch_failures", "Training processes that "
                                       "could not start (refused commands are counted as "
                                       "placement refusals)", registry=r)
        self.exits = Counter("hulk_agent_job_exits", "Training processes that ended, by outcome "
                             "(success: exit code 0; fenced: stopped by its wrapper, "
                             "the node's lease lapsed)", ["outcome"], registry=r)
        self.launch_state = Gauge("hulk_agent_launch_state", "1 for the launch state this node "
                                  "is in, 0 for the others", ["state"], registry=r)
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason)
        for reason in REPORT_FAILURES:
            self.report_failures.labels(reason)
        for result in ("ok", "failed"):
            self.heartbeats.labels(result)
        for outcome in ("success", "error"):
            self.exits.labels(outcome)
        self._peers: dict[str, tuple[Any, Any, Any]] = {}   # peer -> its (or _other's) children
        self._named = 0                                      # peers with a label of their own
        self._set_launch_state(LaunchState.IDLE)

    def watch(self, runtime: Any) -> None:
        """Export ``runtime``'s spool depth and drops, peers and registration at scrape time."""
        self.registry.register(_RuntimeCollector(lambda: runtime))

    # ------------------------------------------------------------------ events
    def probed(self, samples: Sequence[ProbeSample | PeerSummary]) -> None:
        # One inc per peer and batch, children looked up once per peer: this runs for every
        # probe packet, and the agent must stay light.
        sent: dict[str, int] = {}
        lost: dict[str, int] = {}
        last: dict[str, float] = {}
        for s in samples:
            if isinstance(s, PeerSummary):
                # A round folded into one summary: its packets count, its mean RTT is observed
                # once (the histogram then counts rounds, not packets).
                sent[s.peer_id] = sent.get(s.peer_id, 0) + s.count
                if s.lost:
                    lost[s.peer_id] = lost.get(s.peer_id, 0) + s.lost
                if s.received:
                    seconds = s.rtt_sum_ms / s.received / 1000.0
                    self.rtt.observe(seconds)
                    last[s.peer_id] = seconds
                continue
            sent[s.peer_id] = sent.get(s.peer_id, 0) + 1
            if s.lost:
                lost[s.peer_id] = lost.get(s.peer_id, 0) + 1
            else:
                seconds = s.rtt_ms / 1000.0
                self.rtt.observe(seconds)
                last[s.peer_id] = seconds
        for peer, count in sent.items():
            probes, losses, last_rtt = self._peer(peer)
            probes.inc(count)
            if peer in lost:
                losses.inc(lost[peer])
            if peer in last:
                last_rtt.set(last[peer])

    def _peer(self, peer: str) -> tuple[Any, Any, Any]:
        children = self._peers.get(peer)
        if children is None:
            label = peer if self._named < MAX_PEER_LABELS else OTHER_PEERS
            self._named += label == peer
            children = self._peers[peer] = (self.probes.labels(label), self.losses.labels(label),
                                            self.last_rtt.labels(label))
        return children

    def reported(self, samples: int, rejected: int, duplicate: bool) -> None:
        self.reports.inc()
        self.reported_samples.inc(samples)
        if not duplicate:
            self.planner_rejected.inc(rejected)

    def report_failed(self, err: errors.HulkError) -> None:
        self.report_failures.labels(report_failure_reason(err)).inc()

    def heartbeat(self, ok: bool, sent_ms: int = 0, answered_ms: int = 0,
                  server_ms: int = 0) -> None:
        self.heartbeats.labels("ok" if ok else "failed").inc()
        if ok and server_ms > 0:
            self.skew.set(((sent_ms + answered_ms) / 2.0 - server_ms) / 1000.0)

    def placement_refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def launch_changed(self, old: LaunchStatus, new: LaunchStatus) -> None:
        self._set_launch_state(new.state)
        if (old.state, old.plan_id, old.job) == (new.state, new.plan_id, new.job):
            return  # a detail update of the same state
        if new.state == LaunchState.RUNNING:
            self.launches.inc()
        elif new.state == LaunchState.EXITED and old.state != LaunchState.EXITED:
            self.exits.labels("fenced" if new.exit_cause == ExitCause.FENCED else
                              "success" if new.exit_code == 0 else "error").inc()
        elif new.state == LaunchState.FAILED:
            if new.detail.startswith("refused:"):
                self.refusals.labels("command_not_allowed").inc()
            else:
                self.launch_failures.inc()

    def _set_launch_state(self, state: LaunchState) -> None:
        for each in LaunchState:
            if each != LaunchState.UNSPECIFIED:
                self.launch_state.labels(each.name.lower()).set(1 if each == state else 0)


class _RuntimeCollector:
    """Reads the runtime when Prometheus scrapes (plain attribute reads: safe from the HTTP
    server's thread)."""

    def __init__(self, runtime: Callable[[], Any]):
        self.runtime = runtime

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        runtime = self.runtime()
        spool = runtime.spool
        yield GaugeMetricFamily("hulk_agent_spool_depth_samples", "Samples waiting to be "
                                "reported (on disk and in memory)", value=spool.depth)
        yield GaugeMetricFamily("hulk_agent_spool_held_samples", "Samples waiting in memory for "
                                "room on disk", value=spool.held)
        yield GaugeMetricFamily("hulk_agent_spool_max_samples", "Most samples the spool keeps "
                                "before dropping the oldest", value=spool.max_samples)
        yield CounterMetricFamily("hulk_agent_spool_dropped_samples", "Samples the spool "
                                  "dropped (full, or refused by the planner), over its life",
                                  value=spool.dropped)
        # A test's plain Spool has neither: it is a file, never restarted.
        yield GaugeMetricFamily("hulk_agent_spool_in_memory", "1 while no spool file can be "
                                "written (state directory read-only or full): samples wait in "
                                "memory and are lost if the agent stops",
                                value=1 if getattr(spool, "in_memory", False) else 0)
        restarts = CounterMetricFamily("hulk_agent_spool_restarts", "Fresh spools started in "
                                       "place of a corrupt spool file (moved aside) or of one "
                                       "deleted or replaced while the agent ran",
                                       labels=["reason"])
        for reason, count in getattr(spool, "restarts", dict.fromkeys(RESTART_REASONS, 0)).items():
            restarts.add_metric([reason], count)
        yield restarts
        registration = runtime.registration
        yield GaugeMetricFamily("hulk_agent_registered", "1 once the planner accepted this "
                                "node's registration", value=1 if registration else 0)
        yield GaugeMetricFamily("hulk_agent_peers", "Peers this node probes",
                                value=len(registration.peers) if registration else 0)


def _version() -> str:
    from hulk import __version__
    return __version__
