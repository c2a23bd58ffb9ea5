"""Hostile and broken agents against the planner's ingest (IngestService over a real SQLite store).

Each case is refused as invalid input naming its field, or stored without losing a sample;
whatever admission accepts stays within its bounds once stored and folded.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.spool import Spool
from hulk.errors import InputError
from hulk.wire import histogram
from hulk.wire.records import (GpuInfo, HeartbeatRequest, Inventory, LaunchState, LaunchStatus,
                               NodeLocation, PeerSummary, ProbeKind, ProbeSample, RegisterRequest,
                               ReportRequest)
from planner.core.rollup import bucket_bounds, bucket_index
from planner.service import admission
from planner.service.graph import fleet_from_store
from planner.service.ingest import IngestService
from planner.service.store import DAY_MS, Store
from tests.helpers.clock import ManualClock

T0 = 1_790_000_000_000  # a fixed "now" in epoch ms (2026)


@pytest.fixture
def ingest(tmp_path):
    clock = ManualClock(T0)
    store = Store(tmp_path / "planner.sqlite", clock=clock)
    service = IngestService(store, clock=clock)
    for node in ("a", "b"):
        service.register(RegisterRequest(node, hostname=node, address="127.0.0.1"))
    yield service
    store.close()


def sample(sent_ms: int, rtt: float = 5.0, **overrides) -> ProbeSample:
    fields = dict(peer_id="b", sent_at_ms=sent_ms, kind=int(ProbeKind.ICMP), payload_bytes=56,
                  lost=False, rtt_ms=rtt, timeout_ms=2000.0)
    fields.update(overrides)
    return ProbeSample(**fields)


def summary(rtts: list[float | None], *, start: int = T0 - 1000, timeout_ms: float = 2000.0,
            **overrides) -> PeerSummary:
    """One round's summary to "b" of ``rtts`` (None: lost), fields replaced by ``overrides``."""
    samples = [sample(start + k, rtt=r or 0.0, lost=r is None, timeout_ms=timeout_ms)
               for k, r in enumerate(rtts)]
    return PeerSummary.of_samples(samples)._replace(**overrides)


def report(service: IngestService, batch: str, samples: list[ProbeSample]):
    return service.report(ReportRequest("a", batch, tuple(samples)))


def stored_times(service: IngestService) -> list[int]:
    return sorted(s["sent_ms"] for s in service.store.raw_samples())


# ------------------------------------------------------------------------------ registration

@pytest.mark.parametrize("request_, field", [
    (RegisterRequest("evil/+/#"), "node_id"),
    (RegisterRequest("x" * 1_000_000), "node_id"),
    (RegisterRequest("a\x00b"), "node_id"),
    (RegisterRequest("n1", hostname="h\x00"), "hostname"),
    (RegisterRequest("n1", address="1" * (9 << 20)), "address"),
    (RegisterRequest("n1", address="not an address!"), "address"),
    (RegisterRequest("n1", probe_port=70_000), "probe_port"),
    (RegisterRequest("n1", location=NodeLocation(city="c" * 1000)), "location.city"),
    (RegisterRequest("n1", location=NodeLocation("Paris", site="s" * 101)), "location.site"),
    (RegisterRequest("n1", location=NodeLocation("Paris", site="dc\n1")), "location.site"),
    (RegisterRequest("n1", location=NodeLocation(site="dc\u20281")), "location.site"),
    (RegisterRequest("n1", location=NodeLocation(site="dc\u200b")), "location.site"),
    (RegisterRequest("n1", inventory=Inventory(gpus=(GpuInfo("g"),) * 100_000)), "inventory.gpus"),
    (RegisterRequest("n1", inventory=Inventory(gpus=(GpuInfo("g", memory_bytes=2 ** 64 - 1),))),
     "inventory.gpus[0].memory_bytes"),
    (RegisterRequest("n1", inventory=Inventory(gpus=(GpuInfo("g", compute_capability=float("nan")),))),
     "inventory.gpus[0].compute_capability"),
    (RegisterRequest("n1", allowed_commands=(("python",),) * 65), "allowed_commands"),
    (RegisterRequest("n1", allowed_commands=((),)), "allowed_commands[0]"),
    (RegisterRequest("n1", allowed_commands=(("x",) * 257,)), "allowed_commands[0]"),
    (RegisterRequest("n1", allowed_commands=(("py", "a\nb"),)), "allowed_commands[0]"),
    (RegisterRequest("n1", allowed_commands=(("x" * 5000,),)), "allowed_commands[0]"),
])
def test_hostile_registrations_are_refused_and_store_nothing(ingest, request_, field):
    with pytest.raises(InputError) as caught:
        ingest.register(request_)
    assert caught.value.field == field and "\n" not in str(caught.value)
    assert set(ingest.store.node_refs()) == {"a", "b"}


