"""serve's metrics (planner/service/metrics.py): counters moved by the real ingest over a real
SQLite store, the fleet's state computed from store rows, and the scrape-time collector."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from hulk.errors import ConfigError, InputError, NotFoundError
from hulk.metrics import parse_metrics_address
from hulk.wire.records import (HeartbeatRequest, NodeLocation, ProbeKind, ProbeSample,
                               RegisterRequest, ReportRequest)
from planner.core.rollup import DailyRollup
from planner.service.ingest import IngestService
from planner.service.metrics import FleetCollector, PlannerMetrics, fleet_snapshot, read_snapshot
from planner.service.store import PairRollup, Store
from tests.helpers.clock import ManualClock

T0 = 1_790_000_000_000


@pytest.fixture
def served(tmp_path):
    clock = ManualClock(T0)
    store = Store(tmp_path / "planner.sqlite", clock=clock)
    metrics = PlannerMetrics(fleet="test")
    service = IngestService(store, clock=clock, events=metrics)
    # Beijing and Shanghai: about 1070 km apart, so an RTT under ~10 ms is faster than light.
    for node, city in (("a", "Beijing"), ("b", "Shanghai")):
        service.register(RegisterRequest(node, hostname=node, address="127.0.0.1",
                                         location=NodeLocation(city, None)))
    yield service, metrics, clock
    store.close()


def value(metrics: PlannerMetrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def sample(rtt: float, peer: str = "b", **overrides) -> ProbeSample:
    fields = dict(peer_id=peer, sent_at_ms=T0 - 1000, kind=int(ProbeKind.ICMP), payload_bytes=56,
                  lost=False, rtt_ms=rtt, timeout_ms=2000.0)
    fields.update(overrides)
    return ProbeSample(**fields)


def test_reports_count_received_stored_and_rejected_samples_by_reason(served):
    service, metrics, _ = served
    assert value(metrics, "hulk_registrations_total", node="a") == 1
    good = [sample(40.0), sample(0.0, lost=True)]
    bad = [sample(0.5), sample(30.0, peer="nobody")]   # faster than light; an unknown peer
    service.report(ReportRequest("a", "batch-1", tuple(good + bad)))
    assert value(metrics, "hulk_samples_received_total") == 4
    assert value(metrics, "hulk_samples_stored_total") == 2
    assert value(metrics, "hulk_samples_rejected_total", reason="below_light_speed") == 1
    assert value(metrics, "hulk_samples_rejected_total", reason="unknown_peer") == 1
    assert value(metrics, "hulk_reports_total", result="stored") == 1

    # The agent retries the same batch: received again, but stored and rejected once only.
    service.report(ReportRequest("a", "batch-1", tuple(good + bad)))
    assert value(metrics, "hulk_reports_total", result="duplicate") == 1
    assert value(metrics, "hulk_samples_received_total") == 8
    assert value(metrics, "hulk_samples_stored_total") == 2
    assert value(metrics, "hulk_samples_rejected_total", reason="below_light_speed") == 1


def test_refused_batches_and_unregistered_nodes_are_counted(served):
    service, metrics, _ = served
    with pytest.raises(InputError):
        service.report(ReportRequest("a", "batch-2", (sample(5000.0), sample(40.0))))  # > timeout
    assert value(metrics, "hulk_reports_total", result="invalid") == 1
    assert value(metrics, "hulk_samples_rejected_total", reason="invalid_batch") == 2
    with pytest.raises(NotFoundError):
        service.report(ReportRequest("ghost", "batch-3", (sample(40.0),)))
    assert value(metrics, "hulk_reports_total", result="unregistered") == 1
    assert value(metrics, "hulk_samples_stored_total") == 0


def test_heartbeats_feed_the_fleet_state_read_from_the_store(served):
    service, metrics, clock = served
    service.heartbeat(HeartbeatRequest("a", time_ms=T0 + 2500, spool_depth=7, spool_dropped=3))
    service.report(ReportRequest("a", "batch-1", (sample(40.0), sample(42.0), sample(0, lost=True))))
    assert value(metrics, "hulk_heartbeats_total") == 1
    clock.now = T0 + 20_000   # b last called at T0 (register), a at T0 too: both within 30 s
    snap = read_snapshot(service.store, node_timeout_s=30, now_ms=clock.now)
    assert snap.nodes == {"alive": 2, "silent": 0, "revoked": 0, "imported": 0}
    assert snap.clock_skew_s == {"a": 2.5}
    assert snap.spool_depth["a"] == 7 and snap.spool_dropped["a"] == 3
    link = snap.links[("Beijing", "Shanghai")]
    assert (link.samples, link.lost) == (3, 1) and link.mean_rtt_s == pytest.approx(0.041)
    silent = read_snapshot(service.store, node_timeout_s=30, now_ms=T0 + 31_000)
    assert silent.nodes["silent"] == 2 and silent.node_up == {"a": 0, "b": 0}

    metrics.watch_fleet(lambda: read_snapshot(service.store, node_timeout_s=30,
                                              now_ms=clock.now))
    assert value(metrics, "hulk_node_clock_skew_seconds", node="a") == 2.5
    assert value(metrics, "hulk_nodes", state="alive") == 2
    assert value(metrics, "hulk_link_rtt_seconds", src_site="Beijing",
                 dst_site="Shanghai") == pytest.approx(0.041)
    assert value(metrics, "hulk_node_spool_dropped_samples_total", node="a") == 3
    assert value(metrics, "hulk_store_read_ok") == 1


def test_site_pairs_merge_nodes_of_one_city_and_imported_nodes_count_apart():
    rows = [{"id": "bj-1", "city": "Beijing", "last_seen_ms": 15_000, "gpu_count": 8},
            {"id": "bj-2", "city": "Beijing", "last_seen_ms": 0},
            {"id": "x", "city": "", "last_seen_ms": None},
            {"id": "paper-3", "city": "Paris", "source": "import", "gpu_count": 4}]
    pairs = [PairRollup("bj-1", "x", DailyRollup(count=4, lost=0, sum=40.0)),
             PairRollup("bj-2", "x", DailyRollup(count=6, lost=2, sum=80.0))]
    snap = fleet_snapshot(rows, ["running", "failed", "failed"], pairs, now_ms=20_000,
                          node_timeout_s=10)
    assert snap.nodes == {"alive": 1, "silent": 2, "revoked": 0, "imported": 1}
    assert snap.node_up == {"bj-1": 1, "bj-2": 0, "x": 0}
    assert snap.gpus == {"bj-1": 8, "bj-2": 0, "x": 0, "paper-3": 4}
    assert snap.jobs["failed"] == 2 and snap.jobs["queued"] == 0
    link = snap.links[("Beijing", "x")]   # a node without a city is its own site
    assert (link.samples, link.lost) == (10, 2)
    assert link.mean_rtt_s == pytest.approx(120.0 / 8 / 1000)


def test_link_labels_use_a_declared_site_and_else_the_city_as_written():
    # Store.nodes' "site": the declared one, else the city's (the gazetteer's name).
    rows = [{"id": "bj-1", "city": "Beijing", "site": "bj-dc1", "last_seen_ms": 0},
            {"id": "bj-2", "city": "Beijing", "site": "bj-dc2", "last_seen_ms": 0},
            {"id": "bj-3", "city": "beijing", "site": "Beijing", "last_seen_ms": 0}]
    pairs = [PairRollup("bj-1", "bj-2", DailyRollup(count=4, lost=0, sum=4.0)),
             PairRollup("bj-3", "bj-2", DailyRollup(count=2, lost=0, sum=2.0))]
    snap = fleet_snapshot(rows, [], pairs, now_ms=20_000, node_timeout_s=10)
    assert set(snap.links) == {("bj-dc1", "bj-dc2"), ("beijing", "bj-dc2")}


def test_a_store_that_cannot_be_read_answers_the_scrape_with_read_ok_zero():
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("cannot schedule new futures after shutdown")

    metrics = PlannerMetrics()
    metrics.registry.register(FleetCollector(broken))
    text = generate_latest(metrics.registry).decode()
    assert "hulk_store_read_ok 0.0" in text and "hulk_nodes{" not in text
    assert calls


def test_snapshots_are_reused_for_max_age():
    reads = []
    now = [100.0]

    def read():
        reads.append(now[0])
        return fleet_snapshot([], [], [], now_ms=0, node_timeout_s=1)

    collector = FleetCollector(read, max_age_s=5, monotonic=lambda: now[0])
    list(collector.collect())
    list(collector.collect())
    now[0] += 5
    list(collector.collect())
    assert reads == [100.0, 105.0]


@pytest.mark.parametrize("text", ["9108", "host:", ":9108", "host:99999", "host:port", ""])
def test_bad_metrics_addresses_are_one_line_config_errors(text):
    with pytest.raises(ConfigError) as caught:
        parse_metrics_address(text, field="--metrics")
    assert str(caught.value).startswith("--metrics: expected HOST:PORT")


def test_metrics_addresses_parse():
    assert parse_metrics_address("127.0.0.1:9108") == ("127.0.0.1", 9108)
    assert parse_metrics_address("[::1]:0") == ("::1", 0)


# ------------------------------------------------------------------ the job lifecycle, recovery

async def test_the_lifecycle_and_recovery_count_state_changes_pushes_and_replans(tmp_path):
    from planner.core.placements import job_spec
    from planner.methods import planner_for
    from planner.service.lifecycle import JobLifecycle
    from planner.service.publisher import InMemoryPublisher
    from planner.service.recovery import Replanner
    from tests.helpers.plans import job, two_city_net
    from tests.helpers.serve import OPTIONS, FakeNodes, current_plan, store_jobs

    now = 1_000_000
    search = planner_for("search")
    metrics = PlannerMetrics()
    net = two_city_net(per_city=2)
    nodes = FakeNodes(net, {n: now for n in net.ids})
    broker = InMemoryPublisher()
    store = Store(tmp_path / "s.sqlite")
    jobs = store_jobs(store)
    lifecycle = JobLifecycle(current_plan(broker), nodes, jobs, options=OPTIONS, planner=search,
                             clock_ms=lambda: now, events=metrics)
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    a = store.job_by_name("a")
    assert value(metrics, "hulk_job_transitions_total", state="placed") == 1
    assert value(metrics, "hulk_placement_pushes_total", source="jobs") == 1
    assert value(metrics, "hulk_placement_messages_total") == len(a.nodes) + 1   # + the summary
    assert value(metrics, "hulk_plan_makespan_seconds") == pytest.approx(a.estimate_s)
    nodes.report(a.nodes, "running", "a", a.plan_id)
    await lifecycle.run_once()
    assert value(metrics, "hulk_job_transitions_total", state="running") == 1

    nodes.seen[a.nodes[0]] = now - 10_000
    recovery = Replanner(current_plan(broker), nodes, jobs, options=OPTIONS, planner=search,
                         clock_ms=lambda: now, started_ms=0, events=metrics)
    report = await recovery.run_once()
    assert value(metrics, "hulk_replans_total") == 1
    assert value(metrics, "hulk_replanned_jobs_total", outcome="replanned") == len(report.replanned)
    assert value(metrics, "hulk_replanned_jobs_total", outcome="lost") == len(report.lost)
    assert value(metrics, "hulk_placement_pushes_total", source="recovery") == 1

    broker.unavailable = True
    store.submit_job("b", job_spec(job("b", "bert-large", ("python", "train.py"))))
    assert await lifecycle.run_once() is None
    assert value(metrics, "hulk_placement_push_failures_total", source="jobs") == 1
    store.close()


def test_the_store_reader_reuses_link_rollups_for_a_minute(served):
    from planner.service.metrics import StoreReader

    service, _, clock = served
    now = [0.0]
    reader = StoreReader(service.store, node_timeout_s=30, monotonic=lambda: now[0])
    assert reader().links == {}
    service.report(ReportRequest("a", "batch-1", (sample(40.0),)))
    assert reader().links[("Beijing", "Shanghai")].samples == 1   # an empty read is not reused
    service.report(ReportRequest("a", "batch-2", (sample(40.0),)))
    assert reader().links[("Beijing", "Shanghai")].samples == 1   # read a moment ago
    now[0] += 60
    assert reader().links[("Beijing", "Shanghai")].samples == 2
