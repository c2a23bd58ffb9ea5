"""The RTT histogram both sides use, defined once: fixed log-spaced buckets in milliseconds.

An agent's per-round summary (``hulk.wire.records.PeerSummary``) carries its RTTs in these
buckets, and the planner's rollups (``planner.core.rollup``) keep the same ones, so a rollup
folded from summaries equals the rollup of the raw samples they came from, bucket for bucket.

Buckets, 20 per decade from 0.05 ms past 10 s (each about 12 % wide):

    bucket 0             [0, 0.05) ms                       (underflow)
    bucket k, 1..107     [0.05 * 10**((k-1)/20), 0.05 * 10**(k/20)) ms
    bucket 108           [11 194 ms, inf)                   (overflow)

so bucket 1 is [0.05, 0.0561) ms, bucket 61 is [50.0, 56.1) ms, bucket 107 [9 976, 11 194) ms.
Exact edges land in the bucket they open. ``encode``/``decode`` give the compact byte form the
planner's store keeps (a bucket byte, then the count as a varint, per non-empty bucket).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

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


def histogram_of(rtts_ms: Iterable[float]) -> dict[int, int]:
    """{bucket: count} of RTTs."""
    out: dict[int, int] = {}
    for rtt in rtts_ms:
        k = bucket_index(rtt)
        out[k] = out.get(k, 0) + 1
    return out


def encode(buckets: Mapping[int, int]) -> bytes:
    """The compact form of a histogram: per non-empty bucket, in bucket order, the bucket's
    number as one byte and its count as an unsigned LEB128 varint."""
    out = bytearray()
    for k in sorted(buckets):
        c = buckets[k]
        if c <= 0:
            continue
        out.append(k)
        while c >= 0x80:
            out.append((c & 0x7F) | 0x80)
            c >>= 7
        out.append(c)
    return bytes(out)


def decode(data: bytes | None, into: dict[int, int] | None = None) -> dict[int, int]:
    """``encode``'s inverse; with ``into``, adds the counts into that dict and returns it."""
    out = {} if into is None else into
    if not data:
        return out
    i, n = 0, len(data)
    while i < n:
        k = data[i]
        c = shift = 0
        i += 1
        while True:
            b = data[i]
            i += 1
            c |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        out[k] = out.get(k, 0) + c
    return out