def test_sane_registrations_pass():
    for request_ in (RegisterRequest("gpu-01.example", address="gpu-01.example.org"),
                     RegisterRequest("n_2", address="2001:db8::1", probe_port=7),
                     RegisterRequest("N3", address="", hostname="Ünïcödé host"),
                     RegisterRequest("n4", location=NodeLocation("Paris", site="Paris DC 2")),
                     RegisterRequest("n5", location=NodeLocation(site="s" * 100)),
                     RegisterRequest("n6", allowed_commands=(("python", "train.py"),)),
                     RegisterRequest("n7", allowed_commands=())):
        assert admission.check_registration(request_) is request_


# ------------------------------------------------------------------------------ sample values

@pytest.mark.parametrize("bad, field", [
    (sample(T0, rtt=1e300, timeout_ms=1e308), "timeout_ms"),
    (sample(T0, rtt=1.0, timeout_ms=float("inf")), "timeout_ms"),
    (sample(T0, kind=9), "kind"),
    (sample(T0, payload_bytes=10 ** 9), "payload_bytes"),
    (sample(T0, rtt=5.0, timeout_ms=0.0), "timeout_ms"),        # 0 is not "no timeout"
    (sample(T0, rtt=0.5, timeout_ms=0.5), "timeout_ms"),        # under 1 ms
    (sample(T0, rtt=1e16, timeout_ms=0.0), "timeout_ms"),
    (sample(T0, rtt=float("nan")), "rtt_ms"),
    (sample(T0, rtt=2000.5), "rtt_ms"),                         # above its own timeout
    (sample(T0, rtt=float("inf"), lost=True), "rtt_ms"),        # a lost packet's too
])
def test_absurd_samples_are_refused_as_invalid_input(ingest, bad, field):
    with pytest.raises(InputError) as caught:
        report(ingest, "bad", [sample(T0), bad])
    assert caught.value.field.endswith(field)
    assert stored_times(ingest) == []


@pytest.mark.parametrize("bad, field", [
    (summary([1e15], timeout_ms=0.0), "timeout_ms"),            # 0 is not "no timeout"
    (summary([1e16], timeout_ms=0.0), "timeout_ms"),            # too large for SQLite's INTEGER
    (summary([6.8e11] * 3, timeout_ms=0.0), "timeout_ms"),
    (summary([0.5], timeout_ms=0.5), "timeout_ms"),             # under 1 ms
    (summary([5.0], timeout_ms=60_001.0), "timeout_ms"),
    (summary([5.0], timeout_ms=-1.0), "timeout_ms"),
    (summary([5.0, 61_000.0], timeout_ms=60_000.0), "rtt_max_ms"),
    (summary([5.0] * 3, timeout_ms=1e308, rtt_max_ms=1e300), "timeout_ms"),
    (summary([5.0] * 101), "count"),                            # agents send 1-100 a round
    (summary([5.0], payload_bytes=65_508), "payload_bytes"),
    (summary([5.0, 6.0], rtt_sum_sq_ms2=float("inf")), "rtt_sum_sq_ms2"),
    (summary([5.0, 6.0], rtt_min_ms=-1.0), "rtt_min_ms"),
])
def test_absurd_summaries_refuse_the_batch_and_store_nothing(ingest, bad, field):
    with pytest.raises(InputError) as caught:
        ingest.report(ReportRequest("a", "bad", summaries=(summary([5.0]), bad)))
    assert caught.value.field == f"summaries[1].{field}" and "\n" not in str(caught.value)
    assert ingest.store.raw_summaries() == []
    assert ingest.store.rejected_counts()["a"] == {"invalid_batch": 2}


