"""The planner's SQLite store (sqlite-utils, WAL mode).

Tables:
  nodes           one row per server: registration (hostname, city, coordinates, agent version,
                  GPU inventory + reason, address, probe port), first/last seen, spool counters,
                  launch status; imported fleets' nodes too (source = 'import')
  batches         (node, batch id) of every stored Report: a retried batch is stored once
  samples         raw probe samples, kept ``raw_days`` (default 7)
  rollups         per ordered pair per UTC day: count, lost, sum, sum of squares, min, max
  rollup_buckets  per ordered pair per day: the log-spaced RTT histogram (planner.core.rollup)
  rejected        rejected-sample counters per node and reason
  imported_links  links of an imported fleet file (used where nothing was measured)
  meta            schema version, the rollup watermark, the peers version

Ingest only appends raw samples (one transaction per batch, executemany). ``rollup_pending``
folds samples above a rowid watermark into the daily rollups in one transaction, so every sample
is counted exactly once whenever it arrives (a spooled sample from yesterday lands in yesterday).
Window statistics call it first, so they always include everything stored.

Methods take and return plain values; sqlite errors become ``hulk.errors.StoreError``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlite_utils

from hulk.errors import NotFoundError, StoreError
from planner.core.rollup import DailyRollup

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DAY_MS = 86_400_000
MIN_ROLLUP_DAYS = 90


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    uuid: str = ""
    compute_capability: float = 0.0
    memory_bytes: int = 0


@dataclass(frozen=True)
class Registration:
    """What an agent tells the planner about itself."""

    node_id: str
    hostname: str = ""
    city: str | None = None
    latitude: float | None = None
    longitude: float | None = None
    agent_version: str = ""
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str = ""
    gpu_unavailable_reason: str = ""
    address: str = ""
    probe_port: int = 0


@dataclass(frozen=True)
class NodeRef:
    """What ingest needs per node: its row index and where it is."""

    idx: int
    id: str
    city: str | None
    latitude: float | None
    longitude: float | None


@dataclass(frozen=True)
class LaunchInfo:
    plan_id: str = ""
    job: str = ""
    state: str = ""
    exit_code: int = 0
    detail: str = ""
    changed_at_ms: int = 0


@dataclass
class PairRollup:
    """The merged rollup of one ordered pair over a window."""

    src: str
    dst: str
    rollup: DailyRollup = field(default_factory=DailyRollup)


# Raw sample row as stored: (src idx, dst idx, sent_ms, kind, payload, lost, rtt_ms, bucket).
SampleRow = tuple[int, int, int, int, int, int, float | None, int | None]


class Store:
    """The planner's store. One instance per thread of use (sqlite connections are not shared)."""

    def __init__(self, path: str | Path, *, raw_days: int = 7, rollup_days: int = MIN_ROLLUP_DAYS,
                 synchronous: str = "NORMAL", busy_timeout_s: float = 30.0,
                 clock=now_ms):
        self.path = str(path)
        self.raw_days = raw_days
        self.rollup_days = max(rollup_days, MIN_ROLLUP_DAYS)
        self.clock = clock
        self._lock = threading.RLock()
        with self._errors("open"):
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=busy_timeout_s)
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

    def __enter__(self) -> "Store":
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
                    last_sample_id INTEGER,
                    PRIMARY KEY (node_idx, batch_id)) WITHOUT ROWID""")
                db.execute("CREATE INDEX batches_received ON batches(received_ms)")
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
                db.execute("""CREATE TABLE rollups (
                    src INTEGER NOT NULL, dst INTEGER NOT NULL, day INTEGER NOT NULL,
                    count INTEGER NOT NULL, lost INTEGER NOT NULL, sum REAL NOT NULL,
                    sumsq REAL NOT NULL, min REAL, max REAL,
                    PRIMARY KEY (src, dst, day)) WITHOUT ROWID""")
                db.execute("CREATE INDEX rollups_day ON rollups(day)")
                db.execute("""CREATE TABLE rollup_buckets (
                    src INTEGER NOT NULL, dst INTEGER NOT NULL, day INTEGER NOT NULL,
                    bucket INTEGER NOT NULL, count INTEGER NOT NULL,
                    PRIMARY KEY (src, dst, day, bucket)) WITHOUT ROWID""")
            if "rejected" not in db.table_names():
                db.execute("""CREATE TABLE rejected (
                    node_idx INTEGER NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,
                    last_ms INTEGER NOT NULL, PRIMARY KEY (node_idx, reason)) WITHOUT ROWID""")
            if "imported_links" not in db.table_names():
                db.execute("""CREATE TABLE imported_links (
                    src INTEGER NOT NULL, dst INTEGER NOT NULL, rtt_ms REAL NOT NULL,
                    bandwidth_gbps REAL, loss REAL NOT NULL, samples INTEGER NOT NULL,
                    imported_ms INTEGER NOT NULL, PRIMARY KEY (src, dst)) WITHOUT ROWID""")
        version = self._meta("schema_version")
        if version != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: schema version {version}, this planner reads "
                             f"{SCHEMA_VERSION}")

    def _meta(self, key: str, default: str | None = None) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def _set_meta(self, conn: sqlite3.Connection, key: str, value: Any) -> None:
        conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, str(value)))

    # ------------------------------------------------------------------------------- nodes

    def register(self, reg: Registration) -> tuple[NodeRef, bool]:
        """Insert or update a node from its agent's registration; returns (node, peers changed
        for others). The peers version goes up when a node is new or moves address/port."""
        t = self.clock()
        gpus_json = json.dumps([g.__dict__ for g in reg.gpus])
        gpu_name, cc, memory_gb = _summarise_gpus(reg.gpus)
        with self.transaction("register") as conn:
            row = conn.execute("SELECT idx, address, probe_port FROM nodes WHERE id = ?",
                               (reg.node_id,)).fetchone()
            version = int(self._meta("peers_version", "0"))
            changed = row is None or row[1] != reg.address or row[2] != reg.probe_port
            if changed:
                version += 1
                self._set_meta(conn, "peers_version", version)
            values = {
                "id": reg.node_id, "source": "agent", "hostname": reg.hostname,
                "city": reg.city, "latitude": reg.latitude, "longitude": reg.longitude,
                "agent_version": reg.agent_version, "gpus_json": gpus_json,
                "gpu_unavailable_reason": reg.gpu_unavailable_reason,
                "driver_version": reg.driver_version, "gpu_count": len(reg.gpus),
                "gpu_name": gpu_name, "compute_capability": cc, "memory_gb": memory_gb,
                "address": reg.address, "probe_port": reg.probe_port, "last_seen_ms": t,
                "registered_ms": t, "peers_version_seen": version,
            }
            if row is None:
                values["first_seen_ms"] = t
                cols = ", ".join(values)
                conn.execute(f"INSERT INTO nodes ({cols}) VALUES ({', '.join('?' * len(values))})",
                             tuple(values.values()))
                idx = conn.execute("SELECT idx FROM nodes WHERE id = ?",
                                   (reg.node_id,)).fetchone()[0]
            else:
                idx = row[0]
                sets = ", ".join(f"{k} = ?" for k in values)
                conn.execute(f"UPDATE nodes SET {sets} WHERE idx = ?", (*values.values(), idx))
        return NodeRef(idx, reg.node_id, reg.city, reg.latitude, reg.longitude), changed

    def node_refs(self) -> dict[str, NodeRef]:
        with self._lock, self._errors("read nodes"):
            rows = self.conn.execute(
                "SELECT idx, id, city, latitude, longitude FROM nodes").fetchall()
        return {r[1]: NodeRef(r[0], r[1], r[2], r[3], r[4]) for r in rows}

    def peers(self, node_id: str) -> list[dict[str, Any]]:
        """Every other node registered by an agent: id, address, probe port."""
        with self._lock, self._errors("read peers"):
            rows = self.conn.execute(
                "SELECT id, address, probe_port FROM nodes WHERE id != ? AND source = 'agent' "
                "ORDER BY id", (node_id,)).fetchall()
        return [{"node_id": r[0], "address": r[1] or "", "probe_port": r[2] or 0} for r in rows]

    def heartbeat(self, node_id: str, *, spool_depth: int = 0, spool_dropped: int = 0,
                  launch: LaunchInfo | None = None) -> bool:
        """Record liveness; returns whether the node's peer list changed since it registered.
        Raises NotFoundError for a node the store does not know."""
        t = self.clock()
        with self.transaction("heartbeat") as conn:
            row = conn.execute("SELECT idx, peers_version_seen FROM nodes WHERE id = ?",
                               (node_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"node {node_id!r} is not registered")
            sets = {"last_seen_ms": t, "spool_depth": spool_depth}
            if launch is not None and launch.state:
                sets.update(launch_plan_id=launch.plan_id, launch_job=launch.job,
                            launch_state=launch.state, launch_exit_code=launch.exit_code,
                            launch_detail=launch.detail, launch_changed_ms=launch.changed_at_ms)
            assign = ", ".join(f"{k} = ?" for k in sets)
            conn.execute(f"UPDATE nodes SET {assign}, spool_dropped = "
                         "max(coalesce(spool_dropped, 0), ?) WHERE idx = ?",
                         (*sets.values(), spool_dropped, row[0]))
            version = int(self._meta("peers_version", "0"))
        return version > (row[1] or 0)

    def nodes(self) -> list[dict[str, Any]]:
        """Every node row as a plain dict (GPU list decoded)."""
        with self._lock, self._errors("read nodes"):
            rows = list(self.db.query("SELECT * FROM nodes ORDER BY idx"))
        for r in rows:
            r["gpus"] = json.loads(r.pop("gpus_json") or "[]")
        return rows

    # ------------------------------------------------------------------------------ ingest

    def store_batch(self, node: NodeRef, batch_id: str, rows: Sequence[SampleRow],
                    rejected: dict[str, int] | None = None, spool_dropped: int = 0
                    ) -> tuple[int, int, bool]:
        """Store one Report batch atomically; returns (accepted, rejected, duplicate).

        A batch id already stored for this node stores nothing and returns the first answer."""
        t = self.clock()
        n_rejected = sum((rejected or {}).values())
        with self.transaction("store batch") as conn:
            cur = conn.execute("INSERT OR IGNORE INTO batches(node_idx, batch_id, received_ms, "
                               "accepted, rejected) VALUES (?, ?, ?, ?, ?)",
                               (node.idx, batch_id, t, len(rows), n_rejected))
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
            for reason, count in (rejected or {}).items():
                if count:
                    conn.execute("INSERT INTO rejected(node_idx, reason, count, last_ms) "
                                 "VALUES (?, ?, ?, ?) ON CONFLICT(node_idx, reason) DO UPDATE "
                                 "SET count = count + excluded.count, last_ms = excluded.last_ms",
                                 (node.idx, reason, count, t))
            conn.execute("UPDATE nodes SET last_seen_ms = ?, spool_dropped = "
                         "max(coalesce(spool_dropped, 0), ?) WHERE idx = ?",
                         (t, spool_dropped, node.idx))
        return len(rows), n_rejected, False

    def count_rejected(self, node: NodeRef, reason: str, count: int) -> None:
        """Count samples of a batch rejected as a whole (nothing else of it is stored)."""
        with self.transaction("count rejected") as conn:
            conn.execute("INSERT INTO rejected(node_idx, reason, count, last_ms) VALUES "
                         "(?, ?, ?, ?) ON CONFLICT(node_idx, reason) DO UPDATE SET "
                         "count = count + excluded.count, last_ms = excluded.last_ms",
                         (node.idx, reason, count, self.clock()))

    def rejected_counts(self) -> dict[str, dict[str, int]]:
        """{node id: {reason: count}}."""
        with self._lock, self._errors("read rejected"):
            rows = self.conn.execute("SELECT n.id, r.reason, r.count FROM rejected r "
                                     "JOIN nodes n ON n.idx = r.node_idx").fetchall()
        out: dict[str, dict[str, int]] = {}
        for node_id, reason, count in rows:
            out.setdefault(node_id, {})[reason] = count
        return out

    def sample_count(self) -> int:
        """Raw samples held (the raw table; pruned after raw_days)."""
        with self._lock, self._errors("count samples"):
            return self.conn.execute("SELECT count(*) FROM samples").fetchone()[0]

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
        with self._lock, self._errors("read samples"):
            return list(self.db.query(sql, args))

    # ----------------------------------------------------------------------------- rollups

    def rollup_pending(self) -> int:
        """Fold every raw sample not yet rolled up into the daily rollups; returns how many."""
        with self.transaction("rollup") as conn:
            mark = int(self._meta("rolled_through", "0"))
            top = conn.execute("SELECT max(id) FROM samples").fetchone()[0]
            if top is None or top <= mark:
                return 0
            conn.execute(f"""
                INSERT INTO rollups(src, dst, day, count, lost, sum, sumsq, min, max)
                SELECT src, dst, sent_ms / {DAY_MS}, count(*), sum(lost),
                       total(CASE WHEN lost = 0 THEN rtt_ms END),
                       total(CASE WHEN lost = 0 THEN rtt_ms * rtt_ms END),
                       min(CASE WHEN lost = 0 THEN rtt_ms END),
                       max(CASE WHEN lost = 0 THEN rtt_ms END)
                FROM samples WHERE id > ? AND id <= ? GROUP BY src, dst, sent_ms / {DAY_MS}
                ON CONFLICT(src, dst, day) DO UPDATE SET
                    count = count + excluded.count, lost = lost + excluded.lost,
                    sum = sum + excluded.sum, sumsq = sumsq + excluded.sumsq,
                    min = min(coalesce(min, excluded.min), coalesce(excluded.min, min)),
                    max = max(coalesce(max, excluded.max), coalesce(excluded.max, max))""",
                         (mark, top))
            conn.execute(f"""
                INSERT INTO rollup_buckets(src, dst, day, bucket, count)
                SELECT src, dst, sent_ms / {DAY_MS}, bucket, count(*)
                FROM samples WHERE id > ? AND id <= ? AND lost = 0
                GROUP BY src, dst, sent_ms / {DAY_MS}, bucket
                ON CONFLICT(src, dst, day, bucket) DO UPDATE SET count = count + excluded.count""",
                         (mark, top))
            n = conn.execute("SELECT count(*) FROM samples WHERE id > ? AND id <= ?",
                             (mark, top)).fetchone()[0]
            self._set_meta(conn, "rolled_through", top)
        return n

    def prune(self) -> dict[str, int]:
        """Drop raw samples that arrived more than raw_days ago (once rolled up), rollups older
        than rollup_days and batch ids older than raw_days."""
        self.rollup_pending()
        t = self.clock()
        raw_cutoff = t - self.raw_days * DAY_MS
        day_cutoff = t // DAY_MS - self.rollup_days
        with self.transaction("prune") as conn:
            mark = int(self._meta("rolled_through", "0"))
            old = conn.execute("SELECT max(last_sample_id) FROM batches WHERE received_ms < ?",
                               (raw_cutoff,)).fetchone()[0] or 0
            samples = conn.execute("DELETE FROM samples WHERE id <= ?",
                                   (min(old, mark),)).rowcount
            rollups = conn.execute("DELETE FROM rollups WHERE day < ?", (day_cutoff,)).rowcount
            conn.execute("DELETE FROM rollup_buckets WHERE day < ?", (day_cutoff,))
            batches = conn.execute("DELETE FROM batches WHERE received_ms < ?",
                                   (raw_cutoff,)).rowcount
        return {"samples": samples, "rollups": rollups, "batches": batches}

    def daily_rollups(self, src: str, dst: str) -> dict[int, DailyRollup]:
        """{day number: rollup} of one ordered pair."""
        self.rollup_pending()
        refs = self.node_refs()
        if src not in refs or dst not in refs:
            return {}
        a, b = refs[src].idx, refs[dst].idx
        with self._lock, self._errors("read rollups"):
            rows = self.conn.execute("SELECT day, count, lost, sum, sumsq, min, max FROM rollups "
                                     "WHERE src = ? AND dst = ?", (a, b)).fetchall()
            buckets = self.conn.execute("SELECT day, bucket, count FROM rollup_buckets "
                                        "WHERE src = ? AND dst = ?", (a, b)).fetchall()
        out = {day: _rollup(row) for day, *row in rows}
        for day, bucket, count in buckets:
            out[day].buckets[bucket] = count
        return out

    def window_rollups(self, window_days: int = 90) -> list[PairRollup]:
        """Every ordered pair's rollup over the last ``window_days`` UTC days (today included),
        as exact sums of the daily rollups."""
        self.rollup_pending()
        first_day = self.clock() // DAY_MS - window_days + 1
        with self._lock, self._errors("read window"):
            rows = self.conn.execute("""
                SELECT a.id, b.id, sum(r.count), sum(r.lost), total(r.sum), total(r.sumsq),
                       min(r.min), max(r.max)
                FROM rollups r JOIN nodes a ON a.idx = r.src JOIN nodes b ON b.idx = r.dst
                WHERE r.day >= ? GROUP BY r.src, r.dst""", (first_day,)).fetchall()
            buckets = self.conn.execute("""
                SELECT a.id, b.id, rb.bucket, sum(rb.count)
                FROM rollup_buckets rb JOIN nodes a ON a.idx = rb.src JOIN nodes b ON b.idx = rb.dst
                WHERE rb.day >= ? GROUP BY rb.src, rb.dst, rb.bucket""", (first_day,)).fetchall()
        pairs = {(r[0], r[1]): PairRollup(r[0], r[1], _rollup(r[2:])) for r in rows}
        for src, dst, bucket, count in buckets:
            pairs[(src, dst)].rollup.buckets[bucket] = count
        return sorted(pairs.values(), key=lambda p: (p.src, p.dst))

    # ---------------------------------------------------------------------- imported fleets

    def import_fleet(self, fleet) -> dict[str, int]:
        """Store an imported Fleet (planner.core.fleet.Fleet) in one transaction: nodes are
        inserted or updated (agent registrations keep their own fields), links replace earlier
        imported links of the same pair."""
        t = self.clock()
        added = updated = 0
        with self.transaction("import fleet") as conn:
            for node in fleet.nodes:
                row = conn.execute("SELECT idx, source FROM nodes WHERE id = ?",
                                   (node.id,)).fetchone()
                values = {"city": node.city, "gpu_count": node.gpus, "gpu_name": node.gpu_name,
                          "compute_capability": node.compute_capability,
                          "memory_gb": node.memory_gb}
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
        with self._lock, self._errors("read imported links"):
            return list(self.db.query(
                "SELECT a.id AS src, b.id AS dst, l.rtt_ms, l.bandwidth_gbps, l.loss, l.samples "
                "FROM imported_links l JOIN nodes a ON a.idx = l.src "
                "JOIN nodes b ON b.idx = l.dst ORDER BY a.id, b.id"))


def _rollup(row: Sequence[Any]) -> DailyRollup:
    count, lost, total, sumsq, lo, hi = row
    return DailyRollup(count=int(count), lost=int(lost or 0), sum=float(total or 0.0),
                       sumsq=float(sumsq or 0.0),
                       min=math.inf if lo is None else float(lo),
                       max=-math.inf if hi is None else float(hi))


def _summarise_gpus(gpus: Iterable[GpuInfo]) -> tuple[str | None, float | None, float]:
    """(most common GPU name, its compute capability, total memory in GB) of an inventory."""
    gpus = list(gpus)
    if not gpus:
        return None, None, 0.0
    names: dict[str, int] = {}
    for g in gpus:
        names[g.name] = names.get(g.name, 0) + 1
    name = max(names, key=lambda k: names[k])
    cc = next(g.compute_capability for g in gpus if g.name == name) or None
    return name, cc, sum(g.memory_bytes for g in gpus) / 1e9
