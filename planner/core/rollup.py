"""Daily rollups of RTT samples and the window statistics computed from them (pure, no I/O).

A rollup keeps exact sums (count, lost, sum, sum of squares, min, max) and a log-spaced histogram,
so the statistics of any window are exact sums over its days: the mean, loss and jitter are exact,
and p50/p99 are within one histogram bucket's width (20 buckets per decade: about 12 %).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

# The buckets are the wire's (hulk.wire.histogram): summaries from agents fold in bucket for bucket.
from hulk.wire.histogram import (BUCKETS_PER_DECADE, HIGH_MS, LOW_MS, NUM_BUCKETS,  # noqa: F401
                                 NUM_REGULAR, OVERFLOW, bucket_bounds, bucket_index, edge)

__all__ = ["BUCKETS_PER_DECADE", "HIGH_MS", "LOW_MS", "NUM_BUCKETS", "NUM_REGULAR", "OVERFLOW",
           "DailyRollup", "WindowStats", "bucket_bounds", "bucket_index", "bucket_width", "edge",
           "merge_all"]


def bucket_width(rtt_ms: float) -> float:
    low, high = bucket_bounds(bucket_index(rtt_ms))
    return high - low


@dataclass
class DailyRollup:
    """Accumulated samples of one ordered pair (on one day, or merged over a window)."""

    count: int = 0          # samples, lost ones included
    lost: int = 0
    sum: float = 0.0        # of RTTs of received samples
    sumsq: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    buckets: dict[int, int] = field(default_factory=dict)

    @property
    def received(self) -> int:
        return self.count - self.lost

    def add(self, rtt_ms: float | None, lost: bool = False) -> None:
        self.count += 1
        if lost or rtt_ms is None:
            self.lost += 1
            return
        self.sum += rtt_ms
        self.sumsq += rtt_ms * rtt_ms
        self.min = min(self.min, rtt_ms)
        self.max = max(self.max, rtt_ms)
        k = bucket_index(rtt_ms)
        self.buckets[k] = self.buckets.get(k, 0) + 1

    def add_summary(self, count: int, lost: int, rtt_sum: float, rtt_sumsq: float,
                    rtt_min: float, rtt_max: float, buckets: dict[int, int]) -> None:
        """Add one round's summary (hulk.wire.records.PeerSummary's figures): the same rollup
        as adding its samples one by one (sums up to float rounding)."""
        self.count += count
        self.lost += lost
        if count > lost:
            self.sum += rtt_sum
            self.sumsq += rtt_sumsq
            self.min = min(self.min, rtt_min)
            self.max = max(self.max, rtt_max)
        for k, c in buckets.items():
            self.buckets[k] = self.buckets.get(k, 0) + c

    def merge(self, other: "DailyRollup") -> "DailyRollup":
        """Add ``other`` into this rollup (in place) and return it."""
        self.count += other.count
        self.lost += other.lost
        self.sum += other.sum
        self.sumsq += other.sumsq
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        for k, c in other.buckets.items():
            self.buckets[k] = self.buckets.get(k, 0) + c
        return self

    def quantile(self, q: float) -> float | None:
        """The q-quantile of received RTTs (the ceil(q*n)-th smallest), within one bucket."""
        n = self.received
        if n <= 0:
            return None
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
        rank = max(1, math.ceil(q * n - 1e-9))
        seen = 0
        for k in sorted(self.buckets):
            c = self.buckets[k]
            if seen + c >= rank:
                low, high = bucket_bounds(k)
                low, high = max(low, self.min), min(high, self.max)
                if high <= low:
                    return low
                # Geometric interpolation inside the bucket: the edges are log-spaced.
                frac = (rank - seen - 0.5) / c
                if low > 0:
                    return low * (high / low) ** frac
                return low + (high - low) * frac
            seen += c
        return self.max

    def stats(self) -> "WindowStats":
        n = self.received
        mean = self.sum / n if n else None
        jitter = None
        if n:
            var = max(0.0, self.sumsq / n - mean * mean)
            jitter = math.sqrt(var)
        return WindowStats(samples=self.count, lost=self.lost,
                           loss=(self.lost / self.count) if self.count else 0.0,
                           mean_ms=mean, jitter_ms=jitter,
                           min_ms=self.min if n else None, max_ms=self.max if n else None,
                           p50_ms=self.quantile(0.5), p99_ms=self.quantile(0.99))

    def to_row(self) -> dict:
        return {"count": self.count, "lost": self.lost, "sum": self.sum, "sumsq": self.sumsq,
                "min": None if math.isinf(self.min) else self.min,
                "max": None if math.isinf(self.max) else self.max,
                "buckets": dict(sorted(self.buckets.items()))}

    @classmethod
    def from_values(cls, rtts: Iterable[float | None]) -> "DailyRollup":
        """A rollup of RTTs, ``None`` meaning a lost sample."""
        r = cls()
        for v in rtts:
            r.add(v, lost=v is None)
        return r


@dataclass(frozen=True)
class WindowStats:
    """Statistics of one ordered pair over a window; RTT figures are None when nothing arrived."""

    samples: int
    lost: int
    loss: float
    mean_ms: float | None
    jitter_ms: float | None   # population standard deviation of RTT
    min_ms: float | None
    max_ms: float | None
    p50_ms: float | None
    p99_ms: float | None


def merge_all(rollups: Iterable[DailyRollup]) -> DailyRollup:
    total = DailyRollup()
    for r in rollups:
        total.merge(r)
    return total
