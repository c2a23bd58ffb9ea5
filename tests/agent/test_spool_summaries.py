"""The spool keeps per-round summaries exactly like samples (until acknowledged), and a spool
written before summaries (raw samples only) opens, keeps its rows and takes summaries too."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.prober import summarize_round
from agent.spool import Spool
from hulk.wire.records import PeerSummary, ProbeKind, ProbeSample

OLD_SCHEMA = """
CREATE TABLE samples (seq INTEGER PRIMARY KEY AUTOINCREMENT, batch_id TEXT, peer_id TEXT NOT NULL,
    sent_at_ms INTEGER NOT NULL, kind INTEGER NOT NULL, payload_bytes INTEGER NOT NULL,
    lost INTEGER NOT NULL, rtt_ms REAL NOT NULL, timeout_ms REAL NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO counters VALUES ('dropped', 0);
CREATE TABLE batches (batch_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL);
INSERT INTO samples (peer_id, sent_at_ms, kind, payload_bytes, lost, rtt_ms, timeout_ms)
    VALUES ('old-peer', 1700000000000, 1, 56, 0, 12.5, 2000.0);
"""


def round_of(peer: str, rtts: list[float | None], start: int, kind=ProbeKind.ICMP):
    return [ProbeSample(peer, start + 200 * i, kind, 56, r is None, 0.0 if r is None else r,
                        2000.0) for i, r in enumerate(rtts)]


def test_summaries_round_trip_through_the_spool_and_leave_only_when_acknowledged(tmp_path):
    rounds = [round_of("b", [1.25, None, 1.75], 1000), round_of("c", [None, None], 2000),
              round_of("d", [None], 3000) + round_of("d", [0.5], 3000, ProbeKind.TCP)]
    summaries = [s for r in rounds for s in summarize_round(r)]
    assert len(summaries) == 4                    # the ICMP-then-TCP round gives two
    spool = Spool(tmp_path / "spool.sqlite", max_samples=100)
    spool.append(summaries)
    batch = spool.take_batch(10)
    assert batch.samples == tuple(summaries)
    spool.close()
    reopened = Spool(tmp_path / "spool.sqlite", max_samples=100)   # a restart: same batch again
    again = reopened.take_batch(10)
    assert again.batch_id == batch.batch_id and again.samples == tuple(summaries)
    assert reopened.ack(batch.batch_id) == 4 and reopened.take_batch(10) is None
    reopened.close()


def test_a_spool_from_before_summaries_keeps_its_samples_and_takes_summaries(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
    spool = Spool(path, max_samples=100)
    summary = summarize_round(round_of("b", [3.0, 4.0], 5000))
    spool.append(summary)
    batch = spool.take_batch(10)
    old, new = batch.samples
    assert isinstance(old, ProbeSample) and old.peer_id == "old-peer" and old.rtt_ms == 12.5
    assert isinstance(new, PeerSummary) and new == summary[0]
    spool.close()


def test_the_bound_counts_summaries_as_records(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite", max_samples=3)
    summaries = [s for i in range(5) for s in summarize_round(round_of(f"p{i}", [1.0], i))]
    assert spool.append(summaries) == 2 and spool.dropped == 2 and spool.depth == 3
    assert [s.peer_id for s in spool.take_batch(10).samples] == ["p2", "p3", "p4"]
    spool.close()
