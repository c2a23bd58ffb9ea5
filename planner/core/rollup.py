"""Daily rollups of RTT samples and the window statistics computed from them (pure, no I/O).

A rollup keeps exact sums (count, lost, sum, sum of squares, min, max) and a log-spaced histogram,
so the statistics of any window are exact sums over its days: the mean, loss and jitter are exact,
and p50/p99 are within one histogram bucket's width (20 buckets per decade: about 12 %).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

LOW_MS = 0.05          # the lowest bucket edge; faster RTTs land in the underflow bucket 0
HIGH_MS = 10_000.0     # 10 s; slower RTTs land in the overflow bucket
BUCKETS_PER_DECADE = 20
_LOG_LOW = math.log10(LOW_MS)
# Bucket k (1..NUM_REGULAR) holds [edge(k-1), edge(k)); 0 is [0, LOW_MS); NUM_REGULAR+1 is
# [HIGH_MS, inf).
NUM_REGULAR = math.ceil(round(BUCKETS_PER_DECADE * math.log10(HIGH_MS / LOW_MS), 9))
OVERFLOW = NUM_REGULAR + 1
NUM_BUCKETS = NUM_REGULAR + 2


def edge(k: int) -> float:
    """The lower edge of regular bucket k+1 (edge(0) = LOW_MS)."""
    return LOW_MS * 10 ** (k / BUCKETS_PER_DECADE)


def bucket_index(rtt_ms: float) -> int:
    """The histogram bucket of an RTT in ms."""
    if rtt_ms < LOW_MS:
        return 0
    k = int((math.log10(rtt_ms) - _LOG_LOW) * BUCKETS_PER_DECADE) + 1
    # Guard the float edges so index and edges always agree.
    if k > 1 and rtt_ms < edge(k - 1):
        k -= 1
    elif k <= NUM_REGULAR and rtt_ms >= edge(k):
        k += 1
    return min(k, OVERFLOW)


def bucket_bounds(k: int) -> tuple[float, float]:
    """[low, high) of bucket k in ms."""
    if k <= 0:
        return 0.0, LOW_MS
    if k >= OVERFLOW:
        return edge(NUM_REGULAR), math.inf
    return edge(k - 1), edge(k)


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
