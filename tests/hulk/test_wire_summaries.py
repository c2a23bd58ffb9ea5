"""Per-round summaries on the wire: the histogram's buckets and bytes, the record's proto
round trip, and old-style (raw sample) reports reading as before."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hulk.errors import InputError
from hulk.v1 import hulk_pb2
from hulk.wire import histogram
from hulk.wire.records import PeerSummary, ProbeKind, ProbeSample, ReportRequest

rtts = st.floats(min_value=0.0, max_value=60_000.0, allow_nan=False)


def samples_of(values: list[float | None], peer: str = "b") -> list[ProbeSample]:
    return [ProbeSample(peer, 1_700_000_000_000 + 200 * i, ProbeKind.ICMP, 56, v is None,
                        0.0 if v is None else v, 60_000.0) for i, v in enumerate(values)]


def test_bucket_layout_is_the_documented_one():
    assert histogram.NUM_BUCKETS == 109 and histogram.OVERFLOW == 108
    assert histogram.bucket_index(0.0) == 0 and histogram.bucket_index(0.0499) == 0
    assert histogram.bucket_index(0.05) == 1
    low, high = histogram.bucket_bounds(61)
    assert low == pytest.approx(50.0) and high == pytest.approx(56.10, rel=1e-3)
    assert histogram.bucket_index(10_000.0) == 107
    assert histogram.bucket_bounds(108)[0] == pytest.approx(11_193.6, rel=1e-4)
    assert histogram.bucket_index(11_200.0) == 108 == histogram.bucket_index(1e9)


@given(st.dictionaries(st.integers(0, histogram.OVERFLOW), st.integers(1, 2**40), max_size=40))
def test_histogram_bytes_round_trip(buckets):
    data = histogram.encode(buckets)
    assert histogram.decode(data) == buckets
    assert histogram.decode(data, dict(buckets)) == {k: 2 * c for k, c in buckets.items()}


@given(st.lists(st.one_of(st.none(), rtts), min_size=1, max_size=100))
def test_summary_of_samples_and_its_proto_round_trip(values):
    summary = PeerSummary.of_samples(samples_of(values))
    received = [v for v in values if v is not None]
    assert summary.count == len(values) and summary.lost == len(values) - len(received)
    assert summary.rtt_sum_ms == pytest.approx(sum(received))
    assert summary.rtt_min_ms == (min(received) if received else 0.0)
    assert summary.rtt_max_ms == (max(received) if received else 0.0)
    assert dict(summary.buckets) == histogram.histogram_of(received)
    assert [k for k, _ in summary.buckets] == sorted(k for k, _ in summary.buckets)
    wire = summary.to_proto().SerializeToString()
    assert PeerSummary.from_proto(hulk_pb2.PeerSummary.FromString(wire)) == summary


def test_a_report_with_summaries_round_trips_and_an_old_style_one_reads_as_before():
    summary = PeerSummary.of_samples(samples_of([1.5, None, 2.5]))
    sample = samples_of([3.0])[0]
    request = ReportRequest("a", "batch-1", (sample,), 4, (summary,))
    back = ReportRequest.from_proto(hulk_pb2.ReportRequest.FromString(
        request.to_proto().SerializeToString()))
    assert back == request
    # What an agent from before summaries sends: no field 5 at all.
    old = hulk_pb2.ReportRequest(node_id="a", batch_id="b", samples=[sample.to_proto()])
    read = ReportRequest.from_proto(hulk_pb2.ReportRequest.FromString(old.SerializeToString()))
    assert read.samples == (sample,) and read.summaries == ()


def test_histogram_lists_of_different_lengths_are_refused_naming_the_field():
    msg = hulk_pb2.ReportRequest(node_id="a", batch_id="b", summaries=[hulk_pb2.PeerSummary(
        peer_id="b", count=2, histogram_buckets=[3, 4], histogram_counts=[2])])
    with pytest.raises(InputError, match=r"summaries\[0\]\.histogram_counts"):
        ReportRequest.from_proto(msg)


def test_summary_sums_are_exactly_rounded():
    values = [0.1] * 10
    summary = PeerSummary.of_samples(samples_of(values))
    assert summary.rtt_sum_ms == math.fsum(values) == 1.0
