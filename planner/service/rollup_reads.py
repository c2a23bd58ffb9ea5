"""The store's reads of the rollups over a window (one part of ``planner.service.store.Store``):
node pairs' and site pairs' merged rollups with histograms, and the plain sums a fleet's links
need, added up by SQLite's own aggregates."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hulk.wire import histogram
from planner.core.rollup import DailyRollup
from planner.service.database import Database

DAY_MS = 86_400_000


@dataclass
class PairRollup:
    """The merged rollup of one ordered pair over a window."""

    src: str
    dst: str
    rollup: DailyRollup = field(default_factory=DailyRollup)


class RollupReads:
    """Window reads over ``database``; ``fold_pending`` (the store's ``rollup_pending``) runs
    before each read so it includes everything stored; days from ``clock`` (ms)."""

    def __init__(self, database: Database, clock: Callable[[], int],
                 fold_pending: Callable[[], object]):
        self.database = database
        self.clock = clock
        self.fold_pending = fold_pending

    def daily_rollups(self, src: str, dst: str) -> dict[int, DailyRollup]:
        """{day number: rollup} of one ordered pair."""
        self.fold_pending()
        with self.database.reading("read rollups") as conn:
            rows = conn.execute("SELECT r.day, r.count, r.lost, r.sum, r.sumsq, r.min_us, "
                                "r.max_us, r.hist FROM rollups r JOIN nodes a ON a.idx = r.src "
                                "JOIN nodes b ON b.idx = r.dst WHERE a.id = ? AND b.id = ?",
                                (src, dst)).fetchall()
        return {day: _rollup(row) for day, *row in rows}

    def window_rollups(self, window_days: int = 90) -> list[PairRollup]:
        """Every ordered pair's rollup over the last ``window_days`` UTC days (today included),
        as exact sums of the daily rollups."""
        return self._window_rollups("rollups", "nodes", "id", window_days, "read window")

    def site_window_rollups(self, window_days: int = 90) -> list[PairRollup]:
        """Every ordered site pair's rollup (site_rollups) over the last ``window_days`` UTC
        days, src and dst being site names."""
        return self._window_rollups("site_rollups", "sites", "name", window_days,
                                    "read site window")

    def _window_rollups(self, rollups: str, names: str, name: str, window_days: int,
                        what: str) -> list[PairRollup]:
        # Table and column names are this module's constants, never input.
        self.fold_pending()
        first_day = self.clock() // DAY_MS - window_days + 1
        with self.database.reading(what) as conn:
            rows = conn.execute(f"""
                SELECT a.{name}, b.{name}, sum(r.count), sum(r.lost), total(r.sum), total(r.sumsq),
                       min(r.min_us), max(r.max_us), hist_sum(r.hist)
                FROM {rollups} r JOIN {names} a ON a.idx = r.src JOIN {names} b ON b.idx = r.dst
                WHERE r.day >= ? GROUP BY r.src, r.dst""", (first_day,)).fetchall()
        return sorted((PairRollup(r[0], r[1], _rollup(r[2:])) for r in rows),
                      key=lambda p: (p.src, p.dst))

    def window_totals(self, window_days: int = 90) -> list[tuple[str, str, int, int, float]]:
        """(src, dst, count, lost, sum of RTTs) per ordered node pair over the window: the
        figures a link needs, summed in SQL (no histograms)."""
        return self._totals("rollups", "nodes", "id", window_days)

    def site_window_totals(self, window_days: int = 90
                           ) -> list[tuple[str, str, int, int, float]]:
        """(src site, dst site, count, lost, sum of RTTs) per ordered site pair over the window,
        summed in SQL from site_rollups."""
        return self._totals("site_rollups", "sites", "name", window_days)

    def _totals(self, table: str, names: str, name: str, window_days: int):
        self.fold_pending()
        first_day = self.clock() // DAY_MS - window_days + 1
        with self.database.reading(f"read {table}") as conn:
            label = dict(conn.execute(f"SELECT idx, {name} FROM {names}").fetchall())
            if (self.database.path == ":memory:" or self.database.overlaid
                    or window_days < 2 * READ_THREADS):
                rows = conn.execute(_TOTALS.format(table=table),
                                         (first_day, MAX_DAY)).fetchall()
            else:
                rows = self._parallel_totals(table, first_day, window_days)
        return [(label[a], label[b], c, lost, total) for a, b, c, lost, total in rows]

    def _parallel_totals(self, table: str, first_day: int, window_days: int) -> list[tuple]:
        """The window's sums as READ_THREADS queries over day ranges, each on its own read-only
        connection (SQLite sorts each part's rows for GROUP BY while holding no GIL), added up
        here. At 10,000 servers the window holds tens of millions of rows."""
        step = window_days // READ_THREADS
        bounds = [first_day + i * step for i in range(READ_THREADS)] + [MAX_DAY]
        uri = self.database.read_uri

        def part(lo: int, hi: int) -> list[tuple]:
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            try:
                return conn.execute(_TOTALS.format(table=table), (lo, hi)).fetchall()
            finally:
                conn.close()

        with ThreadPoolExecutor(READ_THREADS) as pool:
            parts = list(pool.map(part, bounds[:-1], bounds[1:]))
        sums: dict[tuple[int, int], list] = {}
        for rows in parts:
            for a, b, count, lost, total in rows:
                acc = sums.get((a, b))
                if acc is None:
                    sums[(a, b)] = [count, lost, total]
                else:
                    acc[0] += count
                    acc[1] += lost
                    acc[2] += total
        return [(a, b, *acc) for (a, b), acc in sums.items()]


_TOTALS = """SELECT src, dst, sum(count), sum(lost), total(sum) FROM {table}
    WHERE day >= ? AND day < ? GROUP BY src, dst"""
MAX_DAY = 2 ** 62     # above any day number
READ_THREADS = 2      # read connections that sum a window's rows side by side


def _rollup(row: Sequence[Any]) -> DailyRollup:
    count, lost, total, sumsq, lo, hi, hist = row
    return DailyRollup(count=int(count), lost=int(lost or 0), sum=float(total or 0.0),
                       sumsq=float(sumsq or 0.0),
                       min=math.inf if lo is None else lo / 1000.0,
                       max=-math.inf if hi is None else hi / 1000.0,
                       buckets=histogram.decode(hist))
