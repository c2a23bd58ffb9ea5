"""The SQLite spool: bound and drop counting, ack semantics, batch-id reuse, persistence."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.spool import Spool
from hulk.wire.records import ProbeKind, ProbeSample


def samples(n: int, start: int = 0, peer: str = "p") -> list[ProbeSample]:
    return [ProbeSample(peer_id=peer, sent_at_ms=1_700_000_000_000 + i, kind=ProbeKind.ICMP,
                        payload_bytes=56, lost=i % 7 == 0, rtt_ms=0.0 if i % 7 == 0 else 1.5 + i,
                        timeout_ms=2000.0) for i in range(start, start + n)]


def test_append_take_ack_round_trip(tmp_path: Path):
    spool = Spool(tmp_path / "spool.sqlite", max_samples=1000)
    written = samples(25)
    spool.append(written)
    assert spool.depth == 25
    batch = spool.take_batch(10)
    assert batch is not None and list(batch.samples) == written[:10]  # oldest first, exact values
    assert spool.ack(batch.batch_id) == 10
    assert spool.depth == 15
    rest = [spool.take_batch(10), None]
    spool.ack(rest[0].batch_id)
    rest[1] = spool.take_batch(10)
    spool.ack(rest[1].batch_id)
    assert list(rest[0].samples) + list(rest[1].samples) == written[10:]
    assert spool.take_batch(10) is None and spool.depth == 0
    assert spool.dropped == 0
    with sqlite3.connect(tmp_path / "spool.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unacknowledged_batch_is_offered_again_with_the_same_id(tmp_path: Path):
    spool = Spool(tmp_path / "spool.sqlite", max_samples=1000)
    spool.append(samples(30))
    first = spool.take_batch(20)
    spool.append(samples(5, start=100))      # arriving meanwhile must not join the batch
    again = spool.take_batch(20)
    assert again == first
    spool.ack(first.batch_id)
    second = spool.take_batch(20)
    assert second.batch_id != first.batch_id and len(second.samples) == 15


def test_batch_id_survives_a_restart(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    spool = Spool(path, max_samples=1000)
    spool.append(samples(8))
    pending = spool.take_batch(5)
    spool.close()                              # crash before the planner answered

    reopened = Spool(path, max_samples=1000)
    assert reopened.depth == 8
    assert reopened.take_batch(5) == pending
    reopened.ack(pending.batch_id)
    assert reopened.depth == 3
    reopened.close()


def test_bound_drops_oldest_unbatched_and_counts_persistently(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    spool = Spool(path, max_samples=100)
    spool.append(samples(30))
    in_flight = spool.take_batch(30)           # these may already be stored upstream: never drop
    assert spool.append(samples(60, start=30)) == 0
    assert spool.append(samples(25, start=90)) == 15
    assert spool.depth == 100 and spool.dropped == 15
    assert spool.take_batch(30) == in_flight
    spool.ack(in_flight.batch_id)
    next_batch = spool.take_batch(100)
    # samples 30..44 were the oldest un-batched ones: dropped; 45..114 remain, in order.
    assert [s.sent_at_ms - 1_700_000_000_000 for s in next_batch.samples] == list(range(45, 115))
    spool.close()

    reopened = Spool(path, max_samples=100)
    assert reopened.dropped == 15
    reopened.append(samples(101, start=200))
    assert reopened.dropped == 15 + 71          # 70 batched stay, 101 new: 71 oldest new go
    reopened.close()


def test_discard_counts_as_dropped(tmp_path: Path):
    spool = Spool(tmp_path / "spool.sqlite", max_samples=100)
    spool.append(samples(12))
    batch = spool.take_batch(10)
    assert spool.discard(batch.batch_id) == 10
    assert spool.dropped == 10 and spool.depth == 2


def test_a_spool_written_by_the_previous_version_keeps_its_pending_batch(tmp_path: Path):
    """Before the batches table, a batch was a batch_id stamped on its samples (indexed)."""
    path = tmp_path / "spool.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE samples (seq INTEGER PRIMARY KEY AUTOINCREMENT, batch_id TEXT,
                peer_id TEXT NOT NULL, sent_at_ms INTEGER NOT NULL, kind INTEGER NOT NULL,
                payload_bytes INTEGER NOT NULL, lost INTEGER NOT NULL, rtt_ms REAL NOT NULL,
                timeout_ms REAL NOT NULL);
            CREATE INDEX samples_batch ON samples(batch_id);
            CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
            INSERT INTO counters VALUES ('dropped', 7);""")
        db.executemany("INSERT INTO samples (batch_id, peer_id, sent_at_ms, kind, payload_bytes,"
                       " lost, rtt_ms, timeout_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [("old-batch" if s.sent_at_ms % 100 < 4 else None, s.peer_id,
                         s.sent_at_ms, int(s.kind), s.payload_bytes, int(s.lost), s.rtt_ms,
                         s.timeout_ms) for s in samples(10)])
    spool = Spool(path, max_samples=1000)
    assert spool.depth == 10 and spool.dropped == 7
    pending = spool.take_batch(100)
    assert pending.batch_id == "old-batch" and pending.samples == tuple(samples(4))
    assert spool.ack("old-batch") == 4
    following = spool.take_batch(100)
    assert following.batch_id != "old-batch" and following.samples == tuple(samples(6, start=4))
    spool.close()
