"""Prometheus metrics of `hulk-planner serve` (``serve --metrics HOST:PORT``; docs/METRICS.md).

Two kinds:

* events, counted as they happen: the serve parts call a :class:`ServeEvents` (ingest: register,
  report, heartbeat; recovery: re-plans; the job lifecycle: state changes; both: pushes). The
  default, ``NO_EVENTS``, does nothing, so serve without ``--metrics`` pays nothing;
  :class:`PlannerMetrics` counts into its own registry.
* the fleet's state, read from the store when Prometheus scrapes (:class:`FleetCollector`): nodes
  alive, silent or revoked, clock skew, spool depth and drops as each node's last heartbeat told,
  jobs by state, RTT and loss per site pair. :func:`fleet_snapshot` computes it (pure: rows in,
  values out); the collector reads the store on the store's thread and keeps a snapshot a few
  seconds.

Labels stay bounded: per node, per state or reason (fixed sets), and links per *site* pair (a
site is the one the node's agent declared, else its city, else its id), never per raw peer pair of a large fleet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hulk import __version__
from planner.core.probe_plan import site_key
from planner.service.node_state import (ALIVE, IMPORTED, NODE_STATES, REVOKED, SILENT,
                                        node_state, revoked_nodes)

log = logging.getLogger(__name__)
disable_created_metrics()   # no *_created series: the process's start time says the same

# Closed label sets: every value is exported from the start (at 0), so alerts and dashboards
# see a series before the first event.
REJECT_REASONS = ("below_light_speed", "unknown_peer", "invalid_batch", "too_old")
REPORT_RESULTS = ("stored", "duplicate", "invalid", "unregistered")
PUSH_SOURCES = ("recovery", "jobs", "resign", "reconcile")
RESEND_REASONS = ("lost", "unplanned")    # planner.core.reconcile.REASONS
THROUGHPUT_RESULTS = ("ok", "failed", "rejected")
LINK_MODEL_OUTCOMES = ("switched", "kept", "failed")   # planner.service.link_model
JOB_STATES = ("queued", "placed", "running", "succeeded", "failed", "cancelled")
LAUNCH_STATES = ("idle", "starting", "running", "exited", "failed")
GBPS_BUCKETS = (0.1, 0.3, 1, 3, 10, 30, 100, 300)
RTT_DAYS = 2   # link gauges average the daily rollups of today and yesterday (UTC)


class ServeEvents:
    """What the serve parts report as it happens. This base does nothing (serve without
    ``--metrics``); :class:`PlannerMetrics` counts."""

    def registered(self, node_id: str) -> None: ...

    def heartbeat(self, node_id: str) -> None: ...

    def reported(self, received: int, accepted: int, rejected: Mapping[str, int],
                 duplicate: bool) -> None: ...

    def report_refused(self, result: str, samples: int, reason: str | None = None) -> None: ...

    def replanned(self, replanned: int, lost: int) -> None: ...

    def plan_pushed(self, source: str, messages: int, makespan_s: float | None = None) -> None: ...

    def push_failed(self, source: str) -> None: ...

    def plan_retained(self, makespan_s: float | None) -> None:
        """The makespan of the plan found retained when serve started (no push counted)."""

    def job_moved(self, state: str) -> None: ...

    def placement_resent(self, reason: str) -> None:
        """A node's placement sent again by reconciliation: lost or unplanned."""

    def throughput_result(self, result: str, gbps: float | None) -> None:
        """A throughput test's result: ok, failed (the test ran and failed) or rejected (an
        unscheduled test, or from the wrong node); ``gbps`` of an ok one."""

    def calibrated(self, factors: Mapping[str, float]) -> None:
        """The factors serve now plans with (planner.service.calibration_refit.factors)."""

    def link_model_refit(self, outcome: str, candidate: Any = None, old: Any = None) -> None:
        """A refit of the link model (planner.service.link_model): switched, kept or failed;
        ``candidate`` / ``old``: their held-out scores (``Score``), None when not compared."""


NO_EVENTS = ServeEvents()


