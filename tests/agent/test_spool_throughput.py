"""Throughput test results wait in the spool like summaries: they survive a restart (the batch
that holds them is sent again under the same id), they leave only when acknowledged, they count
against the spool's bound, and a spool written before them opens and takes them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.prober import summarize_round
from agent.spool import Spool
from hulk.wire.records import PeerSummary, ProbeKind, ProbeSample
from hulk.wire.throughput import ThroughputResult

RESULT = ThroughputResult(test_id="ab" * 16, sender_id="osaka-1", start_ms=1_764_150_001_000,
                          duration_s=2.5, bytes=3_125_000_000, streams=4, gbps=10.0, ok=True)
FAILED = ThroughputResult(test_id="cd" * 16, sender_id="osaka-2", start_ms=1_764_150_000_000,
                          duration_s=0.0, bytes=0, streams=0, gbps=0.0, ok=False,
                          detail="the sender never connected")

# The spool as agents wrote it before throughput results: no throughput column.
SUMMARIES_SCHEMA = """
CREATE TABLE samples (seq INTEGER PRIMARY KEY AUTOINCREMENT, batch_id TEXT, peer_id TEXT NOT NULL,
    sent_at_ms INTEGER NOT NULL, kind INTEGER NOT NULL, payload_bytes INTEGER NOT NULL,
    lost INTEGER NOT NULL, rtt_ms REAL NOT NULL, timeout_ms REAL NOT NULL, count INTEGER,
    sumsq REAL, min_ms REAL, max_ms REAL, hist BLOB);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO counters VALUES ('dropped', 0);
CREATE TABLE batches (batch_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL);
INSERT INTO samples (peer_id, sent_at_ms, kind, payload_bytes, lost, rtt_ms, timeout_ms)
    VALUES ('old-peer', 1700000000000, 1, 56, 0, 12.5, 2000.0);
"""


def summary(peer: str, start: int) -> PeerSummary:
    packets = [ProbeSample(peer, start + 200 * i, ProbeKind.ICMP, 56, False, 1.0 + i, 2000.0)
               for i in range(3)]
    return summarize_round(packets)[0]


def test_a_spooled_result_survives_a_restart_and_is_sent_again_under_the_same_batch_id(
        tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    records = [summary("b", 1000), RESULT, FAILED, summary("c", 2000)]
    spool = Spool(path, max_samples=100)
    spool.append(records)
    batch = spool.take_batch(10)          # sent; the agent stops before the answer comes
    assert batch.samples == tuple(records)
    spool.close()
    reopened = Spool(path, max_samples=100)
    again = reopened.take_batch(10)
    assert again.batch_id == batch.batch_id and again.samples == tuple(records)
    assert [r for r in again.samples if isinstance(r, ThroughputResult)] == [RESULT, FAILED]
    assert reopened.ack(batch.batch_id) == 4 and reopened.take_batch(10) is None
    reopened.close()
    assert Spool(path, max_samples=100).depth == 0


def test_a_result_held_in_memory_is_saved_when_the_spool_closes(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    spool = Spool(path, max_samples=100)
    spool.hold([RESULT])                  # what the runtime's sink does
    assert spool.stored == 0
    spool.close()                         # the agent stops before the next save()
    reopened = Spool(path, max_samples=100)
    assert reopened.take_batch(10).samples == (RESULT,)
    reopened.close()


def test_results_count_against_the_bound_like_any_record(tmp_path: Path):
    spool = Spool(tmp_path / "spool.sqlite", max_samples=100)
    assert spool.append([summary(f"p{i}", i * 1000) for i in range(99)]) == 0
    assert spool.append([RESULT, FAILED]) == 1     # the oldest summary goes, counted
    assert spool.depth == 100 and spool.dropped == 1
    batch = spool.take_batch(1000)
    assert batch.samples[-2:] == (RESULT, FAILED)
    spool.close()


def test_a_spool_from_before_throughput_results_keeps_its_rows_and_takes_results(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SUMMARIES_SCHEMA)
    spool = Spool(path, max_samples=100)
    spool.append([RESULT])
    old, new = spool.take_batch(10).samples
    assert isinstance(old, ProbeSample) and old.peer_id == "old-peer" and old.rtt_ms == 12.5
    assert new == RESULT
    spool.close()