@pytest.mark.parametrize("batch_id", [
    "", "x" * 65, "b" * (4 << 20), "a/b", "a b", "b1\n", "d\u00e9", "\u0661", "a\x00", "a;b"])
def test_batch_ids_out_of_bounds_are_refused_and_store_nothing(ingest, batch_id):
    with pytest.raises(InputError) as caught:
        report(ingest, batch_id, [sample(T0 - 1000)])
    message = str(caught.value)
    assert caught.value.field == "batch_id" and "\n" not in message and len(message) < 200
    assert stored_times(ingest) == []


def test_the_agents_batch_ids_and_short_names_are_accepted(ingest, tmp_path):
    spool = Spool(tmp_path / "spool.db", 1000)
    spool.hold([sample(T0 - 1000)])
    spool.save()
    agent_id = spool.take_batch(10).batch_id
    assert len(agent_id) == 32
    for k, batch_id in enumerate((agent_id, "b1", "x" * 64, "retry-2.batch_A")):
        assert report(ingest, batch_id, [sample(T0 - 1000 - k)]).accepted == 1


def test_one_bounded_hostile_summary_moves_a_site_pair_no_further_than_its_bounds(tmp_path):
    """Past the per-pair limit summaries fold into site pairs whose mean `plan --db` uses.
    The worst one summary may say (every packet at the largest timeout) moves the mean by its
    bounded share of the window's packets only, and the median not at all."""
    clock = ManualClock(T0)
    store = Store(tmp_path / "planner.sqlite", clock=clock, per_pair_up_to=0)   # fold sites
    service = IngestService(store, clock=clock)
    for node, city in (("bj-1", "Beijing"), ("bj-2", "Beijing"), ("tk-1", "Tokyo")):
        service.register(RegisterRequest(node, location=NodeLocation(city)))
    refs = store.node_refs()
    honest = 90 * 1440 * 3                      # 90 days of a round of 3 packets a minute
    rows = [(refs["bj-1"].idx, refs["tk-1"].idx, T0 - day * DAY_MS, 1, honest // 90, 0,
             47.0 * (honest // 90), 47.0 ** 2 * (honest // 90), 47_000, 47_000,
             histogram.encode({bucket_index(47.0): honest // 90})) for day in range(90)]
    store.store_batch(refs["bj-1"], "honest", [], None, 0, rows)
    peer = dict(peer_id="tk-1")
    for unbounded in (summary([6.8e11] * 3, timeout_ms=0.0, **peer),
                      summary([1e16], timeout_ms=0.0, **peer),
                      summary([5e9] * 100, timeout_ms=1e10, **peer)):
        with pytest.raises(InputError):
            service.report(ReportRequest("bj-2", "evil", summaries=(unbounded,)))
    worst = summary([admission.MAX_TIMEOUT_MS] * admission.MAX_ROUND_PACKETS,
                    timeout_ms=admission.MAX_TIMEOUT_MS, **peer)
    assert service.report(ReportRequest("bj-2", "worst", summaries=(worst,))).accepted == 1
    store.rollup_pending()
    (link,) = [k for k in fleet_from_store(store).site_links
               if (k.src, k.dst) == ("Beijing", "Tokyo")]
    n = honest + admission.MAX_ROUND_PACKETS
    assert link.samples == n
    assert 47.0 < link.rtt_ms <= (47.0 * honest + worst.rtt_sum_ms) / n < 62.5
    (pair,) = [p for p in store.site_window_rollups(90) if (p.src, p.dst) == ("Beijing", "Tokyo")]
    low, high = bucket_bounds(bucket_index(47.0))
    assert low <= pair.rollup.quantile(0.5) <= high and pair.rollup.max == admission.MAX_TIMEOUT_MS
    store.close()


rtt_values = st.one_of(st.floats(0.0, 70_000.0), st.sampled_from(
    [0.0, 1e-300, 1.0, 59_999.999, 60_000.0, 60_000.001, 1e15, 1e16, 1e300]))
wild = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, -0.0, 0.5, 1.0, 2000.0, 60_000.0, 60_000.5, 1e15, 1e16, -1.0]))
summary_changes = st.one_of(
    st.just({}),
    st.fixed_dictionaries({}, optional={
        "rtt_sum_ms": wild, "rtt_sum_sq_ms2": wild, "rtt_min_ms": wild,
        "rtt_max_ms": wild, "count": st.integers(0, 2 ** 32 - 1),
        "lost": st.integers(0, 2 ** 32 - 1), "payload_bytes": st.integers(0, 2 ** 32 - 1)}))


@settings(max_examples=150, derandomize=True, deadline=None)
@given(rtts=st.lists(st.one_of(st.none(), rtt_values), min_size=1, max_size=120),
       timeout_ms=st.one_of(st.sampled_from([10.0, 2000.0, 60_000.0]), wild),
       changes=summary_changes)
def test_whatever_admission_accepts_stores_and_stays_within_the_bounds(rtts, timeout_ms,
                                                                      changes):
    """Any summary or sample check_summary / check_sample accepts is stored without error and
    every stored RTT lies within [0, MAX_TIMEOUT_MS]; whatever they refuse is an InputError."""
    clock = ManualClock(T0)
    store = Store(":memory:", clock=clock)
    service = IngestService(store, clock=clock)
    for node in ("a", "b"):
        service.register(RegisterRequest(node, address="127.0.0.1"))
    s = summary(rtts, timeout_ms=timeout_ms, **changes)
    raw = [sample(T0 - 1000 - k, rtt=r or 0.0, lost=r is None, timeout_ms=timeout_ms)
           for k, r in enumerate(rtts)]
    good_raw = []
    for i, one in enumerate(raw):
        try:
            admission.check_sample(one, f"samples[{i}]")
            good_raw.append(one)
        except InputError:
            pass
    try:
        admission.check_summary(s, "summaries[0]")
        summaries = (s,)
    except InputError:
        summaries = ()
    result = service.report(ReportRequest("a", "p1", tuple(good_raw), 0, summaries))
    assert result.accepted == len(good_raw) + len(summaries)
    store.rollup_pending()
    bound = admission.MAX_TIMEOUT_MS
    assert all(0.0 <= r["rtt_ms"] <= bound for r in store.raw_samples() if not r["lost"])
    for pair in store.window_rollups(90):
        r = pair.rollup
        if r.received:
            assert 0.0 <= r.min <= r.max <= bound
            assert 0.0 <= r.sum <= r.received * bound * (1 + 1e-9)
    store.close()


def test_a_multi_megabyte_launch_detail_is_cut_not_refused(ingest):
    launch = LaunchStatus(LaunchState.FAILED, plan_id="p", job="j", exit_code=1,
                          detail="x" * (5 << 20), changed_at_ms=T0)
    result = ingest.heartbeat(HeartbeatRequest("a", time_ms=T0, launch=launch))
    assert not result.reregister
    (row,) = [r for r in ingest.store.nodes() if r["id"] == "a"]
    assert row["launch_state"] == "failed" and len(row["launch_detail"]) == 4096


# ------------------------------------------------------------------------------ clocks and time

def test_an_agent_clock_a_day_ahead_loses_no_sample(ingest):
    ahead = 25 * 3_600_000
    ingest.heartbeat(HeartbeatRequest("a", time_ms=T0 + ahead))
    result = report(ingest, "b1", [sample(T0 + ahead - k * 60_000) for k in range(585)])
    assert (result.accepted, result.rejected) == (585, 0)
    times = stored_times(ingest)
    assert times[-1] == T0 and times[0] == T0 - 584 * 60_000
    (row,) = [r for r in ingest.store.nodes() if r["id"] == "a"]
    assert row["clock_skew_ms"] == ahead          # shown by `fleet show`


def test_a_clock_ahead_before_any_heartbeat_is_moved_back_to_now(ingest):
    ahead = 30 * 3_600_000
    result = report(ingest, "b1", [sample(T0 + ahead - k * 1000) for k in range(10)])
    assert result.accepted == 10
    assert max(stored_times(ingest)) == T0


def test_an_agent_clock_ten_days_behind_loses_no_sample(ingest):
    behind = 10 * DAY_MS
    ingest.heartbeat(HeartbeatRequest("a", time_ms=T0 - behind))
    result = report(ingest, "b1", [sample(T0 - behind - 1000)])
    assert (result.accepted, result.rejected) == (1, 0)
    assert stored_times(ingest) == [T0 - 1000]


def test_samples_older_than_raw_retention_and_1970_are_counted_not_silently_erased(ingest):
    result = report(ingest, "b1", [sample(T0 - 1000), sample(1), sample(T0 - 8 * DAY_MS)])
    assert (result.accepted, result.rejected) == (1, 2)
    assert ingest.store.rejected_counts()["a"] == {"too_old": 2}
    assert stored_times(ingest) == [T0 - 1000]


def test_a_batch_retried_after_the_prune_is_never_counted_twice(ingest):
    clock = ingest.clock
    first = report(ingest, "once", [sample(T0 - 1000), sample(T0 - 2000)])
    assert first.accepted == 2
    ingest.store.rollup_pending()
    for days in (3, 6, 8):                      # past raw_days (7): raw samples pruned
        clock.now = T0 + days * DAY_MS
        ingest.store.prune()
    retried = report(ingest, "once", [sample(T0 - 1000), sample(T0 - 2000)])
    assert retried.accepted in (0, 2) and (retried.duplicate or retried.rejected == 2)
    (pair,) = [p for p in ingest.store.window_rollups(90) if (p.src, p.dst) == ("a", "b")]
    assert pair.rollup.stats().samples == 2      # counted once


def test_corrected_times_leaves_a_good_clock_alone():
    times = [T0 - 5, T0 - 1]
    assert admission.corrected_times(times, T0, skew_ms=900, future_tolerance_ms=60_000) == (times, 0)
    behind = [t - 3 * DAY_MS for t in times]
    moved, shift = admission.corrected_times(behind, T0, skew_ms=-3 * DAY_MS,
                                             future_tolerance_ms=60_000)
    assert (moved, shift) == (times, -3 * DAY_MS)


def test_fleet_show_reports_the_clock_skew(ingest, capsys):
    from planner import cli

    ingest.heartbeat(HeartbeatRequest("a", time_ms=T0 + 25 * 3_600_000))
    ingest.heartbeat(HeartbeatRequest("b", time_ms=T0 + 200))
    assert cli.main(["fleet", "show", "--db", ingest.store.path]) == 0
    out = capsys.readouterr().out
    assert "clock skew" in out
    line_a = next(line for line in out.splitlines() if line.strip("│ ").startswith("a "))
    line_b = next(line for line in out.splitlines() if line.strip("│ ").startswith("b "))
    assert "+25.0 h" in line_a and " ok " in line_b
