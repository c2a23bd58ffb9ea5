"""The agent's local SQLite spool: samples wait here until the planner acknowledges them.

- append(): new samples, un-batched.
- take_batch(): the pending batch if there is one (a retry reuses its id), else the oldest
  un-batched samples under a fresh id, written to disk before it is sent.
- ack(batch_id): the planner stored (or already had) the batch; delete it.
- Bounded: past ``max_samples`` the oldest un-batched samples are dropped and counted; the
  count is persistent and cumulative (ReportRequest.spool_dropped).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hulk.errors import StoreError
from hulk.wire.records import ProbeKind, ProbeSample

SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT,
    peer_id TEXT NOT NULL,
    sent_at_ms INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    payload_bytes INTEGER NOT NULL,
    lost INTEGER NOT NULL,
    rtt_ms REAL NOT NULL,
    timeout_ms REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_batch ON samples(batch_id);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('dropped', 0);
"""


@dataclass(frozen=True)
class Batch:
    batch_id: str
    samples: tuple[ProbeSample, ...]


class Spool:
    def __init__(self, path: Path, max_samples: int):
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self.path = Path(path)
        self.max_samples = max_samples
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), isolation_level=None, timeout=10.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit survives a process crash; a power cut may lose the last ones.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            self._depth = self._db.execute("SELECT count(*) FROM samples").fetchone()[0]
        except (sqlite3.Error, OSError) as err:
            raise StoreError(f"{self.path}: cannot open the spool: {err}") from None

    def _fail(self, what: str, err: Exception) -> StoreError:
        return StoreError(f"{self.path}: spool {what} failed: {err}")

    def append(self, samples: Iterable[ProbeSample]) -> int:
        """Store samples; returns how many older ones were dropped to stay within the bound."""
        rows = [(s.peer_id, s.sent_at_ms, int(s.kind), s.payload_bytes, int(s.lost), s.rtt_ms,
                 s.timeout_ms) for s in samples]
        if not rows:
            return 0
        try:
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO samples (peer_id, sent_at_ms, kind, payload_bytes, lost, rtt_ms,"
                    " timeout_ms) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                depth = self._depth + len(rows)
                dropped = 0
                if depth > self.max_samples:
                    # Only un-batched samples go: a batch in flight may already be stored upstream.
                    cursor = self._db.execute(
                        "DELETE FROM samples WHERE seq IN (SELECT seq FROM samples"
                        " WHERE batch_id IS NULL ORDER BY seq LIMIT ?)",
                        (depth - self.max_samples,))
                    dropped = cursor.rowcount
                    self._db.execute("UPDATE counters SET value = value + ? WHERE name = 'dropped'",
                                     (dropped,))
        except sqlite3.Error as err:
            raise self._fail("append", err) from None
        self._depth = depth - dropped
        return dropped

    def take_batch(self, max_samples: int) -> Batch | None:
        """The batch to send next: the pending one (same id as before), else a new one."""
        try:
            row = self._db.execute(
                "SELECT batch_id FROM samples WHERE batch_id IS NOT NULL ORDER BY seq LIMIT 1"
            ).fetchone()
            if row is None:
                batch_id = uuid.uuid4().hex
                with self._transaction():
                    cursor = self._db.execute(
                        "UPDATE samples SET batch_id = ? WHERE seq IN (SELECT seq FROM samples"
                        " WHERE batch_id IS NULL ORDER BY seq LIMIT ?)", (batch_id, max_samples))
                if cursor.rowcount == 0:
                    return None
            else:
                batch_id = row[0]
            rows = self._db.execute(
                "SELECT peer_id, sent_at_ms, kind, payload_bytes, lost, rtt_ms, timeout_ms"
                " FROM samples WHERE batch_id = ? ORDER BY seq", (batch_id,)).fetchall()
        except sqlite3.Error as err:
            raise self._fail("take_batch", err) from None
        samples = tuple(ProbeSample(peer_id=r[0], sent_at_ms=r[1], kind=ProbeKind(r[2]),
                                    payload_bytes=r[3], lost=bool(r[4]), rtt_ms=r[5],
                                    timeout_ms=r[6]) for r in rows)
        return Batch(batch_id, samples)

    def ack(self, batch_id: str) -> int:
        """The planner has the batch: delete it. Returns how many samples left the spool."""
        try:
            with self._transaction():
                cursor = self._db.execute("DELETE FROM samples WHERE batch_id = ?", (batch_id,))
        except sqlite3.Error as err:
            raise self._fail("ack", err) from None
        self._depth -= cursor.rowcount
        return cursor.rowcount

    def discard(self, batch_id: str) -> int:
        """Give up on a batch the planner refuses for good; its samples count as dropped."""
        try:
            with self._transaction():
                cursor = self._db.execute("DELETE FROM samples WHERE batch_id = ?", (batch_id,))
                self._db.execute("UPDATE counters SET value = value + ? WHERE name = 'dropped'",
                                 (cursor.rowcount,))
        except sqlite3.Error as err:
            raise self._fail("discard", err) from None
        self._depth -= cursor.rowcount
        return cursor.rowcount

    @property
    def depth(self) -> int:
        """Samples in the spool, batched or not."""
        return self._depth

    @property
    def dropped(self) -> int:
        """Samples dropped past the bound (or refused), cumulative over the spool's life."""
        try:
            return int(self._db.execute(
                "SELECT value FROM counters WHERE name = 'dropped'").fetchone()[0])
        except sqlite3.Error as err:
            raise self._fail("read", err) from None

    def close(self) -> None:
        try:
            self._db.close()
        except sqlite3.Error:
            pass

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