def plan_makespan_s(plan: Any, net: Any) -> float | None:
    """The cost model's makespan of ``plan`` on ``net`` (docs/COSTMODEL.md section 5); None when it
    cannot be estimated (the gauge keeps its last value)."""
    from planner.core.costmodel import estimate_plan
    try:
        return estimate_plan(list(plan.placements), net).makespan_s
    except Exception:  # a metric never breaks a push
        log.debug("makespan estimate failed", exc_info=True)
        return None


# ------------------------------------------------------------------------------ fleet state

@dataclass(frozen=True)
class LinkStats:
    samples: int
    lost: int
    mean_rtt_s: float | None


@dataclass(frozen=True)
class FleetSnapshot:
    """The store's view of the fleet as metric values (what one scrape exports)."""

    nodes: dict[str, int]                      # alive / silent / revoked / imported -> count
    node_up: dict[str, int]                    # node -> 1 alive, 0 silent (agents', unrevoked)
    last_seen_s: dict[str, float]              # node -> epoch seconds of its last call
    clock_skew_s: dict[str, float]             # node -> agent clock minus planner clock
    spool_depth: dict[str, int]                # node -> samples its spool held (last heartbeat)
    spool_dropped: dict[str, int]              # node -> samples its spool dropped, cumulative
    gpus: dict[str, int]                       # node -> GPUs
    launch_states: dict[str, int]              # launch state (alive nodes), silent, revoked
    jobs: dict[str, int]                       # job state -> jobs (retired included)
    links: dict[tuple[str, str], LinkStats] = field(default_factory=dict)  # site pair -> stats
    throughput_gbps: dict[tuple[str, str], float] = field(default_factory=dict)  # site pair
    # (job, "measured" | "estimated") -> seconds a step, for unretired jobs that measured one
    job_iteration_s: dict[tuple[str, str], float] = field(default_factory=dict)


def site_of(row: Mapping[str, Any]) -> str:
    """A node's site label: the site its agent declared (``Store.nodes``' ``site`` when it is not
    its city's), else its city as written, else its id."""
    city = (row.get("city") or "").strip()
    site = row.get("site")
    if site and site != site_key(city):
        return site
    return city or str(row["id"])


def fleet_snapshot(node_rows: Sequence[Mapping[str, Any]], job_states: Iterable[str],
                   pairs: Iterable[Any], *, now_ms: int, node_timeout_s: float,
                   throughput: Mapping[tuple[str, str], tuple[float, int]] | None = None,
                   iterations: Iterable[tuple[str, float, float | None]] = (),
                   revoked: Collection[str] = ()) -> FleetSnapshot:
    """Metric values from the store's rows: ``node_rows`` (Store.nodes), each job's state,
    ``pairs`` (Store.window_rollups: src, dst, rollup), ``throughput``
    (Store.throughput_by_site_pair, by the store's site names), ``iterations`` (job, measured
    and estimated seconds a step: Store.job_iterations), ``revoked`` (node ids). A node's state
    is ``planner.service.node_state``'s, as `fleet show` prints it; a launch state counts only
    for alive nodes (a silent node's last report is no longer known true)."""
    counts = dict.fromkeys(NODE_STATES, 0)
    up, seen, skew, depth, dropped, gpus = {}, {}, {}, {}, {}, {}
    launch = dict.fromkeys((*LAUNCH_STATES, SILENT, REVOKED), 0)
    sites = {}
    for row in node_rows:
        node = str(row["id"])
        sites[node] = site_of(row)
        gpus[node] = int(row.get("gpu_count") or 0)
        state = node_state(row, now_ms=now_ms, node_timeout_s=node_timeout_s, revoked=revoked)
        counts[state] += 1
        if state == IMPORTED:
            continue
        if state != ALIVE:
            launch[state] += 1
        last = row.get("last_seen_ms")
        if state != REVOKED:   # taken out on purpose: no "node down" alert for it
            up[node] = int(state == ALIVE)
        if last is not None:
            seen[node] = last / 1000.0
        if row.get("clock_skew_ms") is not None:
            skew[node] = row["clock_skew_ms"] / 1000.0
        depth[node] = int(row.get("spool_depth") or 0)
        dropped[node] = int(row.get("spool_dropped") or 0)
        reported = (row.get("launch_state") or "").lower()
        if state == ALIVE and reported in LAUNCH_STATES:
            launch[reported] += 1
    jobs = dict.fromkeys(JOB_STATES, 0)
    for state in job_states:
        jobs[state] = jobs.get(state, 0) + 1
    merged: dict[tuple[str, str], list[float]] = {}
    for pair in pairs:
        key = (sites.get(pair.src, pair.src), sites.get(pair.dst, pair.dst))
        acc = merged.setdefault(key, [0, 0, 0.0])
        acc[0] += pair.rollup.count
        acc[1] += pair.rollup.lost
        acc[2] += pair.rollup.sum
    links = {}
    for key, (count, lost, total_ms) in merged.items():
        received = count - lost
        links[key] = LinkStats(int(count), int(lost),
                               total_ms / received / 1000.0 if received > 0 else None)
    label = {row.get("site"): site_of(row) for row in node_rows if row.get("site")}
    measured = {(label.get(a, a), label.get(b, b)): gbps
                for (a, b), (gbps, _) in (throughput or {}).items()}
    steps: dict[tuple[str, str], float] = {}
    for job, measured_s, estimated_s in iterations:
        steps[(job, "measured")] = measured_s
        if estimated_s is not None:
            steps[(job, "estimated")] = estimated_s
    return FleetSnapshot(counts, up, seen, skew, depth, dropped, gpus, launch, jobs, links,
                         measured, steps)


