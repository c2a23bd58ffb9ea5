"""Hostile and broken agents against the planner's ingest (IngestService over a real SQLite store).

Each case here was accepted, lost samples or answered INTERNAL before.
"""

from __future__ import annotations

import pytest

from hulk.errors import InputError
from hulk.wire.records import (GpuInfo, HeartbeatRequest, Inventory, LaunchState, LaunchStatus,
                               NodeLocation, ProbeKind, ProbeSample, RegisterRequest, ReportRequest)
from planner.service import admission
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
])
def test_absurd_samples_are_refused_as_invalid_input(ingest, bad, field):
    with pytest.raises(InputError) as caught:
        report(ingest, "bad", [sample(T0), bad])
    assert caught.value.field.endswith(field)
    assert stored_times(ingest) == []


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
