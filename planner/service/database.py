"""The planner's SQLite file: the connection (WAL mode), transactions, the schema, meta values.

Tables:
  nodes           one row per server: registration (hostname, city, coordinates, agent version,
                  GPU inventory + reason, address, probe port), first/last seen, spool counters,
                  launch status; imported fleets' nodes too (source = 'import')
  batches         (node, batch id) of every stored Report: a retried batch is stored once
  samples         raw probe samples (from agents before summaries), kept ``raw_days`` (default 7)
  summaries       raw per-round summaries from agents, kept ``summary_minutes`` once rolled up
  rollups         per UTC day per ordered pair: count, lost, sum, sum of squares, min and max
                  (whole microseconds: 3-4 bytes instead of 8) and the RTT histogram (``hist``:
                  hulk.wire.histogram's compact bytes), keyed (day, src, dst) so a day's rows
                  sit together and old days leave as a range
  rejected        rejected-sample counters per node and reason
  imported_links  links of an imported fleet file (used where nothing was measured)
  meta            schema version, the rollup watermark, the peers version
  jobs            submitted jobs: name, state, spec, plan id, nodes, restarts, the times of
                  submission, start, finish and retirement (planner.core.lifecycle)
  job_events      every state change of a job, with its time and detail

``planner.service.store.Store`` builds the planner's reads and writes on this class; sqlite
errors become ``hulk.errors.StoreError``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import sqlite_utils

from hulk.errors import StoreError
from hulk.wire import histogram

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2   # 2: histograms inside rollups (was rollup_buckets), summaries, day-first keys

ROLLUPS_V2 = """CREATE TABLE rollups (
    day INTEGER NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL,
    count INTEGER NOT NULL, lost INTEGER NOT NULL, sum REAL NOT NULL,
    sumsq REAL NOT NULL, min_us INTEGER, max_us INTEGER, hist BLOB,
    PRIMARY KEY (day, src, dst)) WITHOUT ROWID"""


class _HistogramSum:
    """SQLite aggregate hist_sum(blob): the sum of encoded histograms, encoded."""

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}

    def step(self, blob: bytes | None) -> None:
        if blob:
            histogram.decode(blob, self.buckets)

    def finalize(self) -> bytes | None:
        return histogram.encode(self.buckets) if self.buckets else None


class _HistogramOf:
    """SQLite aggregate hist_of(bucket, count): the encoded histogram of bucket numbers."""

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}

    def step(self, bucket: int | None, count: int = 1) -> None:
        if bucket is not None:
            self.buckets[bucket] = self.buckets.get(bucket, 0) + count

    def finalize(self) -> bytes | None:
        return histogram.encode(self.buckets) if self.buckets else None


def _histogram_merge(a: bytes | None, b: bytes | None) -> bytes | None:
    if not a:
        return b
    if not b:
        return a
    return histogram.encode(histogram.decode(b, histogram.decode(a)))


def add_histogram_functions(conn: sqlite3.Connection) -> None:
    """hist_sum(blob) and hist_of(bucket[, count]) aggregates, hist_merge(a, b): the rollups'
    histograms are merged inside SQLite's statements, never row by row in Python loops."""
    conn.create_aggregate("hist_sum", 1, _HistogramSum)
    conn.create_aggregate("hist_of", 1, _HistogramOf)
    conn.create_aggregate("hist_of", 2, _HistogramOf)
    conn.create_function("hist_merge", 2, _histogram_merge, deterministic=True)


def private_file(path: str | os.PathLike) -> None:
    """Make the store file readable by its owner only (it holds token hashes and the fleet's
    addresses); SQLite gives its -wal and -shm files the same mode."""
    if str(path) == ":memory:":
        return
    try:
        mode = os.stat(path).st_mode & 0o777
        if mode & 0o077:
            os.chmod(path, 0o600)
            log.info("%s: mode %o -> 600 (the store is for the planner's user only)", path, mode)
    except OSError as exc:  # e.g. a file of another owner: leave it, say so
        log.warning("%s: cannot make the store private: %s", path, exc.strerror)