def snapshot_metrics(snap: FleetSnapshot) -> list[Metric]:
    """The snapshot as Prometheus metric families."""
    def per_node(family: GaugeMetricFamily | CounterMetricFamily,
                 values: Mapping[str, float]) -> Metric:
        for node, value in sorted(values.items()):
            family.add_metric([node], value)
        return family

    nodes = GaugeMetricFamily("hulk_nodes", "Nodes by state: alive (an agent called within "
                              "--node-timeout), silent, revoked (hulk-planner revoke), imported "
                              "(no agent)", labels=["state"])
    for state, count in snap.nodes.items():
        nodes.add_metric([state], count)
    launch = GaugeMetricFamily("hulk_nodes_launch_state", "Alive nodes by the launch state "
                               "their last heartbeat reported; silent and revoked nodes apart",
                               labels=["state"])
    for state, count in snap.launch_states.items():
        launch.add_metric([state], count)
    jobs = GaugeMetricFamily("hulk_jobs", "Submitted jobs by state (retired ones included)",
                             labels=["state"])
    for state, count in snap.jobs.items():
        jobs.add_metric([state], count)
    rtt = GaugeMetricFamily("hulk_link_rtt_seconds", f"Mean RTT from one site to another over "
                            f"the last {RTT_DAYS} UTC days of samples",
                            labels=["src_site", "dst_site"])
    loss = GaugeMetricFamily("hulk_link_loss_ratio", f"Lost probe fraction from one site to "
                             f"another over the last {RTT_DAYS} UTC days",
                             labels=["src_site", "dst_site"])
    samples = GaugeMetricFamily("hulk_link_samples", f"Probe samples from one site to another "
                                f"over the last {RTT_DAYS} UTC days",
                                labels=["src_site", "dst_site"])
    for (src, dst), link in sorted(snap.links.items()):
        samples.add_metric([src, dst], link.samples)
        if link.samples:
            loss.add_metric([src, dst], link.lost / link.samples)
        if link.mean_rtt_s is not None:
            rtt.add_metric([src, dst], link.mean_rtt_s)
    throughput = GaugeMetricFamily("hulk_site_pair_throughput_gbps", "Median Gbit/s of the "
                                   "throughput tests from one site to another (90 days)",
                                   labels=["src_site", "dst_site"])
    for (src, dst), gbps in sorted(snap.throughput_gbps.items()):
        throughput.add_metric([src, dst], gbps)
    iteration = GaugeMetricFamily("hulk_job_iteration_seconds", "Seconds a training step of "
                                  "an unretired job takes: measured (its slowest rank's median) "
                                  "or estimated (the plan's cost model)", labels=["job", "kind"])
    for (job, kind), seconds in sorted(snap.job_iteration_s.items()):
        iteration.add_metric([job, kind], seconds)
    return [
        nodes, launch, jobs, rtt, loss, samples, throughput, iteration,
        per_node(GaugeMetricFamily("hulk_node_up", "1 while the node's agent calls within "
                                   "--node-timeout, else 0", labels=["node"]), snap.node_up),
        per_node(GaugeMetricFamily("hulk_node_last_seen_timestamp_seconds", "When the node's "
                                   "agent last called (epoch seconds)", labels=["node"]),
                 snap.last_seen_s),
        per_node(GaugeMetricFamily("hulk_node_clock_skew_seconds", "The agent's clock minus the "
                                   "planner's, as its last heartbeat measured", labels=["node"]),
                 snap.clock_skew_s),
        per_node(GaugeMetricFamily("hulk_node_spool_depth_samples", "Samples waiting in the "
                                   "node's spool (its last heartbeat)", labels=["node"]),
                 snap.spool_depth),
        per_node(CounterMetricFamily("hulk_node_spool_dropped_samples", "Samples the node's "
                                     "spool dropped, over its life (its last heartbeat or report)",
                                     labels=["node"]), snap.spool_dropped),
        per_node(GaugeMetricFamily("hulk_node_gpus", "GPUs the node registered", labels=["node"]),
                 snap.gpus),
    ]


