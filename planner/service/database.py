"""The planner's SQLite file: the connection (WAL mode), transactions, the schema, meta values.

Tables:
  nodes           one row per server: registration (hostname, city, coordinates, agent version,
                  GPU inventory + reason, address, probe port), first/last seen, spool counters,
                  launch status (with its exit cause: '' or 'fenced'); imported fleets' nodes too (source = 'import')
  batches         (node, batch id) of every stored Report: a retried batch is stored once
  samples         raw probe samples (from agents before summaries), kept ``raw_days`` (default 7)
  summaries       raw per-round summaries from agents, kept ``summary_minutes`` once rolled up
  rollups         per UTC day per ordered node pair: count, lost, sum, sum of squares, min and
                  max (whole microseconds: 3-4 bytes instead of 8) and the RTT histogram
                  (``hist``: hulk.wire.histogram's compact bytes), keyed (day, src, dst) so a
                  day's rows sit together and old days leave as a range. In a fleet of more
                  than ``PER_PAIR_UP_TO`` nodes only pairs inside a site (or with a node of no
                  site) are kept here; pairs between two sites go to site_rollups
  sites           one row per site name (a node's site: ``planner.core.probe_plan.site_key``)
  site_rollups    the same figures per UTC day per ordered pair of sites (src, dst: sites.idx):
                  every measurement between a node of one site and a node of the other
  rejected        rejected-sample counters per node and reason
  imported_links  links of an imported fleet file (used where nothing was measured)
  meta            schema version, the rollup watermark, the peers version
  jobs            submitted jobs: name, state, spec, plan id, nodes, the placement's stages
                  (NULL for jobs placed without them), the plan's estimate, restarts (and how
                  many of them followed a failure of the job's own ranks: failures; a fenced
                  rank: fences), the times of submission, start, finish and retirement
                  (planner.core.lifecycle)
  job_events      every state change of a job, with its time and detail
  job_progress    each job rank's step progress as its heartbeat last carried it
                  (planner.service.job_progress)
  placement_seq   the last placement sequence number issued to each node
                  (planner.service.placement_seq)
  job_ranks       each job rank's last launch report (state, exit code and cause, detail),
                  kept after the job ends (planner.service.job_ranks)
  throughput_scheduled, throughput_tests
                  throughput tests serve handed out and the results their receivers reported
                  (planner.service.throughput_store); nodes.throughput_port is where a node's
                  agent takes them (0: it takes none)

``planner.service.store.Store`` holds one and hands it to the parts that read and write the
tables (nodes, job records, rollup reads); sqlite errors become ``hulk.errors.StoreError``.

Opened to write, the file's tables are looked at before anything is written (``not_a_store``):
another program's SQLite file (tables named like these without their columns, or only other
tables) is a one-line InputError and a store of a newer planner a StoreError, both leaving it
byte for byte as it was; an empty file becomes a store and an older store is migrated (the
columns of ``ADDED_COLUMNS`` added, schema 1 and 2 moved on).

Opened ``read_only`` (the commands that only read), the file is opened with SQLite's mode=ro:
nothing is created, migrated or chmod-ed, every read sees one snapshot, and a file that is not a
store is a one-line InputError that leaves it as it was.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import sqlite_utils

from hulk.errors import InputError, StoreError
from hulk.wire import histogram
from planner.core.probe_plan import site_key
from planner.core.site_pairs import PER_PAIR_UP_TO
from planner.service.job_ranks import JOB_RANKS
from planner.service.read_only import EXPECTED, columns, connect_read_only, read_uri, schema_gap

log = logging.getLogger(__name__)

# 2: histograms inside rollups (not a rollup_buckets table), summaries, day-first keys;
# 3: sites, nodes.site_idx and site_rollups (pairs between sites folded at rollup time)
SCHEMA_VERSION = 3

ROLLUP_COLUMNS = """(
    day INTEGER NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL,
    count INTEGER NOT NULL, lost INTEGER NOT NULL, sum REAL NOT NULL,
    sumsq REAL NOT NULL, min_us INTEGER, max_us INTEGER, hist BLOB,
    PRIMARY KEY (day, src, dst)) WITHOUT ROWID"""
ROLLUPS_V2 = "CREATE TABLE rollups " + ROLLUP_COLUMNS
JOB_PROGRESS = """CREATE TABLE job_progress (
    job_id INTEGER NOT NULL, node_idx INTEGER NOT NULL, plan_id TEXT NOT NULL, rank INTEGER,
    steps INTEGER NOT NULL, total_steps INTEGER NOT NULL, iteration_s REAL NOT NULL,
    iteration_p90_s REAL NOT NULL, compute_s REAL NOT NULL, communication_s REAL NOT NULL,
    samples INTEGER NOT NULL, updated_ms INTEGER NOT NULL, received_ms INTEGER NOT NULL,
    wall_iteration_s REAL NOT NULL DEFAULT 0, wall_steps INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, node_idx)) WITHOUT ROWID"""
SITE_ROLLUPS = "CREATE TABLE site_rollups " + ROLLUP_COLUMNS

# (table, column, declaration) of the columns a table gained after it was first made, in the
# order they came: a store of an older planner lacks them, and its first writable opening adds
# them (the check of a file's tables, ``not_a_store``, lets them be missing).
ADDED_COLUMNS = (
    ("nodes", "clock_skew_ms", "INTEGER"),
    ("nodes", "gpus_declared", "INTEGER NOT NULL DEFAULT 0"),       # 1: from declared_gpus
    ("nodes", "site_idx", "INTEGER"),                               # schema 3
    ("jobs", "stages_json", "TEXT"),                                # a placed job's stages (JSON)
    ("jobs", "failures", "INTEGER NOT NULL DEFAULT 0"),   # restarts after its own ranks failed
    ("jobs", "fences", "INTEGER NOT NULL DEFAULT 0"),     # restarts after a rank was fenced
    ("nodes", "launch_exit_cause", "TEXT NOT NULL DEFAULT ''"),     # '' or 'fenced'
    ("nodes", "throughput_port", "INTEGER NOT NULL DEFAULT 0"),     # 0: takes no throughput tests
    ("nodes", "allowed_commands_json", "TEXT"),                     # NULL: not reported
    # The wall clock a step over whole rounds (0: not reported, as older agents do).
    ("job_progress", "wall_iteration_s", "REAL NOT NULL DEFAULT 0"),
    ("job_progress", "wall_steps", "INTEGER NOT NULL DEFAULT 0"),
    ("job_ranks", "exit_cause", "TEXT NOT NULL DEFAULT ''"),        # '' (its own) or 'fenced'
)
# What schema 1 had otherwise (migrated by Database._migrate_from_1): rollups with min and max
# (not min_us, max_us, hist), a rollup_buckets table, batches without last_summary_id.
SCHEMA_1_LACKS = {"rollups": {"min_us", "max_us", "hist"}, "batches": {"last_summary_id"}}
SCHEMA_1_TABLES = {"rollup_buckets"}

# Adds a day's figures into its rollup row; "excluded" is the row being inserted.
ROLLUP_UPSERT = """ON CONFLICT(day, src, dst) DO UPDATE SET
    count = count + excluded.count, lost = lost + excluded.lost,
    sum = sum + excluded.sum, sumsq = sumsq + excluded.sumsq,
    min_us = min(coalesce(min_us, excluded.min_us), coalesce(excluded.min_us, min_us)),
    max_us = max(coalesce(max_us, excluded.max_us), coalesce(excluded.max_us, max_us)),
    hist = hist_merge(hist, excluded.hist)"""

# A rollup row of nodes a and b (joined from nodes) that belongs to a site pair.
BETWEEN_SITES = "a.site_idx IS NOT NULL AND b.site_idx IS NOT NULL AND a.site_idx != b.site_idx"


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


@functools.cache
def _planner_columns() -> dict[str, tuple[str, ...]]:
    """{table: its columns in order} of a store this planner makes."""
    with Database(":memory:") as fresh:
        return {table: tuple(row[1] for row in fresh.conn.execute(
                    f"PRAGMA main.table_info({table!r})")) for table in columns(fresh.conn)}


def planner_tables() -> dict[str, set[str]]:
    """{table: its columns} of a store this planner makes."""
    return {table: set(names) for table, names in _planner_columns().items()}


def _required(table: str) -> list[str]:
    """The columns of ``table`` every planner's store has had (a later one an older may lack),
    in the table's order."""
    later = {column for name, column, _ in ADDED_COLUMNS if name == table}
    later |= SCHEMA_1_LACKS.get(table, set())
    return [column for column in _planner_columns()[table] if column not in later]


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def refuse_foreign_file(path: str | os.PathLike) -> None:
    """InputError (the file left as it was) when ``path`` exists and is an SQLite file that is
    not a Hulk store: for what opens the file before the store does (the credential table)."""
    path = str(path)
    if path == ":memory:" or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        return      # the store's own opening says what is wrong
    try:
        why = not_a_store(conn)
    except sqlite3.DatabaseError:
        return
    finally:
        conn.close()
    if why is not None:
        raise InputError(f"not a Hulk store: {why} ({EXPECTED})", path=path)


