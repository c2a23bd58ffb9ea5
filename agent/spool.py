"""The agent's local SQLite spool: records wait here until the planner acknowledges them.

A record is a per-round summary (``PeerSummary``, what the prober makes), a throughput test
this node received (``ThroughputResult``), or a raw sample (``ProbeSample``: what older agents
spooled, still sent after an upgrade). All are rows of one table, so a batch keeps the
exact-once order whatever it holds; a summary's row has ``count`` set, a throughput result's
``throughput`` (its fields as JSON; a sample has neither). "Samples" below means records of any
kind.

- hold(): new samples, into memory (cheap; the prober calls it every round).
- save(): what memory holds, onto disk (the runtime calls it about once a second).
- append(): hold() then save().
- take_batch(): the pending batch if there is one (a retry reuses its id), else the oldest
  samples under a fresh id, recorded on disk before it is sent.
- ack(batch_id): the planner stored (or already had) the batch; delete it.
- Bounded: past ``max_samples`` on disk the oldest un-batched samples are dropped, past
  ``memory_max`` in memory the oldest held ones; both are counted, and the count is persistent
  and cumulative (ReportRequest.spool_dropped).

Near a full disk (the write-ahead log alone can fill a small filesystem):

- The log stays small: WAL mode (a commit costs no fsync, which matters on the event loop, and
  a reader never blocks the writer), folded into the database every ``WAL_PAGES`` pages and
  kept at most ``WAL_LIMIT_BYTES``. The log file is reused, not re-grown, after each
  checkpoint, so deleting acknowledged samples finds its room already allocated; a rollback
  journal would instead need fresh space for every transaction, deletes included.
- New samples go to disk only while the filesystem keeps ``reserve_bytes`` free (or while
  they fit in pages the spool already owns): the reserve is what the checkpoint, the batch
  record and the acks need, so the spool can always drain. Otherwise, and whenever SQLite says
  the disk is full, they wait in memory and save() tries again later.
- Batches are a row of their own (id, last sample) instead of a stamp on every sample, and
  rows leave in chunks of ``CHUNK_ROWS``: neither taking nor acknowledging a batch needs room
  in proportion to its size.

A file that is not a usable spool raises SpoolCorruptError (at open, after a quick check of
every page and column, or when SQLite finds it malformed later); the running agent's spool
(agent/spool_store.py) then moves it aside, and keeps records in memory while no file works.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from hulk.errors import StoreError
from hulk.plural import count as plural
from hulk.wire import histogram
from hulk.wire.records import PeerSummary, ProbeKind, ProbeSample
from hulk.wire.throughput import ThroughputResult

log = logging.getLogger(__name__)

# batch_id and its index are what spools before the batches table used; kept readable.
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
    timeout_ms REAL NOT NULL,
    count INTEGER,
    sumsq REAL,
    min_ms REAL,
    max_ms REAL,
    hist BLOB,
    throughput TEXT
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('dropped', 0);
CREATE TABLE IF NOT EXISTS batches (batch_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL);
"""

WAL_PAGES = 64                    # checkpoint every 64 pages of log (256 KiB at 4 KiB pages)
WAL_LIMIT_BYTES = 256 << 10       # the log file left after a checkpoint is at most this big
RESERVE_BYTES = 512 << 10         # room kept free for checkpoints, batch records and acks
CHUNK_ROWS = 500                  # rows inserted or deleted per transaction
ROW_BYTES = 128                   # a record on disk, generously (a sample ~60, a summary ~90)
MEMORY_MAX = 50_000               # samples held in memory at most while the disk is full

