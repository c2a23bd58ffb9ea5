"""The store's reads of the rollups over a window (a mixin of ``planner.service.store.Store``):
node pairs' and site pairs' merged rollups with histograms, and the plain sums a fleet's links
need, added up by SQLite's own aggregates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hulk.wire import histogram
from planner.core.rollup import DailyRollup

DAY_MS = 86_400_000


@dataclass
class PairRollup:
    """The merged rollup of one ordered pair over a window."""

    src: str
    dst: str
    rollup: DailyRollup = field(default_factory=DailyRollup)


class RollupReads:
    """Window reads; the Store provides the connection, clock and ``rollup_pending``."""

    def daily_rollups(self, src: str, dst: str) -> dict[int, DailyRollup]:
        """{day number: rollup} of one ordered pair."""
        self.rollup_pending()
        refs = self.node_refs()
        if src not in refs or dst not in refs:
            return {}
        a, b = refs[src].idx, refs[dst].idx
        with self._lock, self._errors("read rollups"):
            rows = self.conn.execute("SELECT day, count, lost, sum, sumsq, min_us, max_us, hist "
                                     "FROM rollups WHERE src = ? AND dst = ?", (a, b)).fetchall()
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
        self.rollup_pending()
        first_day = self.clock() // DAY_MS - window_days + 1
        with self._lock, self._errors(what):
            rows = self.conn.execute(f"""
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
        self.rollup_pending()
        first_day = self.clock() // DAY_MS - window_days + 1
        with self._lock, self._errors(f"read {table}"):
            label = dict(self.conn.execute(f"SELECT idx, {name} FROM {names}").fetchall())
            rows = self.conn.execute(f"""SELECT src, dst, sum(count), sum(lost), total(sum)
                FROM {table} WHERE day >= ? GROUP BY src, dst""", (first_day,)).fetchall()
        return [(label[a], label[b], c, lost, total) for a, b, c, lost, total in rows]


def _rollup(row: Sequence[Any]) -> DailyRollup:
    count, lost, total, sumsq, lo, hi, hist = row
    return DailyRollup(count=int(count), lost=int(lost or 0), sum=float(total or 0.0),
                       sumsq=float(sumsq or 0.0),
                       min=math.inf if lo is None else lo / 1000.0,
                       max=-math.inf if hi is None else hi / 1000.0,
                       buckets=histogram.decode(hist))