def not_a_store(conn: sqlite3.Connection) -> str | None:
    """Why the SQLite file open on ``conn`` is not a Hulk store, in words (another program's
    database, tables named like the planner's without its columns); None for a store of any
    schema version (an older one's tables as they were, to be migrated), one holding only the
    credential tables `enroll` makes, and a file with no tables yet (a new store). Reads only:
    the caller refuses the file before anything is written into it."""
    objects = conn.execute("SELECT type, name FROM main.sqlite_master WHERE type IN ('table', "
                           "'view', 'trigger') AND name NOT LIKE 'sqlite_%'").fetchall()
    if not objects:
        return None
    ours, have = planner_tables(), columns(conn)
    for kind, name in objects:
        if kind != "table" and name in ours:
            return f"{name} is a {kind}, not the planner's table"
    for table in have:
        if table in ours:
            missing = [column for column in _required(table) if column not in have[table]]
            if missing:
                word = "column" if len(missing) == 1 else "columns"
                return f"table {table} has no {word} {_some(missing)}"
    if "meta" not in have:
        # serve's security tables (planner/security: hulk_credentials, hulk_broker_users) may
        # come first: `enroll` before the first serve.
        if all(name.startswith("hulk_") for _, name in objects):
            return None
        foreign = [name for _, name in objects
                   if name not in ours and name not in SCHEMA_1_TABLES
                   and not name.startswith("hulk_")]
        return ("no meta table with the planner's schema version"
                + (f", and another program's tables: {_some(foreign)}" if foreign else ""))
    version = _schema_version(conn)
    if version is None:
        return "table meta holds no schema_version"
    if not version.isdigit() or int(version) < 1:
        return f"schema version {version!r} in table meta"
    return None