class Database:
    """One connection to the planner's SQLite file, its schema created when missing. One
    instance per thread of use (sqlite connections are not shared)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL",
                 busy_timeout_s: float = 30.0):
        self.path = str(path)
        self._lock = threading.RLock()
        with self._errors("open"):
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=busy_timeout_s)
            private_file(self.path)
            add_histogram_functions(conn)
            self.conn = conn
            self.db = sqlite_utils.Database(conn)
            self.db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a crash of the process (not of the OS) and is much faster.
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.db.execute("PRAGMA foreign_keys=OFF")
            self._create_schema()

    # ------------------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: store failed during {what}: {exc}") from exc

    @contextlib.contextmanager
    def transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: all or nothing."""
        with self._lock, self._errors(what):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            else:
                self.conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock, self._errors("close"):
            self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create_schema(self) -> None:
        db = self.db
        with self.transaction("schema"):
            if "meta" not in db.table_names():
                db["meta"].create({"key": str, "value": str}, pk="key")
                db["meta"].insert({"key": "schema_version", "value": str(SCHEMA_VERSION)})
            if "nodes" not in db.table_names():
                db["nodes"].create({
                    "idx": int, "id": str, "source": str, "hostname": str, "city": str,
                    "latitude": float, "longitude": float, "agent_version": str,
                    "gpus_json": str, "gpu_unavailable_reason": str, "driver_version": str,
                    "gpu_count": int, "gpu_name": str, "compute_capability": float,
                    "memory_gb": float, "address": str, "probe_port": int,
                    "first_seen_ms": int, "last_seen_ms": int, "registered_ms": int,
                    "peers_version_seen": int, "spool_depth": int, "spool_dropped": int,
                    "launch_plan_id": str, "launch_job": str, "launch_state": str,
                    "launch_exit_code": int, "launch_detail": str, "launch_changed_ms": int,
                }, pk="idx", not_null={"id"})
                db["nodes"].create_index(["id"], unique=True)
            if "clock_skew_ms" not in db["nodes"].columns_dict:  # added after schema version 1
                db.execute("ALTER TABLE nodes ADD COLUMN clock_skew_ms INTEGER")
            if "batches" not in db.table_names():
                db.execute("""CREATE TABLE batches (
                    node_idx INTEGER NOT NULL, batch_id TEXT NOT NULL, received_ms INTEGER NOT NULL,
                    accepted INTEGER NOT NULL, rejected INTEGER NOT NULL,
                    last_sample_id INTEGER, last_summary_id INTEGER,
                    PRIMARY KEY (node_idx, batch_id)) WITHOUT ROWID""")
                db.execute("CREATE INDEX batches_received ON batches(received_ms)")
            if "summaries" not in db.table_names():
                # AUTOINCREMENT for the same reason as samples: the rollup watermark.
                db.execute("""CREATE TABLE summaries (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    src INTEGER NOT NULL, dst INTEGER NOT NULL, round_ms INTEGER NOT NULL,
                    kind INTEGER NOT NULL, count INTEGER NOT NULL, lost INTEGER NOT NULL,
                    sum REAL NOT NULL, sumsq REAL NOT NULL, min_us INTEGER, max_us INTEGER,
                    hist BLOB)""")
            if "samples" not in db.table_names():
                # AUTOINCREMENT: rowids never go back, so the rollup watermark stays valid even
                # after pruning empties the table.
                db.execute("""CREATE TABLE samples (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    src INTEGER NOT NULL, dst INTEGER NOT NULL, sent_ms INTEGER NOT NULL,
                    kind INTEGER NOT NULL, payload INTEGER NOT NULL, lost INTEGER NOT NULL,
                    rtt_ms REAL, bucket INTEGER)""")
                # No index on sent_ms: it would cost a B-tree insert per sample. Pruning goes by
                # arrival instead: each batch row records the last sample id it stored.
            if "rollups" not in db.table_names():
                db.execute(ROLLUPS_V2)
            if "rejected" not in db.table_names():
                db.execute("""CREATE TABLE rejected (
                    node_idx INTEGER NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,
                    last_ms INTEGER NOT NULL, PRIMARY KEY (node_idx, reason)) WITHOUT ROWID""")
            if "imported_links" not in db.table_names():
                db.execute("""CREATE TABLE imported_links (
                    src INTEGER NOT NULL, dst INTEGER NOT NULL, rtt_ms REAL NOT NULL,
                    bandwidth_gbps REAL, loss REAL NOT NULL, samples INTEGER NOT NULL,
                    imported_ms INTEGER NOT NULL, PRIMARY KEY (src, dst)) WITHOUT ROWID""")
            if "jobs" not in db.table_names():  # added after schema version 1 (additive)
                db.execute("""CREATE TABLE jobs (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
                    state TEXT NOT NULL, spec_json TEXT NOT NULL, submitted_ms INTEGER NOT NULL,
                    changed_ms INTEGER NOT NULL, plan_id TEXT, nodes_json TEXT NOT NULL DEFAULT '[]',
                    restarts INTEGER NOT NULL DEFAULT 0, started_ms INTEGER, finished_ms INTEGER,
                    retired_ms INTEGER, estimate_s REAL, detail TEXT NOT NULL DEFAULT '')""")
                db.execute("CREATE INDEX jobs_name ON jobs(name)")
                db.execute("""CREATE TABLE job_events (
                    job_id INTEGER NOT NULL, at_ms INTEGER NOT NULL, state TEXT NOT NULL,
                    detail TEXT NOT NULL DEFAULT '')""")
                db.execute("CREATE INDEX job_events_job ON job_events(job_id)")
            if self._meta("schema_version") == "1":
                self._migrate_from_1(self.conn)
        version = self._meta("schema_version")
        if version != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: schema version {version}, this planner reads "
                             f"{SCHEMA_VERSION}")

    def _migrate_from_1(self, conn: sqlite3.Connection) -> None:
        """Schema 1 -> 2 in place, inside the schema transaction: each day's histogram moves
        from rollup_buckets rows into its rollup row, rollups are keyed day first, batches
        gain last_summary_id (the summaries table is created above)."""
        conn.execute("ALTER TABLE rollups RENAME TO rollups_v1")
        conn.execute("DROP INDEX IF EXISTS rollups_day")
        conn.execute(ROLLUPS_V2)
        conn.execute("""INSERT INTO rollups(day, src, dst, count, lost, sum, sumsq, min_us, max_us,
                                            hist)
            SELECT r.day, r.src, r.dst, r.count, r.lost, r.sum, r.sumsq,
                   CAST(round(r.min * 1000) AS INTEGER), CAST(round(r.max * 1000) AS INTEGER),
                   (SELECT hist_of(b.bucket, b.count) FROM rollup_buckets b
                    WHERE b.src = r.src AND b.dst = r.dst AND b.day = r.day)
            FROM rollups_v1 r ORDER BY r.day, r.src, r.dst""")
        conn.execute("DROP TABLE rollups_v1")
        conn.execute("DROP TABLE IF EXISTS rollup_buckets")
        columns = {row[1] for row in conn.execute("PRAGMA table_info(batches)")}
        if "last_summary_id" not in columns:
            conn.execute("ALTER TABLE batches ADD COLUMN last_summary_id INTEGER")
        self._set_meta(conn, "schema_version", SCHEMA_VERSION)
        log.info("%s: store migrated from schema 1 to %d (histograms inside rollups, "
                 "per-round summaries)", self.path, SCHEMA_VERSION)

    def _meta(self, key: str, default: str | None = None) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def _set_meta(self, conn: sqlite3.Connection, key: str, value: Any) -> None:
        conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, str(value)))
