"""The planner's store: what serve, the commands and recovery read and write in the SQLite file.

Ingest only appends raw samples and per-round summaries (one transaction per batch,
executemany). ``rollup_pending`` folds samples and summaries above their rowid watermarks into
the daily rollups in one transaction, so each is counted exactly once whenever it arrives (a
spooled one from yesterday lands in yesterday). Window statistics call it first, so they always
include everything stored. Folded summaries leave after ``summary_minutes`` (a 10,000-server
fleet sends about 10,000 a second); rollups stay ``rollup_days``.

Opened ``read_only`` (the commands that only read) nothing is written: what serve has not yet
folded is folded into TEMP tables of the connection, under TEMP views that stand in for the
rollup tables, so reads still include everything stored.

Methods take and return values (the wire records where they mean the same thing, frozen
records for nodes and jobs); the file, its tables and transactions are
``planner.service.database``; sqlite errors become ``hulk.errors.StoreError``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from hulk.wire import histogram
from planner.core.site_pairs import PER_PAIR_UP_TO
from planner.service.database import (BETWEEN_SITES, ROLLUP_COLUMNS, ROLLUP_UPSERT as _UPSERT,
                                      Database)
from planner.service.job_progress import JobProgress
from planner.service.job_records import JobRecords
from planner.service.node_rows import NodeRef, NodeRows
from planner.service.rollup_reads import DAY_MS, PairRollup, RollupReads  # noqa: F401 (re-exported)
from planner.service.throughput_store import ThroughputRecords

MIN_ROLLUP_DAYS = 90


def now_ms() -> int:
    return int(time.time() * 1000)


# Raw sample row as stored: (src idx, dst idx, sent_ms, kind, payload, lost, rtt_ms, bucket).
SampleRow = tuple[int, int, int, int, int, int, float | None, int | None]
# Summary row as stored: (src idx, dst idx, round_ms, kind, count, lost, sum, sum of squares,
# min us, max us, histogram bytes); min, max and histogram None when every packet was lost.
SummaryRow = tuple[int, int, int, int, int, int, float, float, int | None, int | None,
                   bytes | None]


def batch_key(batch_id: str) -> str | bytes:
    """How a batch id is kept: the 32 lower-case hex digits agents send (a uuid4) as their 16
    bytes, half the room in the table and again in its index; any other id as it is."""
    if len(batch_id) == 32:
        try:
            key = bytes.fromhex(batch_id)
        except ValueError:
            return batch_id
        if key.hex() == batch_id:
            return key
    return batch_id


def micros(rtt_ms: float) -> int:
    """An RTT as the whole microseconds rollups keep its min and max in."""
    return int(round(rtt_ms * 1000.0))


class Store:
    """The planner's store, by composition: ``database`` (the file, schema, transactions),
    ``node_rows`` (registrations, heartbeats), ``jobs`` (job records), ``progress`` (jobs'
    measured step times), ``rollups`` (window reads) and ``throughput`` (throughput tests and
    their results), each given what it needs; ingest's writes and the rollup fold are here. The
    parts' methods are offered here under their own names. One instance per thread of use
    (sqlite connections are not shared). ``read_only``: see the module's docstring."""

    def __init__(self, path: str | Path, *, raw_days: int = 7, rollup_days: int = MIN_ROLLUP_DAYS,
                 synchronous: str = "NORMAL", busy_timeout_s: float = 30.0,
                 clock: Callable[[], int] = now_ms, summary_minutes: float = 10.0,
                 per_pair_up_to: int = PER_PAIR_UP_TO, read_only: bool = False):
        self.raw_days = raw_days
        self.summary_minutes = summary_minutes
        self.rollup_days = max(rollup_days, MIN_ROLLUP_DAYS)
        self.clock = clock
        self.database = Database(path, synchronous=synchronous, busy_timeout_s=busy_timeout_s,
                                 per_pair_up_to=per_pair_up_to, read_only=read_only)
        self._read_fold_done = False
        self.node_rows = NodeRows(self.database, clock)
        self.jobs = JobRecords(self.database, clock)
        self.rollups = RollupReads(self.database, clock, self.rollup_pending)
        self.progress = JobProgress(self.database, clock, self.jobs.job_records)
        self.throughput = ThroughputRecords(self.database, clock)
        # The parts' methods callers use, offered under their own names.
        nodes, jobs, rollups = self.node_rows, self.jobs, self.rollups
        self.register = nodes.register
        self.heartbeat = nodes.heartbeat
        self.node_refs = nodes.node_refs
        self.node_records = nodes.node_records
        self.nodes = nodes.nodes
        self.allowed_commands = nodes.allowed_commands
        self.peers = nodes.peers
        self.probe_members = nodes.probe_members
        self.clock_skews = nodes.clock_skews
        self.submit_job = jobs.submit_job
        self.submit_jobs = jobs.submit_jobs
        self.update_job = jobs.update_job
        self.job_record = jobs.job_record
        self.job_by_name = jobs.job_by_name
        self.job_records = jobs.job_records
        self.rank_progress = self.progress.rank_progress
        self.job_iterations = self.progress.job_iterations
        self.daily_rollups = rollups.daily_rollups
        self.window_rollups = rollups.window_rollups
        self.site_window_rollups = rollups.site_window_rollups
        self.window_totals = rollups.window_totals
        self.site_window_totals = rollups.site_window_totals
        self.throughput_by_site_pair = self.throughput.throughput_by_site_pair

    @property
    def path(self) -> str:
        return self.database.path

    @property
    def conn(self) -> sqlite3.Connection:
        return self.database.conn

    def transaction(self, what: str) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self.database.transaction(what)

    def close(self) -> None:
        self.database.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ ingest

    def store_batch(self, node: NodeRef, batch_id: str, rows: Sequence[SampleRow],
                    rejected: dict[str, int] | None = None, spool_dropped: int = 0,
                    summaries: Sequence[SummaryRow] = (), throughput: int = 0
                    ) -> tuple[int, int, bool]:
        """Store one Report batch (raw samples and summaries) atomically; returns (accepted
        records, rejected records, duplicate). ``throughput``: the batch's throughput results
        accepted (stored apart, by test id), counted in with the rest.

        A batch id already stored for this node stores nothing and returns the first answer."""
        t = self.clock()
        n_rejected = sum((rejected or {}).values())
        accepted = len(rows) + len(summaries) + throughput
        text_id, batch_id = batch_id, batch_key(batch_id)
        with self.database.transaction("store batch") as conn:
            if batch_id is not text_id:  # the same id may be kept as its text
                first = conn.execute("SELECT accepted, rejected FROM batches WHERE node_idx = ? "
                                     "AND batch_id = ?", (node.idx, text_id)).fetchone()
                if first is not None:
                    conn.execute("UPDATE nodes SET last_seen_ms = ? WHERE idx = ?", (t, node.idx))
                    return first[0], first[1], True
            cur = conn.execute("INSERT OR IGNORE INTO batches(node_idx, batch_id, received_ms, "
                               "accepted, rejected) VALUES (?, ?, ?, ?, ?)",
                               (node.idx, batch_id, t, accepted, n_rejected))
            if cur.rowcount == 0:
                first = conn.execute("SELECT accepted, rejected FROM batches WHERE node_idx = ? "
                                     "AND batch_id = ?", (node.idx, batch_id)).fetchone()
                conn.execute("UPDATE nodes SET last_seen_ms = ? WHERE idx = ?", (t, node.idx))
                return first[0], first[1], True
            if rows:
                conn.executemany("INSERT INTO samples(src, dst, sent_ms, kind, payload, lost, "
                                 "rtt_ms, bucket) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                conn.execute("UPDATE batches SET last_sample_id = ? WHERE node_idx = ? AND "
                             "batch_id = ?", (last, node.idx, batch_id))
            if summaries:
                conn.executemany("INSERT INTO summaries(src, dst, round_ms, kind, count, lost, "
                                 "sum, sumsq, min_us, max_us, hist) VALUES (?, ?, ?, ?, ?, ?, ?, ?, "
                                 "?, ?, ?)", summaries)
                last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                conn.execute("UPDATE batches SET last_summary_id = ? WHERE node_idx = ? AND "
                             "batch_id = ?", (last, node.idx, batch_id))
            for reason, count in (rejected or {}).items():
                if count:
                    conn.execute("INSERT INTO rejected(node_idx, reason, count, last_ms) "
                                 "VALUES (?, ?, ?, ?) ON CONFLICT(node_idx, reason) DO UPDATE "
                                 "SET count = count + excluded.count, last_ms = excluded.last_ms",
                                 (node.idx, reason, count, t))
            conn.execute("UPDATE nodes SET last_seen_ms = ?, spool_dropped = "
                         "max(coalesce(spool_dropped, 0), ?) WHERE idx = ?",
                         (t, spool_dropped, node.idx))
        return accepted, n_rejected, False

    def count_rejected(self, node: NodeRef, reason: str, count: int) -> None:
        """Count samples of a batch rejected as a whole (nothing else of it is stored)."""
        with self.database.transaction("count rejected") as conn:
            conn.execute("INSERT INTO rejected(node_idx, reason, count, last_ms) VALUES "
                         "(?, ?, ?, ?) ON CONFLICT(node_idx, reason) DO UPDATE SET "
                         "count = count + excluded.count, last_ms = excluded.last_ms",
                         (node.idx, reason, count, self.clock()))

    def rejected_counts(self) -> dict[str, dict[str, int]]:
        """{node id: {reason: count}}."""
        with self.database.reading("read rejected") as conn:
            rows = conn.execute("SELECT n.id, r.reason, r.count FROM rejected r "
                                     "JOIN nodes n ON n.idx = r.node_idx").fetchall()
        out: dict[str, dict[str, int]] = {}
        for node_id, reason, count in rows:
            out.setdefault(node_id, {})[reason] = count
        return out

    def sample_count(self) -> int:
        """Raw samples held (the raw table; pruned after raw_days)."""
        with self.database.reading("count samples") as conn:
            return conn.execute("SELECT count(*) FROM samples").fetchone()[0]

    def raw_samples(self, src: str | None = None, dst: str | None = None) -> list[dict[str, Any]]:
        """Raw samples as dicts with node ids (for tests and debugging; not for big tables)."""
        where, args = [], []
        if src is not None:
            where.append("a.id = ?")
            args.append(src)
        if dst is not None:
            where.append("b.id = ?")
            args.append(dst)
        sql = ("SELECT a.id AS src, b.id AS dst, s.sent_ms, s.kind, s.payload, s.lost, s.rtt_ms "
               "FROM samples s JOIN nodes a ON a.idx = s.src JOIN nodes b ON b.idx = s.dst"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY s.id")
        with self.database.reading("read samples"):
            return list(self.database.db.query(sql, args))

    # ----------------------------------------------------------------------------- rollups

    def rollup_pending(self) -> int:
        """Fold every raw sample and summary not yet rolled up into the daily rollups, and drop
        summaries folded more than ``summary_minutes`` ago; returns how many were folded."""
        if self.database.read_only:
            return self._fold_for_reading()
        with self.database.transaction("rollup") as conn:
            n = self._fold_samples(conn) + self._fold_summaries(conn)
            self._drop_old_summaries(conn)
        return n

    def _fold_samples(self, conn) -> int:
        mark = int(self.database.meta("rolled_through", "0"))
        top = conn.execute("SELECT max(id) FROM samples").fetchone()[0]
        if top is None or top <= mark:
            return 0
        self._fold(conn, "samples", "sent_ms", _SAMPLE_FIGURES, mark, top)
        n = conn.execute("SELECT count(*) FROM samples WHERE id > ? AND id <= ?",
                         (mark, top)).fetchone()[0]
        self.database.set_meta(conn, "rolled_through", top)
        return n

    def _fold_summaries(self, conn) -> int:
        mark = int(self.database.meta("summaries_rolled_through", "0"))
        top = conn.execute("SELECT max(id) FROM summaries").fetchone()[0]
        if top is None or top <= mark:
            return 0
        self._fold(conn, "summaries", "round_ms", _SUMMARY_FIGURES, mark, top)
        self.database.set_meta(conn, "summaries_rolled_through", top)
        return conn.execute("SELECT count(*) FROM summaries WHERE id > ? AND id <= ?",
                            (mark, top)).fetchone()[0]

    def _fold_for_reading(self) -> int:
        """The fold of a read-only opening, into TEMP tables pending_rollups and
        pending_site_rollups (each row merged with the file's row of its key), under TEMP views
        named rollups and site_rollups that shadow the file's tables. Its reads see one
        snapshot, so this is done once."""
        if self._read_fold_done:
            return 0
        self._read_fold_done = True
        meta = self.database.meta
        with self.database.reading("fold for reading") as conn:
            parts = [(table, column, figures, int(meta(mark, "0")),
                      conn.execute(f"SELECT max(id) FROM {table}").fetchone()[0])
                     for table, column, figures, mark in (
                         ("samples", "sent_ms", _SAMPLE_FIGURES, "rolled_through"),
                         ("summaries", "round_ms", _SUMMARY_FIGURES, "summaries_rolled_through"))]
            parts = [p for p in parts if p[4] is not None and p[4] > p[3]]
            if not parts:
                return 0
            for name in ("rollups", "site_rollups"):
                conn.execute(f"CREATE TEMP TABLE pending_{name} {ROLLUP_COLUMNS}")
            for table, column, figures, mark, top in parts:
                self._fold(conn, table, column, figures, mark, top, into="temp.pending_")
            for name in ("rollups", "site_rollups"):
                conn.execute(f"""INSERT INTO temp.pending_{name} SELECT m.* FROM
                    temp.pending_{name} p JOIN main.{name} m USING (day, src, dst) WHERE true
                    {_UPSERT}""")
                conn.execute(f"""CREATE TEMP VIEW {name} AS SELECT * FROM main.{name} r
                    WHERE NOT EXISTS (SELECT 1 FROM temp.pending_{name} p WHERE p.day = r.day
                                      AND p.src = r.src AND p.dst = r.dst)
                    UNION ALL SELECT * FROM temp.pending_{name}""")
            self.database.overlaid = True
            return sum(conn.execute(f"SELECT count(*) FROM {table} WHERE id > ? AND id <= ?",
                                    (mark, top)).fetchone()[0] for table, _, _, mark, top in parts)

    def _fold(self, conn, table: str, time_column: str, figures: str, mark: int,
              top: int, into: str = "") -> None:
        """Add the rows of ``table`` with ids in (mark, top] into the day's rollups: per node
        pair, or (a large fleet, two different sites) per site pair; ``into``: a prefix of the
        rollup tables' names."""
        day = f"s.{time_column} / {DAY_MS}"
        columns = "(day, src, dst, count, lost, sum, sumsq, min_us, max_us, hist)"
        if not self.database.folds_sites(conn):
            conn.execute(f"""INSERT INTO {into}rollups{columns}
                SELECT {day}, s.src, s.dst, {figures} FROM {table} s
                WHERE s.id > ? AND s.id <= ? GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 {_UPSERT}""",
                         (mark, top))
            return
        rows = f"""FROM {table} s JOIN nodes a ON a.idx = s.src JOIN nodes b ON b.idx = s.dst
                   WHERE s.id > ? AND s.id <= ?"""
        conn.execute(f"""INSERT INTO {into}rollups{columns}
            SELECT {day}, s.src, s.dst, {figures} {rows} AND NOT ({BETWEEN_SITES})
            GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 {_UPSERT}""", (mark, top))
        conn.execute(f"""INSERT INTO {into}site_rollups{columns}
            SELECT {day}, a.site_idx, b.site_idx, {figures} {rows} AND {BETWEEN_SITES}
            GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 {_UPSERT}""", (mark, top))

    def _drop_old_summaries(self, conn) -> None:
        """Summaries that arrived more than summary_minutes ago and are folded leave."""
        cutoff = self.clock() - int(self.summary_minutes * 60_000)
        # Only batches since the last pass: a range of the received_ms index, not the table.
        since = int(self.database.meta("summaries_dropped_at", "0"))
        if cutoff <= since:
            return
        mark = int(self.database.meta("summaries_rolled_through", "0"))
        old = conn.execute("SELECT max(last_summary_id) FROM batches WHERE received_ms >= ? "
                           "AND received_ms < ?", (since, cutoff)).fetchone()[0] or 0
        through = min(old, mark)
        if through > int(self.database.meta("summaries_dropped_through", "0")):
            conn.execute("DELETE FROM summaries WHERE id <= ?", (through,))
            self.database.set_meta(conn, "summaries_dropped_through", through)
        if old <= mark:  # else the rest waits for the fold, and is looked at again
            self.database.set_meta(conn, "summaries_dropped_at", cutoff)

    def summary_count(self) -> int:
        """Raw summaries held (kept summary_minutes once folded)."""
        with self.database.reading("count summaries") as conn:
            return conn.execute("SELECT count(*) FROM summaries").fetchone()[0]

    def raw_summaries(self) -> list[dict[str, Any]]:
        """Raw summaries as dicts with node ids and decoded histograms (tests, debugging)."""
        sql = ("SELECT a.id AS src, b.id AS dst, s.round_ms, s.kind, s.count, s.lost, s.sum, "
               "s.sumsq, s.min_us / 1000.0 AS min, s.max_us / 1000.0 AS max, s.hist "
               "FROM summaries s JOIN nodes a ON a.idx = s.src "
               "JOIN nodes b ON b.idx = s.dst ORDER BY s.id")
        with self.database.reading("read summaries"):
            rows = list(self.database.db.query(sql))
        for r in rows:
            r["buckets"] = histogram.decode(r.pop("hist"))
        return rows

    def prune(self) -> dict[str, int]:
        """Drop raw samples that arrived more than raw_days ago (once rolled up), rollups older
        than rollup_days and batch ids older than raw_days plus a day.

        Batch ids outlive the samples by a day because ingest refuses samples taken more than
        raw_days ago: a batch retried later than that holds only such samples, so it can never
        be counted twice."""
        self.rollup_pending()
        t = self.clock()
        raw_cutoff = t - self.raw_days * DAY_MS
        day_cutoff = t // DAY_MS - self.rollup_days
        with self.database.transaction("prune") as conn:
            mark = int(self.database.meta("rolled_through", "0"))
            old = conn.execute("SELECT max(last_sample_id) FROM batches WHERE received_ms < ?",
                               (raw_cutoff,)).fetchone()[0] or 0
            samples = conn.execute("DELETE FROM samples WHERE id <= ?",
                                   (min(old, mark),)).rowcount
            rollups = conn.execute("DELETE FROM rollups WHERE day < ?", (day_cutoff,)).rowcount
            rollups += conn.execute("DELETE FROM site_rollups WHERE day < ?",
                                    (day_cutoff,)).rowcount
            # Pairs between sites kept from when the fleet was small join their site pairs.
            folded = self.database.fold_node_pairs_between_sites(conn)
            batches = conn.execute("DELETE FROM batches WHERE received_ms < ?",
                                   (raw_cutoff - DAY_MS,)).rowcount
            throughput = self.throughput.prune(conn)
        return {"samples": samples, "rollups": rollups, "batches": batches,
                "folded_into_site_pairs": folded, "throughput_tests": throughput}

    # ---------------------------------------------------------------------- imported fleets

    def import_fleet(self, fleet) -> dict[str, int]:
        """Store an imported Fleet (planner.core.fleet.Fleet) in one transaction: nodes are
        inserted or updated (agent registrations keep their own fields), links replace earlier
        imported links of the same pair."""
        t = self.clock()
        added = updated = 0
        with self.database.transaction("import fleet") as conn:
            for node in fleet.nodes:
                row = conn.execute("SELECT idx, source FROM nodes WHERE id = ?",
                                   (node.id,)).fetchone()
                values = {"city": node.city, "gpu_count": node.gpus, "gpu_name": node.gpu_name,
                          "compute_capability": node.compute_capability,
                          "memory_gb": node.memory_gb,
                          "site_idx": self.database.site_index(conn, node.site_key)}
                if node.latitude is not None:
                    values.update(latitude=node.latitude, longitude=node.longitude)
                if row is None:
                    values.update(id=node.id, source="import", first_seen_ms=t, gpus_json="[]",
                                  peers_version_seen=0)
                    conn.execute(f"INSERT INTO nodes ({', '.join(values)}) VALUES "
                                 f"({', '.join('?' * len(values))})", tuple(values.values()))
                    added += 1
                elif row[1] == "import":
                    conn.execute(f"UPDATE nodes SET {', '.join(f'{k} = ?' for k in values)} "
                                 "WHERE idx = ?", (*values.values(), row[0]))
                    updated += 1
            idx = dict(conn.execute("SELECT id, idx FROM nodes").fetchall())
            rows = [(idx[k.src], idx[k.dst], k.rtt_ms, k.bandwidth_gbps, k.loss, k.samples, t)
                    for k in fleet.links if not k.imputed and k.src != k.dst]
            conn.executemany("INSERT INTO imported_links(src, dst, rtt_ms, bandwidth_gbps, loss, "
                             "samples, imported_ms) VALUES (?, ?, ?, ?, ?, ?, ?) "
                             "ON CONFLICT(src, dst) DO UPDATE SET rtt_ms = excluded.rtt_ms, "
                             "bandwidth_gbps = excluded.bandwidth_gbps, loss = excluded.loss, "
                             "samples = excluded.samples, imported_ms = excluded.imported_ms",
                             rows)
        return {"nodes_added": added, "nodes_updated": updated, "links": len(rows)}

    def imported_links(self) -> list[dict[str, Any]]:
        with self.database.reading("read imported links"):
            return list(self.database.db.query(
                "SELECT a.id AS src, b.id AS dst, l.rtt_ms, l.bandwidth_gbps, l.loss, l.samples "
                "FROM imported_links l JOIN nodes a ON a.idx = l.src "
                "JOIN nodes b ON b.idx = l.dst ORDER BY a.id, b.id"))


# A rollup's figures from raw samples (s) and from per-round summaries (s).
_SAMPLE_FIGURES = """count(*), sum(s.lost),
    total(CASE WHEN s.lost = 0 THEN s.rtt_ms END),
    total(CASE WHEN s.lost = 0 THEN s.rtt_ms * s.rtt_ms END),
    min(CASE WHEN s.lost = 0 THEN CAST(round(s.rtt_ms * 1000) AS INTEGER) END),
    max(CASE WHEN s.lost = 0 THEN CAST(round(s.rtt_ms * 1000) AS INTEGER) END),
    hist_of(CASE WHEN s.lost = 0 THEN s.bucket END)"""
_SUMMARY_FIGURES = """sum(s.count), sum(s.lost), total(s.sum), total(s.sumsq), min(s.min_us),
    max(s.max_us), hist_sum(s.hist)"""
