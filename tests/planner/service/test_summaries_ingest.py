"""Per-round summaries through the real server (grpc.aio on loopback, a real SQLite file):
stored once under retries, hostile ones refused with INVALID_ARGUMENT and counted, old raw
reports still accepted; rollups from summaries equal rollups from the same raw samples; a
schema-1 store file is migrated in place."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.records import (NodeLocation, PeerSummary, ProbeKind, ProbeSample,
                               RegisterRequest, ReportRequest)
from planner.core.rollup import DailyRollup
from planner.service.ingest import IngestService
from planner.service.runtime import PlannerRuntime
from planner.service.store import DAY_MS, Store

NOW = int(time.time() * 1000)


class InProcessPlanner:
    """PlannerRuntime (plaintext gRPC, the real store) on an event-loop thread of its own."""

    def __init__(self, db: Path):
        self.runtime = PlannerRuntime(str(db), "127.0.0.1:0", fleet="test")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        port = asyncio.run_coroutine_threadsafe(self.runtime.start(), self.loop).result(30)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = hulk_pb2_grpc.PlannerStub(self.channel)

    def in_store(self, fn, *args):
        return self.runtime.store_executor.submit(fn, *args).result(30)

    def stop(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.runtime.stop(grace_s=0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def planner(tmp_path):
    p = InProcessPlanner(tmp_path / "planner.db")
    for node in ("a", "b", "c"):
        p.stub.Register(RegisterRequest(node, address="127.0.0.1").to_proto(), timeout=10)
    yield p
    p.stop()


def round_samples(peer: str, rtts: list[float | None], start: int) -> list[ProbeSample]:
    return [ProbeSample(peer, start + 200 * i, ProbeKind.ICMP, 56, r is None,
                        0.0 if r is None else r, 2000.0) for i, r in enumerate(rtts)]


def summary(peer: str = "b", rtts=(1.5, None, 2.5), start: int = NOW - 60_000) -> PeerSummary:
    return PeerSummary.of_samples(round_samples(peer, list(rtts), start))


def report(node: str, batch: str, summaries=(), samples=()) -> hulk_pb2.ReportRequest:
    return ReportRequest(node, batch, tuple(samples), 0, tuple(summaries)).to_proto()


def test_summaries_are_stored_once_under_retries_and_old_raw_reports_still_count(planner):
    batch = report("a", "batch-1", [summary("b"), summary("c", (None, None, None))])
    first = planner.stub.Report(batch, timeout=10)
    assert (first.accepted, first.rejected, first.duplicate) == (2, 0, False)
    for _ in range(3):                              # the ack was lost: the agent sends it again
        again = planner.stub.Report(batch, timeout=10)
        assert again.duplicate and again.accepted == 2
    # An agent from before summaries: raw samples only, no summaries field at all.
    old = hulk_pb2.ReportRequest(node_id="a", batch_id="old-1", samples=[
        s.to_proto() for s in round_samples("b", [4.0, 6.0], NOW - 30_000)])
    assert planner.stub.Report(old, timeout=10).accepted == 2
    assert len(planner.in_store(planner.runtime.store.raw_summaries)) == 2
    pairs = {(p.src, p.dst): p.rollup for p in planner.in_store(
        planner.runtime.store.window_rollups, 90)}
    ab, ac = pairs[("a", "b")], pairs[("a", "c")]
    assert (ab.count, ab.lost, ab.min, ab.max) == (5, 1, 1.5, 6.0)
    assert ab.sum == pytest.approx(14.0) and ab.sumsq == pytest.approx(1.5**2 + 2.5**2 + 52)
    assert sum(ab.buckets.values()) == 4
    assert (ac.count, ac.lost, ac.received) == (3, 3, 0) and ac.stats().mean_ms is None


def _hostile() -> list[tuple[str, dict]]:
    return [
        ("summaries[0].lost", {"lost": 4}),
        ("summaries[0].count", {"count": 0, "lost": 0}),
        ("summaries[0].rtt_min_ms", {"rtt_min_ms": 3.0, "rtt_max_ms": 2.0}),
        ("summaries[0].rtt_sum_ms", {"rtt_sum_ms": float("nan")}),
        ("summaries[0].rtt_sum_sq_ms2", {"rtt_sum_sq_ms2": -1.0}),
        ("summaries[0].rtt_max_ms", {"rtt_max_ms": float("inf")}),
        ("summaries[0].rtt_sum_ms", {"rtt_sum_ms": 1e6}),
        ("summaries[0].rtt_max_ms", {"rtt_max_ms": 5000.0, "rtt_sum_ms": 5001.5,
                                     "rtt_sum_sq_ms2": 25e6 + 2.25}),       # above the timeout
        ("summaries[0].histogram_counts", {"buckets": ((20, 1), (25, 2))}),  # 3, not 2
        ("summaries[0].histogram_buckets[1]", {"buckets": ((25, 1), (20, 1))}),
        ("summaries[0].histogram_buckets[1]", {"buckets": ((20, 1), (500, 1))}),
        ("summaries[0].histogram_counts[0]", {"buckets": ((20, 0), (25, 2))}),
        ("summaries[0].histogram_buckets", {"buckets": ((5, 1), (6, 1))}),   # not min's, max's
        ("summaries[0].kind", {"kind": 9}),
        ("summaries[0].peer_id", {"peer_id": "a"}),                          # itself
        ("summaries[0].timeout_ms", {"timeout_ms": float("nan")}),
        ("summaries[0].timeout_ms", {"timeout_ms": 0.0, "rtt_max_ms": 1e16, "rtt_sum_ms": 1e16,
                                     "rtt_sum_sq_ms2": 1e32, "buckets": ((30, 1), (108, 1))}),
    ]


@pytest.mark.parametrize("field,change", _hostile(), ids=[f for f, _ in _hostile()])
def test_hostile_summaries_are_refused_with_invalid_argument_and_counted(planner, field, change):
    bad = summary()._replace(**change)
    with pytest.raises(grpc.RpcError) as err:
        planner.stub.Report(report("a", "bad-1", [summary("c"), bad][::-1]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field), err.value.details()
    assert planner.in_store(planner.runtime.store.raw_summaries) == []     # nothing of the batch
    assert planner.in_store(planner.runtime.store.rejected_counts)["a"] == {"invalid_batch": 2}


def test_summaries_to_unknown_peers_or_too_old_are_rejected_alone(planner):
    old = summary(start=NOW - 30 * DAY_MS)
    answer = planner.stub.Report(report("a", "mixed", [summary("nobody"), old, summary("b")]),
                                 timeout=10)
    assert (answer.accepted, answer.rejected) == (1, 2)
    assert planner.in_store(planner.runtime.store.rejected_counts)["a"] == {
        "unknown_peer": 1, "too_old": 1}


def _store_with(records, tmp: Path | None = None) -> Store:
    store = Store(":memory:", clock=lambda: NOW)
    service = IngestService(store, clock=lambda: NOW)
    for node in ("a", "b"):
        service.register(RegisterRequest(node, location=NodeLocation()))
    service.report(records)
    return store


rounds_strategy = st.lists(
    st.lists(st.one_of(st.none(), st.floats(0.0, 2000.0, allow_nan=False)), min_size=1,
             max_size=8), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(rounds_strategy, st.integers(0, 3))
def test_rollups_from_summaries_equal_rollups_from_the_raw_samples(rounds, days_back):
    starts = [NOW - days_back * DAY_MS - 60_000 * (i + 1) for i in range(len(rounds))]
    samples = [s for r, t in zip(rounds, starts) for s in round_samples("b", r, t)]
    summaries = [summary("b", r, t) for r, t in zip(rounds, starts)]
    raw = _store_with(ReportRequest("a", "raw", tuple(samples)))
    folded = _store_with(ReportRequest("a", "sum", summaries=tuple(summaries)))
    by_raw, by_summary = raw.daily_rollups("a", "b"), folded.daily_rollups("a", "b")
    assert by_raw.keys() == by_summary.keys()
    for day, want in by_raw.items():
        got = by_summary[day]
        assert (got.count, got.lost, got.min, got.max, got.buckets) == \
            (want.count, want.lost, want.min, want.max, want.buckets)
        assert got.sum == pytest.approx(want.sum, rel=1e-12, abs=1e-9)
        assert got.sumsq == pytest.approx(want.sumsq, rel=1e-12, abs=1e-9)
        a, b = got.stats(), want.stats()
        assert (a.p50_ms, a.p99_ms) == (b.p50_ms, b.p99_ms)
    expected = DailyRollup.from_values(v for r in rounds for v in r)
    total = sum(r.count for r in by_summary.values())
    assert total == expected.count
    raw.close()
    folded.close()


def test_a_schema_1_store_file_is_migrated_in_place(tmp_path):
    db = tmp_path / "planner.db"
    with Store(db) as store:                        # tables as schema 2 makes them ...
        for node in ("a", "b"):
            store.register(RegisterRequest(node))
    conn = sqlite3.connect(db)                      # ... then the rollups as schema 1 had them
    conn.executescript("""
        DROP TABLE rollups; DROP TABLE summaries;
        ALTER TABLE batches DROP COLUMN last_summary_id;
        CREATE TABLE rollups (src INTEGER NOT NULL, dst INTEGER NOT NULL, day INTEGER NOT NULL,
            count INTEGER NOT NULL, lost INTEGER NOT NULL, sum REAL NOT NULL,
            sumsq REAL NOT NULL, min REAL, max REAL, PRIMARY KEY (src, dst, day)) WITHOUT ROWID;
        CREATE INDEX rollups_day ON rollups(day);
        CREATE TABLE rollup_buckets (src INTEGER NOT NULL, dst INTEGER NOT NULL,
            day INTEGER NOT NULL, bucket INTEGER NOT NULL, count INTEGER NOT NULL,
            PRIMARY KEY (src, dst, day, bucket)) WITHOUT ROWID;
        INSERT INTO rollups VALUES (1, 2, 20000, 5, 1, 10.0, 26.0, 2.0, 3.0);
        INSERT INTO rollups VALUES (1, 2, 20001, 2, 2, 0.0, 0.0, NULL, NULL);
        INSERT INTO rollup_buckets VALUES (1, 2, 20000, 32, 3), (1, 2, 20000, 34, 1);
        UPDATE meta SET value = '1' WHERE key = 'schema_version';
    """)
    conn.commit()
    conn.close()
    with Store(db) as store:
        days = store.daily_rollups("a", "b")
        assert days[20000] == DailyRollup(5, 1, 10.0, 26.0, 2.0, 3.0, {32: 3, 34: 1})
        assert days[20001].count == 2 and days[20001].buckets == {}
        # and it takes summaries now
        assert store.store_batch(store.node_refs()["a"], "x", [], None, 0, [
            (1, 2, 20000 * DAY_MS, 1, 2, 0, 5.0, 12.5, 2500, 2500, b"\x22\x02")]) == (1, 0, False)
        assert store.daily_rollups("a", "b")[20000].buckets == {32: 3, 34: 3}
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "rollup_buckets" not in tables and "summaries" in tables
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
            == ("3",)   # through 2 on to 3 (sites)


def test_hex_batch_ids_are_kept_as_bytes_and_one_stored_as_text_before_is_still_known(tmp_path):
    with Store(tmp_path / "planner.db") as store:
        for node in ("a", "b"):
            store.register(RegisterRequest(node))
        a = store.node_refs()["a"]
        old_id, new_id = "0123456789abcdef" * 2, "fedcba9876543210" * 2
        with store.transaction("a planner before compact ids") as conn:
            conn.execute("INSERT INTO batches(node_idx, batch_id, received_ms, accepted, "
                         "rejected) VALUES (?, ?, ?, 7, 1)", (a.idx, old_id, NOW))
        assert store.store_batch(a, old_id, [(a.idx, 2, NOW, 1, 56, 1, None, None)]) == \
            (7, 1, True)
        assert store.store_batch(a, new_id, [(a.idx, 2, NOW, 1, 56, 1, None, None)]) == \
            (1, 0, False)
        assert store.store_batch(a, new_id, []) == (1, 0, True)
        assert store.store_batch(a, "not-hex", []) == (0, 0, False)
        kinds = dict(store.conn.execute("SELECT typeof(batch_id), count(*) FROM batches "
                                        "GROUP BY 1").fetchall())
        assert kinds == {"text": 2, "blob": 1} and store.sample_count() == 1
