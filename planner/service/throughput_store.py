"""The store's throughput tests (one part of ``planner.service.store.Store``): the tests serve
scheduled, the results their receivers reported, and the reads the scheduler, the graph, the
displays and the calibration need.

Tables (``planner.service.database``):
  throughput_scheduled  every test serve handed out: sender and receiver (node idx), their sites
                        at scheduling time, start, the bytes it was expected to move
  throughput_tests      one row per reported result, keyed by test id (INSERT OR IGNORE: a
                        retried report stores it once)

A result is taken only from the receiver of a test this planner scheduled, naming its sender:
anything else is a forged or misrouted figure that plans would trust, so it is refused and
counted, never stored. Both tables keep ``THROUGHPUT_DAYS`` (a few rows a site pair a day).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hulk.wire.throughput import ThroughputResult
from planner.service.database import Database

DAY_MS = 86_400_000
THROUGHPUT_DAYS = 90

REASON_UNKNOWN_TEST = "throughput_unknown_test"
REASON_WRONG_NODE = "throughput_wrong_node"


@dataclass(frozen=True)
class ScheduledTest:
    """A test as the store keeps it (node ids; sites as they were when it was scheduled)."""

    test_id: str
    sender: str
    receiver: str
    src_site: str | None
    dst_site: str | None
    start_ms: int
    expected_bytes: float


@dataclass(frozen=True)
class SitePairThroughput:
    """Measured throughput of one directed site pair (sender's site -> receiver's site)."""

    src_site: str
    dst_site: str
    gbps: float          # median of the ok tests in the window
    tests: int           # ok tests behind it
    failed: int          # failed tests in the window
    last_ms: int         # start of the newest test (ok or failed)


class ThroughputRecords:
    """Scheduled tests and results over ``database``; times from ``clock`` (ms)."""

    def __init__(self, database: Database, clock: Callable[[], int]):
        self.database = database
        self.clock = clock

    def add_scheduled(self, tests: Iterable[ScheduledTest]) -> int:
        """Record tests serve hands out (before any agent hears of them); returns how many."""
        rows = []
        with self.database.transaction("schedule throughput tests") as conn:
            idx = dict(conn.execute("SELECT id, idx FROM nodes").fetchall())
            for t in tests:
                rows.append((t.test_id, idx[t.sender], idx[t.receiver],
                             self.database.site_index(conn, t.src_site),
                             self.database.site_index(conn, t.dst_site), t.start_ms,
                             float(t.expected_bytes)))
            conn.executemany("INSERT OR IGNORE INTO throughput_scheduled(test_id, src, dst, "
                             "src_site, dst_site, start_ms, expected_bytes) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def check_result(self, receiver_idx: int, result: ThroughputResult) -> str | None:
        """None when ``result`` may be stored from the node ``receiver_idx``; else the reason
        it is refused: a test this planner never scheduled, or one whose receiver or sender is
        not who the result says."""
        with self.database.reading("check throughput result") as conn:
            row = conn.execute("SELECT s.dst, n.id FROM throughput_scheduled s "
                               "JOIN nodes n ON n.idx = s.src WHERE s.test_id = ?",
                               (result.test_id,)).fetchone()
        if row is None:
            return REASON_UNKNOWN_TEST
        if row[0] != receiver_idx or row[1] != result.sender_id:
            return REASON_WRONG_NODE
        return None

    def store_results(self, receiver_idx: int, results: Sequence[ThroughputResult]
                      ) -> list[ThroughputResult]:
        """Store results ``check_result`` accepted; a test id stored before is left as it is
        (retried reports). Returns those that were new."""
        t = self.clock()
        with self.database.transaction("store throughput results") as conn:
            new = []
            for r in results:
                src = conn.execute("SELECT src FROM throughput_scheduled WHERE test_id = ? "
                                   "AND dst = ?", (r.test_id, receiver_idx)).fetchone()
                if src is None:   # checked before; a prune in between leaves it out
                    continue
                cur = conn.execute(
                    "INSERT OR IGNORE INTO throughput_tests(test_id, src, dst, start_ms, "
                    "duration_s, bytes, streams, gbps, ok, detail, received_ms) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (r.test_id, src[0], receiver_idx, r.start_ms, r.duration_s, r.bytes,
                     r.streams, r.gbps if r.ok else 0.0, int(r.ok), r.detail, t))
                if cur.rowcount:
                    new.append(r)
        return new

    def last_tested_ms(self) -> dict[tuple[str, str], int]:
        """(sender's site, receiver's site) -> start of the newest test scheduled for it (a test
        handed out counts, reported or not: a pair is not tested again before its period)."""
        with self.database.reading("read last throughput tests") as conn:
            rows = conn.execute("SELECT a.name, b.name, max(s.start_ms) FROM throughput_scheduled "
                                "s JOIN sites a ON a.idx = s.src_site JOIN sites b "
                                "ON b.idx = s.dst_site GROUP BY s.src_site, s.dst_site").fetchall()
        return {(a, b): last for a, b, last in rows}

    def spent_bytes(self, since_ms: int) -> float:
        """Bytes of the tests scheduled to start since ``since_ms``: what was measured where a
        result came, else what the test was expected to move."""
        with self.database.reading("read throughput budget") as conn:
            return float(conn.execute(
                "SELECT total(coalesce(t.bytes, s.expected_bytes)) FROM throughput_scheduled s "
                "LEFT JOIN throughput_tests t ON t.test_id = s.test_id WHERE s.start_ms >= ?",
                (since_ms,)).fetchone()[0])

    def site_pairs(self, window_days: int = THROUGHPUT_DAYS) -> list[SitePairThroughput]:
        """Every directed site pair with a reported test in the window (ok or failed)."""
        since = self.clock() - window_days * DAY_MS
        with self.database.reading("read throughput") as conn:
            rows = conn.execute(
                "SELECT a.name, b.name, t.gbps, t.ok, s.start_ms FROM throughput_tests t "
                "JOIN throughput_scheduled s ON s.test_id = t.test_id "
                "JOIN sites a ON a.idx = s.src_site JOIN sites b ON b.idx = s.dst_site "
                "WHERE s.start_ms >= ?", (since,)).fetchall()
        acc: dict[tuple[str, str], tuple[list[float], list[int]]] = {}
        for src, dst, gbps, ok, start in rows:
            values, times = acc.setdefault((src, dst), ([], []))
            times.append(start)
            if ok:
                values.append(float(gbps))
        out = []
        for (src, dst), (values, times) in sorted(acc.items()):
            out.append(SitePairThroughput(src, dst, statistics.median(values) if values else 0.0,
                                          len(values), len(times) - len(values), max(times)))
        return out

    def throughput_by_site_pair(self, window_days: int = THROUGHPUT_DAYS
                                ) -> dict[tuple[str, str], tuple[float, int]]:
        """(src site, dst site) -> (median Gbit/s of its ok tests, tests) over the window;
        pairs with no ok test are left out."""
        return {(p.src_site, p.dst_site): (p.gbps, p.tests) for p in self.site_pairs(window_days)
                if p.tests}

    def results(self) -> list[dict]:
        """Every stored result with node ids (tests, debugging)."""
        with self.database.reading("read throughput results"):
            return list(self.database.db.query(
                "SELECT t.test_id, a.id AS sender, b.id AS receiver, t.start_ms, t.duration_s, "
                "t.bytes, t.streams, t.gbps, t.ok, t.detail FROM throughput_tests t "
                "JOIN nodes a ON a.idx = t.src JOIN nodes b ON b.idx = t.dst ORDER BY t.rowid"))

    def prune(self, conn) -> int:
        """Inside the store's prune transaction: tests that started more than THROUGHPUT_DAYS
        ago leave (results first: a result never outlives the test that vouches for it)."""
        cutoff = self.clock() - THROUGHPUT_DAYS * DAY_MS
        n = conn.execute("DELETE FROM throughput_tests WHERE test_id IN (SELECT test_id FROM "
                         "throughput_scheduled WHERE start_ms < ?)", (cutoff,)).rowcount
        n += conn.execute("DELETE FROM throughput_tests WHERE start_ms < ?", (cutoff,)).rowcount
        conn.execute("DELETE FROM throughput_scheduled WHERE start_ms < ?", (cutoff,))
        return n


@dataclass(frozen=True)
class TestNode:
    """A node that takes throughput tests (its agent registered a throughput port)."""

    node_id: str
    site: str | None
    address: str
    port: int


def test_nodes(database: Database, alive_since_ms: int) -> list[TestNode]:
    """Agents' nodes with a throughput port and an address that called since ``alive_since_ms``,
    by id."""
    with database.reading("read throughput nodes") as conn:
        rows = conn.execute(
            "SELECT n.id, s.name, n.address, n.throughput_port FROM nodes n LEFT JOIN sites s "
            "ON s.idx = n.site_idx WHERE n.source = 'agent' AND n.throughput_port BETWEEN 1 AND 65535 AND "
            "coalesce(n.address, '') != '' AND n.last_seen_ms >= ? ORDER BY n.id",
            (alive_since_ms,)).fetchall()
    return [TestNode(*r) for r in rows]


def launched_nodes(database: Database) -> set[str]:
    """Nodes whose last heartbeat reported a training process starting or running."""
    with database.reading("read launched nodes") as conn:
        rows = conn.execute("SELECT id FROM nodes WHERE launch_state IN ('starting', "
                            "'running')").fetchall()
    return {r[0] for r in rows}
