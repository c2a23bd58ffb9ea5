"""Serve's throughput tests on a real store: slots handed out by heartbeat to the right nodes and
never two overlapping tests for one node, results stored once under retries and only from the
receiver of a scheduled test, measured throughput winning over the formula in the Network."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from hulk import errors
from hulk.wire.records import (HeartbeatRequest, NodeLocation, RegisterRequest, ReportRequest)
from hulk.wire.throughput import ThroughputResult, ThroughputSlot
from planner.core.fleet import GBIT, bandwidth_from_rtt, complete
from planner.core.rollup import bucket_index
from planner.core.throughput_schedule import ScheduleOptions
from planner.service.graph import fleet_from_store, measured_site_bandwidth
from planner.service.ingest import IngestService
from planner.service.metrics import PlannerMetrics
from planner.service.store import DAY_MS, Store
from planner.service.throughput import ThroughputTests
from planner.service.throughput_store import REASON_UNKNOWN_TEST, REASON_WRONG_NODE
from tests.helpers.clock import ManualClock

T0 = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS + 3_600_000
SITES = {"a1": "siteA", "a2": "siteA", "b1": "siteB", "c1": "siteC", "z0": "siteZ"}


def serve(tmp_path: Path, *, ports: dict[str, int] | None = None, seed: int = 1,
          options: ScheduleOptions | None = None):
    """A store with agents of SITES registered (z0 with throughput port 0), the tests planner
    and ingest over them, on one manual clock."""
    clock = ManualClock(T0)
    store = Store(tmp_path / "s.db", clock=clock)
    tests = ThroughputTests(store, options or ScheduleOptions(), clock=clock,
                            rng=random.Random(seed), node_timeout_s=3600)
    ingest = IngestService(store, clock=clock, throughput=tests)
    ports = ports or {n: (0 if n == "z0" else 7000 + k) for k, n in enumerate(SITES)}
    for k, (node, site) in enumerate(SITES.items()):
        ingest.register(RegisterRequest(node, location=NodeLocation("Paris", site=site),
                                        address=f"10.0.0.{k + 1}", probe_port=6000,
                                        throughput_port=ports[node]))
    return clock, store, tests, ingest


def heartbeat_slots(ingest: IngestService, clock: ManualClock) -> dict[str, list[ThroughputSlot]]:
    return {n: list(ingest.heartbeat(HeartbeatRequest(n, time_ms=clock.now)).throughput_slots)
            for n in SITES}


def result_for(slot: ThroughputSlot, gbps: float = 2.5, ok: bool = True,
               sender: str | None = None) -> ThroughputResult:
    """What the receiver of ``slot`` (its receive side) reports."""
    assert slot.role == "receive"
    duration = 2.5
    return ThroughputResult(test_id=slot.test_id, sender_id=sender or slot.peer_id,
                            start_ms=slot.start_ms + 1000, duration_s=duration,
                            bytes=int(gbps * 1e9 / 8 * duration) if ok else 0, streams=4,
                            gbps=gbps if ok else 0.0, ok=ok, detail="" if ok else "peer never came")


def receive_slots(slots: dict[str, list[ThroughputSlot]]) -> list[tuple[str, ThroughputSlot]]:
    return [(n, s) for n, ss in slots.items() for s in ss if s.role == "receive"]


def test_heartbeats_hand_slots_to_both_sides_and_never_overlap(tmp_path: Path):
    clock, store, tests, ingest = serve(tmp_path, options=ScheduleOptions(period_s=120,
                                                                          slip_s=10))
    seen: dict[tuple[str, str], ThroughputSlot] = {}
    for _ in range(120):          # 10 minutes of 5-second rounds, heartbeats in between
        tests.plan()
        for node, slots in heartbeat_slots(ingest, clock).items():
            for s in slots:
                assert s.start_ms > clock.now
                seen.setdefault((node, s.test_id), s)
        clock.now += 5_000
    assert seen, "no test was ever handed out"
    assert not any(node == "z0" for node, _ in seen)    # throughput port 0: never a slot
    by_test: dict[str, dict[str, tuple[str, ThroughputSlot]]] = {}
    for (node, test_id), s in seen.items():
        by_test.setdefault(test_id, {})[s.role] = (node, s)
    for test_id, sides in by_test.items():
        (sender, send), (receiver, recv) = sides["send"], sides["receive"]
        assert send.peer_id == receiver and recv.peer_id == sender and sender != receiver
        assert send.secret == recv.secret and send.port == recv.port == 7000 + list(SITES).index(
            receiver)
        assert send.peer_address == f"10.0.0.{list(SITES).index(receiver) + 1}"
    per_node: dict[str, list[ThroughputSlot]] = {}
    for (node, _), s in seen.items():
        per_node.setdefault(node, []).append(s)
    for node, slots in per_node.items():
        slots.sort(key=lambda s: s.start_ms)
        for a, b in zip(slots, slots[1:]):
            assert a.end_ms <= b.start_ms, f"{node} is in two overlapping tests"
    # Every directed pair of the four test-capable sites, and siteA with itself, got tested.
    pairs = {(SITES[s[0][0]], SITES[s[1][0]]) for s in
             ((sides["send"], sides["receive"]) for sides in by_test.values())}
    want = {(a, b) for a in ("siteA", "siteB", "siteC") for b in ("siteA", "siteB", "siteC")
            if a != b or a == "siteA"}
    assert pairs == want


def test_a_node_holding_a_slot_gets_the_next_one_in_the_next_round(tmp_path: Path):
    ports = {n: 7000 + k if n in ("a1", "b1") else 0 for k, n in enumerate(SITES)}
    clock, store, tests, ingest = serve(tmp_path, ports=ports)
    tests.horizon_s = 15.0       # one slot a round: what the next round plans shows
    assert tests.plan() == 1
    [first] = heartbeat_slots(ingest, clock)["a1"]
    clock.now += 5_000           # a1 and b1 hold `first`, which has not started yet
    assert tests.plan() == 1
    slots = heartbeat_slots(ingest, clock)
    a1 = sorted(slots["a1"], key=lambda s: s.start_ms)
    assert a1[0] == first and a1[1].start_ms == first.start_ms + 15_000
    assert first.end_ms < a1[1].start_ms
    assert {s.role for s in a1} == {"send", "receive"}        # both directions, back to back
    assert sorted(s.role for s in slots["b1"]) == ["receive", "send"]


def test_busy_nodes_get_no_slots(tmp_path: Path):
    clock, store, tests, ingest = serve(tmp_path)
    job = store.submit_job("train", {"layers": 4})
    store.update_job(job.id, state="running", nodes=["a1", "a2", "b1"])
    for _ in range(12):
        tests.plan()
        slots = heartbeat_slots(ingest, clock)
        assert not (slots["a1"] or slots["a2"] or slots["b1"] or slots["z0"])
        clock.now += 5_000
    assert store.throughput.last_tested_ms() == {}   # c1 alone: no pair to test


def test_results_stored_once_and_only_from_the_scheduled_receiver(tmp_path: Path):
    clock, store, tests, ingest = serve(tmp_path)
    ingest.events = metrics = PlannerMetrics()
    assert tests.plan() > 0
    received = receive_slots(heartbeat_slots(ingest, clock))
    (receiver, slot), (other, other_slot) = received[0], received[1]
    good = result_for(slot)
    first = ingest.report(ReportRequest(receiver, "batch-1", throughput=(good,)))
    assert (first.accepted, first.rejected, first.duplicate) == (1, 0, False)
    assert ingest.report(ReportRequest(receiver, "batch-1", throughput=(good,))).duplicate
    ingest.report(ReportRequest(receiver, "batch-2", throughput=(good,)))  # spooled twice
    rows = store.throughput.results()
    assert [(r["test_id"], r["sender"], r["receiver"], r["gbps"]) for r in rows] == \
        [(slot.test_id, slot.peer_id, receiver, 2.5)]

    # An unknown test, the sender reporting, a wrong sender named: rejected, counted, not stored.
    unknown = result_for(other_slot)
    unknown = ThroughputResult(**{**unknown.__dict__, "test_id": "f" * 32})
    answer = ingest.report(ReportRequest(other, "batch-3", throughput=(unknown,)))
    assert (answer.accepted, answer.rejected) == (0, 1)
    sender = slot.peer_id
    ingest.report(ReportRequest(sender, "batch-4", throughput=(result_for(other_slot),)))
    wrong_sender = next(n for n in SITES if n not in (other, other_slot.peer_id))
    ingest.report(ReportRequest(other, "batch-5",
                                throughput=(result_for(other_slot, sender=wrong_sender),)))
    assert len(store.throughput.results()) == 1
    counts = store.rejected_counts()
    assert counts[other][REASON_UNKNOWN_TEST] == 1 and counts[other][REASON_WRONG_NODE] == 1
    assert counts[sender][REASON_WRONG_NODE] == 1
    # The right receiver still can report its own test afterwards.
    ingest.report(ReportRequest(other, "batch-6", throughput=(result_for(other_slot, 1.0),)))
    assert len(store.throughput.results()) == 2
    counted = {r: metrics.registry.get_sample_value("hulk_throughput_tests_total", {"result": r})
               for r in ("ok", "failed", "rejected")}
    assert counted == {"ok": 2, "failed": 0, "rejected": 3}
    assert metrics.registry.get_sample_value("hulk_samples_rejected_total",
                                             {"reason": REASON_WRONG_NODE}) is None

    # A result out of bounds refuses the whole batch.
    bad = ThroughputResult(**{**good.__dict__, "gbps": float("nan")})
    with pytest.raises(errors.InputError, match=r"throughput\[0\]\.gbps"):
        ingest.report(ReportRequest(receiver, "batch-7", throughput=(bad,)))


def test_failed_tests_count_but_give_no_bandwidth(tmp_path: Path):
    clock, store, tests, ingest = serve(tmp_path)
    tests.plan()
    receiver, slot = receive_slots(heartbeat_slots(ingest, clock))[0]
    ingest.report(ReportRequest(receiver, "b", throughput=(result_for(slot, ok=False),)))
    assert store.throughput_by_site_pair() == {}
    (pair,) = store.throughput.site_pairs()
    assert (pair.tests, pair.failed) == (0, 1)


def probe(store: Store, ingest: IngestService, src: str, dst: str, rtt_ms: float,
          clock: ManualClock) -> None:
    a, b = store.node_refs()[src], store.node_refs()[dst]
    rows = [(a.idx, b.idx, clock.now - 1000 + k, 1, 56, 0, rtt_ms, bucket_index(rtt_ms))
            for k in range(5)]
    store.store_batch(a, f"{src}-{dst}-{clock.now}", rows)


def schedule_pair(store: Store, sender: str, receiver: str, test_id: str, clock: ManualClock):
    from planner.service.throughput_store import ScheduledTest
    store.throughput.add_scheduled([ScheduledTest(test_id, sender, receiver, SITES[sender],
                                                  SITES[receiver], clock.now, 1e9)])
    return ThroughputSlot(test_id=test_id, role="receive", peer_id=sender,
                          peer_address="10.0.0.9", port=7000, start_ms=clock.now,
                          duration_s=3.0, streams=4, secret=bytes(32))


def test_measured_throughput_overrides_the_formula(tmp_path: Path):
    clock, store, tests, ingest = serve(tmp_path)
    probe(store, ingest, "a1", "b1", 40.0, clock)
    probe(store, ingest, "a2", "b1", 40.0, clock)
    probe(store, ingest, "a1", "c1", 40.0, clock)

    def bw_gbps(x: str, y: str) -> float:
        net = complete(fleet_from_store(store))
        return float(net.bw[net.index[x], net.index[y]]) / GBIT

    formula = float(bandwidth_from_rtt(40.0)) / GBIT
    assert bw_gbps("a1", "b1") == pytest.approx(formula)
    # a1 -> b1 measured 1.0 and 3.0 (median 2.0); b1 -> a2 measured 1.5: the smaller wins for
    # every server pair of siteA and siteB, both directions.
    for k, (sender, receiver, gbps) in enumerate((("a1", "b1", 1.0), ("a2", "b1", 3.0),
                                                  ("b1", "a2", 1.5))):
        slot = schedule_pair(store, sender, receiver, f"{k:032x}", clock)
        ingest.report(ReportRequest(receiver, f"r{k}", throughput=(result_for(slot, gbps),)))
    assert store.throughput_by_site_pair() == {("siteA", "siteB"): (2.0, 2),
                                               ("siteB", "siteA"): (1.5, 1)}
    assert measured_site_bandwidth(store)[("siteB", "siteA")] == 1.5
    assert bw_gbps("a1", "b1") == pytest.approx(1.5)
    assert bw_gbps("b1", "a2") == pytest.approx(1.5)
    assert bw_gbps("a1", "c1") == pytest.approx(formula)     # not measured: the formula
    # The export carries it on the links.
    links = {(k.src, k.dst): k.bandwidth_gbps for k in fleet_from_store(store).links}
    assert links[("a1", "b1")] == 1.5 and links[("a1", "c1")] is None
    # 90 days on, the tests are pruned and the formula is back.
    clock.now += 91 * DAY_MS
    probe(store, ingest, "a1", "b1", 40.0, clock)
    assert store.prune()["throughput_tests"] == 3
    assert store.throughput_by_site_pair() == {}
    assert np.isclose(bw_gbps("a1", "b1"), formula)


def test_throughput_port_is_checked_and_kept(tmp_path: Path):
    clock, store, tests, ingest = serve(tmp_path)
    with pytest.raises(errors.InputError, match="throughput_port"):
        ingest.register(RegisterRequest("bad", address="10.0.0.99", throughput_port=70000))
    ports = {r["id"]: r["throughput_port"] for r in store.nodes()}
    assert ports["z0"] == 0 and ports["a1"] == 7000


def test_serve_flags_turn_tests_on_and_off(tmp_path: Path):
    from planner import cli
    from planner.commands.serve import add_throughput, build_runtime
    from planner.settings import PlannerSettings

    def runtime(*flags: str):
        args = cli.build_parser(PlannerSettings()).parse_args(
            ["serve", "--db", str(tmp_path / f"{len(flags)}.db"), "--insecure", *flags])
        built = build_runtime(args)
        add_throughput(built, args)
        return built

    on = runtime("--throughput-period", "3600", "--throughput-budget-gb", "5",
                 "--throughput-on-busy")
    assert [t.name for t in on.tasks if t.name == "throughput-tests"] == ["throughput-tests"]
    options = on.service.throughput.options
    assert (options.period_s, options.daily_budget_bytes, options.allow_busy) == (3600, 5e9, True)
    off = runtime("--no-throughput-tests")
    assert off.service.throughput is None
    assert "throughput-tests" not in [t.name for t in off.tasks]
    for r in (on, off):
        r.store_executor.submit(r.store.close).result()
        r.store_executor.shutdown()


async def test_slots_and_results_travel_over_grpc(tmp_path: Path):
    """Register, Heartbeat and Report over a real gRPC server: the wire carries the slots to
    both agents and the receiver's result into the store, once."""
    import grpc

    from hulk.v1 import hulk_pb2, hulk_pb2_grpc
    from planner.service.runtime import PlannerRuntime
    from planner.service.seams import ServeOptions
    from planner.service.throughput import add_to_runtime

    runtime = PlannerRuntime(str(tmp_path / "p.db"), "127.0.0.1:0")
    runtime.tasks = []
    tests = add_to_runtime(runtime, ServeOptions(), interval_s=3600.0)
    tests.rng = random.Random(3)
    port = await runtime.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = hulk_pb2_grpc.PlannerStub(channel)
            for k, (node, site) in enumerate((("s1", "east"), ("r1", "west"))):
                await stub.Register(hulk_pb2.RegisterRequest(
                    node_id=node, address=f"127.0.0.{k + 1}", throughput_port=7500,
                    location=hulk_pb2.Location(city="Paris", site=site)), timeout=10)
            assert await runtime.in_store(tests.plan) == 2      # east -> west and back
            slots = {}
            for node in ("s1", "r1"):
                answer = await stub.Heartbeat(hulk_pb2.HeartbeatRequest(node_id=node), timeout=10)
                slots[node] = [ThroughputSlot.from_proto(s) for s in answer.throughput_slots]
            assert sorted(s.role for s in slots["s1"]) == sorted(s.role for s in slots["r1"]) \
                == ["receive", "send"]
            slot = next(s for s in slots["r1"] if s.role == "receive")
            report = ReportRequest("r1", "batch-1", throughput=(result_for(slot),)).to_proto()
            for _ in range(2):
                await stub.Report(report, timeout=10)
        rows = await runtime.in_store(store_results, runtime.store)
        assert [(r["sender"], r["receiver"], r["gbps"]) for r in rows] == [("s1", "r1", 2.5)]
    finally:
        await runtime.stop(grace_s=0)


def store_results(store: Store) -> list[dict]:
    return store.throughput.results()


def test_a_store_from_before_throughput_tests_gains_them(tmp_path: Path):
    import sqlite3

    with Store(tmp_path / "old.db") as store:
        store.register(RegisterRequest("n1", address="10.0.0.1", throughput_port=7000))
    conn = sqlite3.connect(tmp_path / "old.db")   # as a store written before these tables
    conn.executescript("DROP TABLE throughput_tests; DROP TABLE throughput_scheduled; "
                       "ALTER TABLE nodes DROP COLUMN throughput_port;")
    conn.close()
    with Store(tmp_path / "old.db") as store:
        assert [r["throughput_port"] for r in store.nodes()] == [0]   # an old agent: no tests
        assert store.throughput_by_site_pair() == {} and store.throughput.results() == []