def _schema_version(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return None if row is None else str(row[0])


FULL_BELOW_BYTES = 1 << 20


def _room_left(path: str, exc: sqlite3.Error) -> str:
    """For SQLite's words for a failed write ("disk I/O error", "database or disk is full"):
    the cause where it is a full file system (a -shm or -wal that finds no room reads as an
    I/O error); "" otherwise."""
    if path == ":memory:" or not any(w in str(exc) for w in ("disk I/O error", "disk is full")):
        return ""
    try:
        fs = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return ""
    free = fs.f_bavail * fs.f_frsize
    return f" (its file system is full: {free // 1024} KiB free)" if free < FULL_BELOW_BYTES else ""


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
    """One connection to the planner's SQLite file, its schema created when missing (or, with
    ``read_only``, checked and never changed). One instance per thread of use (sqlite
    connections are not shared)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL",
                 busy_timeout_s: float = 30.0, per_pair_up_to: int = PER_PAIR_UP_TO,
                 read_only: bool = False):
        self.path = str(path)
        # Fleets of at most this many nodes keep every pair's rollups; larger ones fold pairs
        # between two sites into site pairs.
        self.per_pair_up_to = per_pair_up_to
        self.read_only = read_only
        # How other connections open the file to read beside this one.
        self.read_uri = read_uri(self.path)
        # True once this connection reads TEMP views other connections cannot see.
        self.overlaid = False
        # What a read-only file lacks of this planner's schema (None: nothing).
        self.behind: str | None = None
        self._lock = threading.RLock()
        if read_only:
            self._open_read_only(busy_timeout_s)
            return
        with self._errors("open"):
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=busy_timeout_s)
            try:
                self.conn = conn
                if self.path != ":memory:":
                    self._refuse_foreign()   # before anything is written: mode, WAL, tables
                private_file(self.path)
                add_histogram_functions(conn)
                self.db = sqlite_utils.Database(conn)
                self.db.execute("PRAGMA journal_mode=WAL")
                # NORMAL in WAL mode survives a crash of the process (not of the OS), and is fast.
                self.db.execute(f"PRAGMA synchronous={synchronous}")
                self.db.execute("PRAGMA foreign_keys=OFF")
                self._create_schema()
            except BaseException:
                conn.close()   # a failed opening keeps no file open
                raise

    # ------------------------------------------------------------------------------ plumbing

    def _refuse_foreign(self) -> None:
        """InputError for a file that is not a Hulk store, StoreError for a store of a newer
        planner; both leave the file as it was (only read so far)."""
        why = not_a_store(self.conn)
        if why is not None:
            raise InputError(f"not a Hulk store: {why} ({EXPECTED})", path=self.path)
        version = _schema_version(self.conn) if "meta" in columns(self.conn) else None
        if version is not None and int(version) > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {version}, this planner reads "
                             f"{SCHEMA_VERSION} (a store of a newer planner: left as it is)")

    def _open_read_only(self, busy_timeout_s: float) -> None:
        self.conn, self.read_uri = connect_read_only(self.path, busy_timeout_s)
        try:
            with self._errors("open"):
                add_histogram_functions(self.conn)
                self.db = sqlite_utils.Database(self.conn)
                self.conn.execute("BEGIN")   # every read of this opening sees one snapshot
                tables = columns(self.conn)
                if "meta" not in tables:
                    raise InputError(f"not a Hulk store: an SQLite file without the planner's "
                                     f"tables ({EXPECTED})", path=self.path)
                why = not_a_store(self.conn)
                if why is not None:
                    raise InputError(f"not a Hulk store: {why} ({EXPECTED})", path=self.path)
                version = _schema_version(self.conn) or "0"   # digits from 1 (not_a_store)
                if int(version) > SCHEMA_VERSION:
                    raise StoreError(f"{self.path}: schema version {version}, this planner "
                                     f"reads {SCHEMA_VERSION}")
                if int(version) < SCHEMA_VERSION:
                    self.behind = f"schema version {version}, this planner reads {SCHEMA_VERSION}"
                else:
                    self.behind = schema_gap(tables, planner_tables())
        except BaseException:
            self.conn.close()
            raise

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            if self.behind and "no such" in str(exc):
                raise StoreError(
                    f"{self.path}: a store of an older planner ({self.behind}); this command "
                    f"only reads and never migrates: start `hulk-planner serve --db {self.path}` "
                    f"of this version once (it migrates the store), then retry") from exc
            raise StoreError(f"{self.path}: store failed during {what}: {exc}"
                             f"{_room_left(self.path, exc)}") from exc

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[sqlite3.Connection]:
        """The connection for reads outside a transaction (under the lock, errors converted)."""
        with self._lock, self._errors(what):
            yield self.conn

    @contextlib.contextmanager
    def transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: all or nothing."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only, cannot {what}")
        with self._lock, self._errors(what):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException:
                # A full disk can end the transaction itself, or leave a failed COMMIT's open.
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

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
            if "sites" not in db.table_names():
                db.execute("CREATE TABLE sites (idx INTEGER PRIMARY KEY, name TEXT NOT NULL "
                           "UNIQUE)")
            if "site_rollups" not in db.table_names():
                db.execute(SITE_ROLLUPS)
            if "rejected" not in db.table_names():
                db.execute("""CREATE TABLE rejected (
                    node_idx INTEGER NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,
                    last_ms INTEGER NOT NULL, PRIMARY KEY (node_idx, reason)) WITHOUT ROWID""")
            if "imported_links" not in db.table_names():
                db.execute("""CREATE TABLE imported_links (
                    src INTEGER NOT NULL, dst INTEGER NOT NULL, rtt_ms REAL NOT NULL,
                    bandwidth_gbps REAL, loss REAL NOT NULL, samples INTEGER NOT NULL,
                    imported_ms INTEGER NOT NULL, PRIMARY KEY (src, dst)) WITHOUT ROWID""")
            if "jobs" not in db.table_names():
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
            if "throughput_scheduled" not in db.table_names():
                db.execute("""CREATE TABLE throughput_scheduled (
                    test_id TEXT PRIMARY KEY, src INTEGER NOT NULL, dst INTEGER NOT NULL,
                    src_site INTEGER, dst_site INTEGER, start_ms INTEGER NOT NULL,
                    expected_bytes REAL NOT NULL)""")
                db.execute("CREATE INDEX throughput_scheduled_start ON "
                           "throughput_scheduled(start_ms)")
            if "throughput_tests" not in db.table_names():
                db.execute("""CREATE TABLE throughput_tests (
                    test_id TEXT PRIMARY KEY, src INTEGER NOT NULL, dst INTEGER NOT NULL,
                    start_ms INTEGER NOT NULL, duration_s REAL NOT NULL, bytes INTEGER NOT NULL,
                    streams INTEGER NOT NULL, gbps REAL NOT NULL, ok INTEGER NOT NULL,
                    detail TEXT NOT NULL DEFAULT '', received_ms INTEGER NOT NULL)""")
            if "job_progress" not in db.table_names():
                db.execute(JOB_PROGRESS)
            if "placement_seq" not in db.table_names():   # the last placement seq per node
                db.execute("CREATE TABLE placement_seq (node_id TEXT PRIMARY KEY, "
                           "seq INTEGER NOT NULL) WITHOUT ROWID")
            if "job_ranks" not in db.table_names():
                db.execute(JOB_RANKS)
            # Columns added to a table after it was first made, where an older store lacks them.
            for table, column, declaration in ADDED_COLUMNS:
                if column not in db[table].columns_dict:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            if self.meta("schema_version") == "1":
                self._migrate_from_1(self.conn)
            if self.meta("schema_version") == "2":
                self._migrate_from_2(self.conn)
        version = self.meta("schema_version")
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
        self.set_meta(conn, "schema_version", 2)
        log.info("%s: store migrated from schema 1 to 2 (histograms inside rollups, "
                 "per-round summaries)", self.path)

    def _migrate_from_2(self, conn: sqlite3.Connection) -> None:
        """Schema 2 -> 3 in place, inside the schema transaction (the sites and site_rollups
        tables and nodes.site_idx are created above): every node gets its site from its city,
        and in a fleet above the per-pair size the rollups between two sites are folded into
        site_rollups (the same rule as new measurements follow)."""
        rows = conn.execute("SELECT idx, city FROM nodes").fetchall()
        for idx, city in rows:
            conn.execute("UPDATE nodes SET site_idx = ? WHERE idx = ?",
                         (self.site_index(conn, site_key(city)), idx))
        moved = self.fold_node_pairs_between_sites(conn)
        self.set_meta(conn, "schema_version", 3)
        log.info("%s: store migrated from schema 2 to 3 (%d nodes given sites, %d rollups "
                 "between sites folded into site rollups)", self.path, len(rows), moved)

    # -------------------------------------------------------------------------------- sites

    def folds_sites(self, conn: sqlite3.Connection) -> bool:
        """Whether pairs between two sites are kept as site pairs (the fleet is large)."""
        return conn.execute("SELECT count(*) FROM nodes").fetchone()[0] > self.per_pair_up_to

    @staticmethod
    def site_index(conn: sqlite3.Connection, name: str | None) -> int | None:
        """The sites row of ``name`` (created when new); None for no site."""
        if name is None:
            return None
        conn.execute("INSERT OR IGNORE INTO sites(name) VALUES (?)", (name,))
        return conn.execute("SELECT idx FROM sites WHERE name = ?", (name,)).fetchone()[0]

    def fold_node_pairs_between_sites(self, conn: sqlite3.Connection) -> int:
        """In a large fleet, move node-pair rollups between two sites (kept from when the fleet
        was small, or from before schema 3) into their site pair's rollups, day by day with
        exact sums; returns how many node-pair rows left."""
        if not self.folds_sites(conn):
            return 0
        between = f"""FROM rollups r JOIN nodes a ON a.idx = r.src JOIN nodes b ON b.idx = r.dst
                      WHERE {BETWEEN_SITES}"""
        if conn.execute(f"SELECT 1 {between} LIMIT 1").fetchone() is None:
            return 0
        conn.execute(f"""INSERT INTO site_rollups(day, src, dst, count, lost, sum, sumsq, min_us,
                                                  max_us, hist)
            SELECT r.day, a.site_idx, b.site_idx, sum(r.count), sum(r.lost), total(r.sum),
                   total(r.sumsq), min(r.min_us), max(r.max_us), hist_sum(r.hist)
            {between} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 {ROLLUP_UPSERT}""")
        return conn.execute(f"""DELETE FROM rollups WHERE (day, src, dst) IN
            (SELECT r.day, r.src, r.dst {between})""").rowcount

    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, conn: sqlite3.Connection, key: str, value: Any) -> None:
        conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, str(value)))
