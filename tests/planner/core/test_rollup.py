"""Rollup maths against numpy on random data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core import rollup
from planner.core.rollup import DailyRollup, bucket_bounds, bucket_index, merge_all


def test_bucket_edges_are_log_spaced_and_consistent():
    assert rollup.NUM_REGULAR == 107  # 20 per decade over 0.05 ms .. 10 s
    assert bucket_index(0.0) == 0 and bucket_index(0.049) == 0
    assert bucket_index(0.05) == 1
    assert bucket_index(10_000.0) < rollup.OVERFLOW  # 10 s is still a regular bucket
    assert bucket_index(rollup.edge(rollup.NUM_REGULAR)) == rollup.OVERFLOW == bucket_index(1e9)
    rng = np.random.default_rng(1)
    for v in np.exp(rng.uniform(math.log(0.05), math.log(9_999), 5000)):
        lo, hi = bucket_bounds(bucket_index(v))
        assert lo <= v < hi
        assert hi / lo == pytest.approx(10 ** (1 / 20))
    for k in range(1, rollup.NUM_REGULAR + 1):  # exact edges land in the bucket they open
        assert bucket_index(rollup.edge(k - 1)) == k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_window_stats_match_numpy(seed):
    rng = np.random.default_rng(seed)
    days = []
    everything = []
    lost_total = 0
    for _ in range(30):
        n = int(rng.integers(1, 400))
        base = float(rng.uniform(0.2, 300))
        values = base + rng.gamma(2.0, base * 0.05, n)
        lost = rng.random(n) < 0.03
        lost_total += int(lost.sum())
        day = DailyRollup.from_values([None if lo else float(v) for v, lo in zip(values, lost)])
        days.append(day)
        everything.extend(values[~lost])
    data = np.array(everything)
    window = merge_all(days)
    st = window.stats()
    assert st.samples == len(data) + lost_total
    assert st.lost == lost_total
    assert st.loss == pytest.approx(lost_total / (len(data) + lost_total))
    assert st.mean_ms == pytest.approx(data.mean(), rel=1e-12)
    assert st.jitter_ms == pytest.approx(data.std(), rel=1e-7)
    assert st.min_ms == data.min() and st.max_ms == data.max()
    for q, got in ((0.5, st.p50_ms), (0.99, st.p99_ms)):
        truth = float(np.quantile(data, q, method="inverted_cdf"))
        lo, hi = bucket_bounds(bucket_index(truth))
        assert abs(got - truth) <= hi - lo, (q, got, truth)


def test_merge_is_exact_and_order_free():
    rng = np.random.default_rng(5)
    parts = [DailyRollup.from_values(rng.uniform(1, 100, 50).tolist()) for _ in range(5)]
    a = merge_all(parts)
    b = merge_all(reversed(parts))
    assert a.count == b.count == 250 and a.buckets == b.buckets
    assert a.sum == pytest.approx(b.sum) and a.min == b.min and a.max == b.max
    # Merging is exact sums: the window mean is not the mean of the daily means.
    skewed = merge_all([DailyRollup.from_values([10.0] * 99), DailyRollup.from_values([100.0])])
    assert skewed.stats().mean_ms == pytest.approx(10.9)


def test_empty_and_all_lost():
    assert DailyRollup().stats().mean_ms is None
    st = DailyRollup.from_values([None, None]).stats()
    assert st.loss == 1.0 and st.mean_ms is None and st.p50_ms is None and st.samples == 2