def read_snapshot(store: Any, *, node_timeout_s: float, now_ms: int | None = None,
                  pairs: Sequence[Any] | None = None) -> FleetSnapshot:
    """The snapshot from a Store (call on the store's thread); ``pairs``: link rollups already
    read (else read now)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if pairs is None:
        pairs = store.window_rollups(RTT_DAYS)
    records = store.job_records()
    unretired = {r.name for r in records if r.retired_ms is None}
    return fleet_snapshot(store.nodes(), [r.state for r in records], pairs,
                          now_ms=now, node_timeout_s=node_timeout_s,
                          revoked=revoked_nodes(store),
                          throughput=store.throughput_by_site_pair(),
                          iterations=[(j.job_name, j.measured_iteration_s, j.estimated_iteration_s)
                                      for j in store.job_iterations() if j.job_name in unretired])


class StoreReader:
    """``read_snapshot`` for scrapes, with the link rollups (the costly part: a grouped read of
    every pair's daily rollups) reused for ``links_max_age_s``; daily averages move slowly."""

    def __init__(self, store: Any, *, node_timeout_s: float, links_max_age_s: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic):
        self.store, self.node_timeout_s = store, node_timeout_s
        self.links_max_age_s, self.monotonic = links_max_age_s, monotonic
        self._pairs: tuple[float, list[Any]] | None = None

    def __call__(self) -> FleetSnapshot:
        now = self.monotonic()
        # An empty read (nothing measured yet) costs nothing and is not reused: a new fleet's
        # first links show up at the next scrape.
        if not self._pairs or not self._pairs[1] or now - self._pairs[0] >= self.links_max_age_s:
            self._pairs = (now, self.store.window_rollups(RTT_DAYS))
        return read_snapshot(self.store, node_timeout_s=self.node_timeout_s,
                             pairs=self._pairs[1])


class FleetCollector:
    """A custom collector: on scrape, the fleet's state from ``read()`` (serve passes a call that
    runs on the store's thread), reused for ``max_age_s`` so frequent scrapes cost one read.
    A failed read exports ``hulk_store_read_ok 0`` and nothing else from the store."""

    def __init__(self, read: Callable[[], FleetSnapshot], *, max_age_s: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic):
        self.read, self.max_age_s, self.monotonic = read, max_age_s, monotonic
        self._lock = threading.Lock()   # scrapes come on the HTTP server's threads
        self._cached: tuple[float, FleetSnapshot] | None = None

    def snapshot(self) -> FleetSnapshot | None:
        with self._lock:
            now = self.monotonic()
            if self._cached is None or now - self._cached[0] >= self.max_age_s:
                try:
                    self._cached = (now, self.read())
                except Exception as exc:  # a scrape must answer; the store may be stopping
                    log.warning("metrics: cannot read the store: %s", exc)
                    self._cached = None
                    return None
            return self._cached[1]

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        ok = GaugeMetricFamily("hulk_store_read_ok", "1 when this scrape could read the store")
        ok.add_metric([], 1 if snap is not None else 0)
        yield ok
        if snap is not None:
            yield from snapshot_metrics(snap)


# ------------------------------------------------------------------------------ events

class PlannerMetrics(ServeEvents):
    """Serve's counters and gauges in their own registry (``registry``), which
    ``hulk.metrics.start_metrics_server`` serves."""

    def __init__(self, *, fleet: str = "default", registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        info = Gauge("hulk_planner_info", "This planner: its version and fleet (always 1)",
                     ["version", "fleet"], registry=r)
        info.labels(__version__, fleet).set(1)
        self.registrations = Counter("hulk_registrations", "Register calls accepted",
                                     ["node"], registry=r)
        self.heartbeats = Counter("hulk_heartbeats", "Heartbeat calls from known nodes",
                                  registry=r)
        self.reports = Counter("hulk_reports", "Report calls by result: stored, duplicate (a "
                               "retried batch already stored), invalid (refused whole), "
                               "unregistered", ["result"], registry=r)
        self.samples_received = Counter("hulk_samples_received", "Probe samples received in "
                                        "Report batches (retried duplicates included)",
                                        registry=r)
        self.samples_stored = Counter("hulk_samples_stored", "Probe samples stored", registry=r)
        self.samples_rejected = Counter("hulk_samples_rejected", "Probe samples rejected, by "
                                        "reason", ["reason"], registry=r)
        self.replans = Counter("hulk_replans", "Re-plans after nodes of the plan went silent",
                               registry=r)
        self.replanned_jobs = Counter("hulk_replanned_jobs", "Jobs re-planned (moved to other "
                                      "nodes) or lost (queued again) by recovery",
                                      ["outcome"], registry=r)
        self.pushes = Counter("hulk_placement_pushes", "Signed plans pushed to the broker, by "
                              "source: recovery, jobs (the lifecycle), resign", ["source"],
                              registry=r)
        self.push_messages = Counter("hulk_placement_messages", "Retained placement and "
                                     "summary messages the broker acknowledged", registry=r)
        self.push_failures = Counter("hulk_placement_push_failures", "Rounds that could not "
                                     "read or push the plan (broker unreachable, refused)",
                                     ["source"], registry=r)
        self.resent = Counter("hulk_placements_resent", "Node placements sent again because "
                              "the node ran other than the plan: lost (a planned job missing), "
                              "unplanned (a job the plan does not give it)", ["reason"],
                              registry=r)
        self.job_transitions = Counter("hulk_job_transitions", "Job state changes the "
                                       "lifecycle made, by new state", ["state"], registry=r)
        self.makespan = Gauge("hulk_plan_makespan_seconds", "The cost model's makespan of the "
                              "last plan pushed", registry=r)
        self.throughput_tests = Counter("hulk_throughput_tests", "Throughput test results "
                                        "reported: ok, failed, rejected (an unscheduled test or "
                                        "the wrong node)", ["result"], registry=r)
        self.throughput_gbps = Histogram("hulk_throughput_measured_gbps", "Gbit/s of each ok "
                                         "throughput test", buckets=GBPS_BUCKETS, registry=r)
        self.calibration = Gauge("hulk_calibration_factor", "A factor of the calibrated cost "
                                 "model serve plans with: compute:<gpu> (multiplier), "
                                 "hop_overhead_s, micro_batch_overhead_s and "
                                 "step_overhead_s (seconds), communication (divisor of "
                                 "bandwidths), outer_sync (multiplier of a DiLoCo job's outer "
                                 "sync); 1, 0, 0, 0, 1 and 1 when not fitted", ["factor"],
                                 registry=r)
        self.link_refits = Counter("hulk_link_model_refits", "Refits of the link model that "
                                   "predicts unmeasured site pairs: switched (the new fit is in "
                                   "use), kept (it was worse on held-out pairs), failed",
                                   ["outcome"], registry=r)
        self.link_error = Gauge("hulk_link_model_heldout_error", "p90 |ln(predicted / "
                                "measured)| on the last refit's held-out pairs, by model (new, "
                                "old) and quantity (throughput, rtt)", ["model", "quantity"],
                                registry=r)
        self.plan_time = Gauge("hulk_plan_pushed_timestamp_seconds", "When the last plan was "
                               "pushed (epoch seconds)", registry=r)
        for reason in REJECT_REASONS:
            self.samples_rejected.labels(reason)
        for result in REPORT_RESULTS:
            self.reports.labels(result)
        for source in PUSH_SOURCES:
            self.pushes.labels(source)
            self.push_failures.labels(source)
        for state in JOB_STATES:
            self.job_transitions.labels(state)
        for reason in RESEND_REASONS:
            self.resent.labels(reason)
        for outcome in ("replanned", "lost"):
            self.replanned_jobs.labels(outcome)
        for result in THROUGHPUT_RESULTS:
            self.throughput_tests.labels(result)
        for outcome in LINK_MODEL_OUTCOMES:
            self.link_refits.labels(outcome)

    def watch_fleet(self, read: Callable[[], FleetSnapshot], *, max_age_s: float = 5.0) -> None:
        """Export the fleet's state, read by ``read()`` at scrape time."""
        self.registry.register(FleetCollector(read, max_age_s=max_age_s))

    def registered(self, node_id: str) -> None:
        self.registrations.labels(node_id).inc()

    def heartbeat(self, node_id: str) -> None:
        self.heartbeats.inc()

    def reported(self, received: int, accepted: int, rejected: Mapping[str, int],
                 duplicate: bool) -> None:
        self.samples_received.inc(received)
        if duplicate:  # stored (and counted) the first time it came
            self.reports.labels("duplicate").inc()
            return
        self.reports.labels("stored").inc()
        self.samples_stored.inc(accepted)
        for reason, count in rejected.items():
            self.samples_rejected.labels(reason).inc(count)

    def report_refused(self, result: str, samples: int, reason: str | None = None) -> None:
        self.reports.labels(result).inc()
        self.samples_received.inc(samples)
        if reason:
            self.samples_rejected.labels(reason).inc(samples)

    def replanned(self, replanned: int, lost: int) -> None:
        self.replans.inc()
        self.replanned_jobs.labels("replanned").inc(replanned)
        self.replanned_jobs.labels("lost").inc(lost)

    def plan_pushed(self, source: str, messages: int, makespan_s: float | None = None) -> None:
        self.pushes.labels(source).inc()
        self.push_messages.inc(messages)
        self.plan_time.set(time.time())
        if makespan_s is not None:
            self.makespan.set(makespan_s)

    def push_failed(self, source: str) -> None:
        self.push_failures.labels(source).inc()

    def plan_retained(self, makespan_s: float | None) -> None:
        if makespan_s is not None:
            self.makespan.set(makespan_s)

    def job_moved(self, state: str) -> None:
        self.job_transitions.labels(state).inc()

    def placement_resent(self, reason: str) -> None:
        self.resent.labels(reason).inc()

    def throughput_result(self, result: str, gbps: float | None) -> None:
        self.throughput_tests.labels(result).inc()
        if gbps is not None:
            self.throughput_gbps.observe(gbps)

    def calibrated(self, factors: Mapping[str, float]) -> None:
        self.calibration.clear()     # a GPU model no longer seen leaves
        for name, value in factors.items():
            self.calibration.labels(name).set(value)

    def link_model_refit(self, outcome: str, candidate: Any = None, old: Any = None) -> None:
        self.link_refits.labels(outcome).inc()
        for model, result in (("new", candidate), ("old", old)):
            for quantity in ("throughput", "rtt"):
                value = getattr(result, quantity, None)
                if value is not None:
                    self.link_error.labels(model, quantity).set(value)