SQLITE_IOERR, SQLITE_FULL = 10, 13
# Opening: our SQL is fixed, so a plain SQL error means the file holds another schema.
CORRUPT_AT_OPEN = (sqlite3.SQLITE_ERROR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
CORRUPT = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
_COLUMNS = ("peer_id, sent_at_ms, kind, payload_bytes, lost, rtt_ms, timeout_ms, count, sumsq, "
            "min_ms, max_ms, hist, throughput")
# Columns a spool written before summaries or throughput results lacks (added on open).
_SUMMARY_COLUMNS = {"count": "INTEGER", "sumsq": "REAL", "min_ms": "REAL", "max_ms": "REAL",
                    "hist": "BLOB", "throughput": "TEXT"}
Record = ProbeSample | PeerSummary | ThroughputResult


class SpoolFullError(StoreError):
    """The filesystem has no room for this write now; the same call may work later."""


class SpoolCorruptError(StoreError):
    """The spool file is not a usable spool (not SQLite, truncated, malformed, another schema,
    not a regular file): no retry can fix it; agent/spool_store.py moves it aside."""


@dataclass(frozen=True)
class Batch:
    batch_id: str
    samples: tuple[Record, ...]      # summaries, throughput results, an older spool's samples


def _is_full(err: sqlite3.Error) -> bool:
    """A write that failed for lack of room (or an I/O error writing): worth retrying later."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (SQLITE_FULL, SQLITE_IOERR)
    return "disk is full" in str(err) or "disk I/O error" in str(err)


def memory_bound(max_samples: int, memory_max: int | None = None) -> int:
    """Most samples kept in memory while the disk has no room."""
    return max(1, memory_max if memory_max is not None else min(max_samples, MEMORY_MAX))


def _code(err: sqlite3.Error) -> int | None:
    code = getattr(err, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _row(s: Record) -> tuple:
    if isinstance(s, PeerSummary):
        return (s.peer_id, s.round_start_ms, int(s.kind), s.payload_bytes, s.lost, s.rtt_sum_ms,
                s.timeout_ms, s.count, s.rtt_sum_sq_ms2, s.rtt_min_ms, s.rtt_max_ms,
                histogram.encode(dict(s.buckets)), None)
    if isinstance(s, ThroughputResult):   # the NOT NULL columns get what they can say
        return (s.sender_id, s.start_ms, 0, 0, int(not s.ok), 0.0, 0.0, None, None, None, None,
                None, json.dumps(asdict(s)))
    return (s.peer_id, s.sent_at_ms, int(s.kind), s.payload_bytes, int(s.lost), s.rtt_ms,
            s.timeout_ms, None, None, None, None, None, None)


def _record(r: tuple) -> Record:
    if r[12] is not None:
        return ThroughputResult(**json.loads(r[12]))
    if r[7] is None:
        return ProbeSample(peer_id=r[0], sent_at_ms=r[1], kind=ProbeKind(r[2]),
                           payload_bytes=r[3], lost=bool(r[4]), rtt_ms=r[5], timeout_ms=r[6])
    return PeerSummary(r[0], r[1], r[2], r[3], r[6], r[7], r[4], r[5], r[8], r[9], r[10],
                       tuple(sorted(histogram.decode(r[11]).items())))


class Spool:
    def __init__(self, path: Path, max_samples: int, *, memory_max: int | None = None,
                 reserve_bytes: int = RESERVE_BYTES):
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self.path = Path(path)
        self.max_samples = max_samples
        self.memory_max = memory_bound(max_samples, memory_max)
        self.reserve_bytes = reserve_bytes
        self._held: deque[Record] = deque()
        self._unsaved_dropped = 0       # dropped from memory, not yet added to the disk counter
        self._waiting_since_held: int | None = None   # held count when saving stopped (logged)
        try:
            self._db = self._connect()
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit survives a process crash; a power cut may lose the last ones.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            self._db.executescript(SCHEMA)
            self._migrate()
            self._check()
            self._page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
            self._stored = self._db.execute("SELECT count(*) FROM samples").fetchone()[0]
            self._saved_dropped = self._db.execute(
                "SELECT value FROM counters WHERE name = 'dropped'").fetchone()[0]
            self._pending = self._db.execute(
                "SELECT batch_id, last_seq FROM batches ORDER BY last_seq LIMIT 1").fetchone()
        except SpoolCorruptError:
            self.abandon()
            raise
        except (sqlite3.Error, OSError) as err:
            self.abandon()
            kind = SpoolCorruptError if isinstance(err, sqlite3.Error) and \
                _code(err) in CORRUPT_AT_OPEN else StoreError
            raise kind(f"{self.path}: cannot open the spool: {err}") from None

    def _connect(self) -> sqlite3.Connection:
        if self.path.exists() and not self.path.is_file():
            raise SpoolCorruptError(f"{self.path}: cannot open the spool: not a regular file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return sqlite3.connect(str(self.path), isolation_level=None, timeout=10.0)

    def _check(self) -> None:
        """Every page readable and every column the spool writes present, or SpoolCorruptError
        (found now rather than at the first write)."""
        result = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if result != "ok":
            raise SpoolCorruptError(f"{self.path}: cannot open the spool: {result}")
        have = {row[1] for row in self._db.execute("PRAGMA table_info(samples)")}
        missing = [c for c in ("seq", *_COLUMNS.split(", ")) if c not in have]
        for table, columns in (("counters", ("name", "value")),
                               ("batches", ("batch_id", "last_seq"))):
            cols = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            missing += [f"{table}.{c}" for c in columns if c not in cols]
        if missing:
            raise SpoolCorruptError(f"{self.path}: cannot open the spool: another schema "
                                    f"(no column {', '.join(missing)})")

    def abandon(self) -> None:
        """Close without saving what memory holds (the caller has taken it, or gives it up)."""
        db = getattr(self, "_db", None)
        if db is not None:
            try:
                db.close()
            except sqlite3.Error:
                pass

    def _migrate(self) -> None:
        """A spool written before the batches table: its stamped batch becomes the pending one."""
        self._db.execute("DROP INDEX IF EXISTS samples_batch")
        have = {row[1] for row in self._db.execute("PRAGMA table_info(samples)")}
        for name, kind in _SUMMARY_COLUMNS.items():
            if name not in have:  # a spool from before summaries: its samples stay as they are
                self._db.execute(f"ALTER TABLE samples ADD COLUMN {name} {kind}")
        if self._db.execute("SELECT 1 FROM batches LIMIT 1").fetchone() is None:
            stamped = self._db.execute(
                "SELECT batch_id, max(seq) FROM samples WHERE batch_id IS NOT NULL"
                " GROUP BY batch_id ORDER BY min(seq) LIMIT 1").fetchone()
            if stamped is not None:
                self._db.execute("INSERT INTO batches VALUES (?, ?)", stamped)

    def _fail(self, what: str, err: sqlite3.Error) -> StoreError:
        kind = SpoolCorruptError if _code(err) in CORRUPT else \
            SpoolFullError if _is_full(err) else StoreError
        return kind(f"{self.path}: spool {what} failed: {err}")

    # ------------------------------------------------------------------ samples in
    def hold(self, samples: Iterable[Record]) -> int:
        """Keep samples in memory until the next save(); returns how many of the oldest held
        ones the memory bound dropped."""
        self._held.extend(samples)
        dropped = len(self._held) - self.memory_max
        if dropped <= 0:
            return 0
        for _ in range(dropped):
            self._held.popleft()
        if not self._unsaved_dropped:
            log.warning("spool: %d samples wait in memory, the most it keeps; dropping the "
                        "oldest until the disk has room again", self.memory_max)
        self._unsaved_dropped += dropped
        return dropped

    def save(self) -> int:
        """Write what memory holds to disk, as far as there is room (the rest stays held).
        Returns how many older samples the disk bound dropped. Raises StoreError only for a
        broken spool, never for a full disk."""
        dropped = 0
        while self._held:
            chunk = [self._held[i] for i in range(min(CHUNK_ROWS, len(self._held)))]
            if not self._room_for(len(chunk)):
                self._note_waiting("the filesystem is nearly full")
                break
            try:
                dropped += self._insert(chunk)
            except SpoolFullError as err:
                self._note_waiting(str(err))
                break
            for _ in chunk:
                self._held.popleft()
        if not self._held and self._waiting_since_held is not None:
            log.warning("spool: the disk has room again; every held sample is saved "
                        "(%d dropped so far)", self.dropped)
            self._waiting_since_held = None
        return dropped

    def append(self, samples: Iterable[Record]) -> int:
        """hold() then save(); returns how many samples the bounds dropped."""
        return self.hold(samples) + self.save()

    def _room_for(self, rows: int) -> bool:
        needed = rows * ROW_BYTES
        try:
            stat = os.statvfs(self.path.parent)
            free = stat.f_bavail * stat.f_frsize
            if free - needed >= self.reserve_bytes:
                return True
            # Pages freed by acknowledged batches take new samples without growing the file.
            owned = self._db.execute("PRAGMA freelist_count").fetchone()[0] * self._page_size
        except (OSError, sqlite3.Error):
            return True  # cannot tell: let SQLite answer
        return owned >= needed

    def _note_waiting(self, why: str) -> None:
        if self._waiting_since_held is None:
            self._waiting_since_held = len(self._held)
            log.warning("spool: cannot write to %s (%s); %s in memory (at most %d) "
                        "and saved when there is room", self.path, why,
                        plural(len(self._held), "sample"), self.memory_max)

    def _insert(self, chunk: list[Record]) -> int:
        """One transaction: the chunk in, the oldest un-batched out past the bound, counters."""
        try:
            with self._transaction():
                self._db.executemany(f"INSERT INTO samples ({_COLUMNS}) VALUES (?, ?, ?, ?, ?,"
                                     " ?, ?, ?, ?, ?, ?, ?, ?)", [_row(s) for s in chunk])
                depth = self._stored + len(chunk)
                dropped = 0
                if depth > self.max_samples:
                    # Only un-batched samples go: a batch in flight may already be stored upstream.
                    cursor = self._db.execute(
                        "DELETE FROM samples WHERE seq IN (SELECT seq FROM samples WHERE seq > ?"
                        " ORDER BY seq LIMIT ?)", (self._pending_last(), depth - self.max_samples))
                    dropped = cursor.rowcount
                counted = dropped + self._unsaved_dropped
                if counted:
                    self._db.execute("UPDATE counters SET value = value + ? WHERE name = "
                                     "'dropped'", (counted,))
        except sqlite3.Error as err:
            raise self._fail("append", err) from None
        self._stored = depth - dropped
        self._saved_dropped += counted
        self._unsaved_dropped = 0
        return dropped

    def _pending_last(self) -> int:
        return self._pending[1] if self._pending is not None else 0

    # ------------------------------------------------------------------ batches out
    def take_batch(self, max_samples: int) -> Batch | None:
        """The batch to send next: the pending one (same id as before), else a new one of the
        oldest samples on disk; None when the disk holds none."""
        try:
            if self._pending is None:
                row = self._db.execute(
                    "SELECT max(seq) FROM (SELECT seq FROM samples ORDER BY seq LIMIT ?)",
                    (max_samples,)).fetchone()
                if row[0] is None:
                    return None
                pending = (uuid.uuid4().hex, row[0])
                with self._transaction():
                    self._db.execute("INSERT INTO batches VALUES (?, ?)", pending)
                self._pending = pending
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM samples WHERE seq <= ? ORDER BY seq",
                                    (self._pending[1],)).fetchall()
        except sqlite3.Error as err:
            raise self._fail("take_batch", err) from None
        if not rows:  # acknowledged, but the process stopped before the record went
            self._finish(self._pending[0], count_dropped=False)
            return self.take_batch(max_samples)
        return Batch(self._pending[0], tuple(_record(r) for r in rows))

    def peek(self, max_samples: int) -> tuple[Record, ...]:
        """The oldest ``max_samples`` records on disk, batched or not, left where they are."""
        try:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM samples ORDER BY seq LIMIT ?",
                                    (max_samples,)).fetchall()
        except sqlite3.Error as err:
            raise self._fail("peek", err) from None
        return tuple(_record(r) for r in rows)

    def ack(self, batch_id: str) -> int:
        """The planner has the batch: delete it. Returns how many samples left the spool."""
        return self._finish(batch_id, count_dropped=False)

    def discard(self, batch_id: str) -> int:
        """Give up on a batch the planner refuses for good; its samples count as dropped."""
        return self._finish(batch_id, count_dropped=True)

    def _finish(self, batch_id: str, *, count_dropped: bool) -> int:
        """Delete the pending batch in chunks; a chunk left by a crash is sent again under the
        same id, which the planner answers as a duplicate."""
        if self._pending is None or self._pending[0] != batch_id:
            return 0
        last_seq, removed = self._pending[1], 0
        what = "discard" if count_dropped else "ack"
        while True:
            try:
                with self._transaction():
                    cursor = self._db.execute(
                        "DELETE FROM samples WHERE seq IN (SELECT seq FROM samples WHERE seq <= ?"
                        " ORDER BY seq LIMIT ?)", (last_seq, CHUNK_ROWS))
                    gone = cursor.rowcount
                    if count_dropped and gone:
                        self._db.execute("UPDATE counters SET value = value + ? WHERE name = "
                                         "'dropped'", (gone,))
                    if gone < CHUNK_ROWS:
                        self._db.execute("DELETE FROM batches WHERE batch_id = ?", (batch_id,))
            except sqlite3.Error as err:
                raise self._fail(what, err) from None
            self._stored -= gone
            removed += gone
            if count_dropped:
                self._saved_dropped += gone
            if gone < CHUNK_ROWS:
                self._pending = None
                return removed

    # ------------------------------------------------------------------ state
    @property
    def depth(self) -> int:
        """Samples the spool has, on disk (batched or not) and waiting in memory."""
        return self._stored + len(self._held)

    @property
    def stored(self) -> int:
        """Samples on disk, where batches come from."""
        return self._stored

    @property
    def held(self) -> int:
        """Samples waiting in memory for room on disk."""
        return len(self._held)

    @property
    def dropped(self) -> int:
        """Samples dropped past the bounds (or refused), cumulative over the spool's life."""
        return self._saved_dropped + self._unsaved_dropped

    def add_dropped(self, count: int) -> None:
        """Count samples another spool lost or dropped as this one's (kept in memory until a
        write works, when the disk has no room now)."""
        if count <= 0:
            return
        try:
            with self._transaction():
                self._db.execute("UPDATE counters SET value = value + ? WHERE name = 'dropped'",
                                 (count,))
        except sqlite3.Error:
            self._unsaved_dropped += count
            return
        self._saved_dropped += count

    @property
    def pending(self) -> str | None:
        """The id of the batch taken and not yet acknowledged or discarded, if any."""
        return self._pending[0] if self._pending is not None else None

    def held_batch(self, max_samples: int) -> tuple[Record, ...]:
        """Up to ``max_samples`` of the oldest held samples, left in memory: at shutdown, what
        the disk cannot take is sent as it is (then forget_held())."""
        return tuple(self._held[i] for i in range(min(max_samples, len(self._held))))

    def forget_held(self, count: int) -> None:
        """The planner has the oldest ``count`` held samples."""
        for _ in range(min(count, len(self._held))):
            self._held.popleft()

    def close(self) -> None:
        """Save what memory holds if there is room, then close. What cannot be saved is lost
        (logged with its count)."""
        try:
            self.save()
        except StoreError as err:
            log.error("%s", err)
        if self._held or self._unsaved_dropped:
            log.error("spool: no room on disk: lost %s held in memory, and %d "
                      "dropped ones go uncounted", plural(len(self._held), "sample"),
                      self._unsaved_dropped)
        self.abandon()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection. SQLite may
    have rolled back by itself after a full disk; a failed COMMIT is rolled back here."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.Error:
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
