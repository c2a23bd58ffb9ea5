"""Throughput-test records (hulk.wire.throughput): they survive protobuf bytes both ways, alone
and inside the messages that carry them, and reading one from the wire refuses every field out
of bounds with one line naming it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hulk.errors import InputError
from hulk.v1 import hulk_pb2
from hulk.wire.records import HeartbeatResult, RegisterRequest, ReportRequest
from hulk.wire.throughput import (CONNECT_DELAY_MS, GRACE_MS, MAX_BYTES, SECRET_BYTES,
                                  ThroughputResult, ThroughputSlot)

SLOT = ThroughputSlot(test_id="0123456789abcdef" * 2, role="receive", peer_id="tokyo-2",
                      peer_address="10.0.0.2", port=7500, start_ms=1_764_150_000_000,
                      duration_s=3.0, streams=4, secret=bytes(range(SECRET_BYTES)))
RESULT = ThroughputResult(test_id="fedcba9876543210" * 2, sender_id="tokyo-2",
                          start_ms=1_764_150_001_000, duration_s=2.5, bytes=3_125_000_000,
                          streams=4, gbps=10.0, ok=True)
FAILED = ThroughputResult(test_id="f" * 32, sender_id="osaka-1", start_ms=1_764_150_000_000,
                          duration_s=0.0, bytes=0, streams=0, gbps=0.0, ok=False,
                          detail="the sender never connected")


def _bytes_round_trip(record):
    message = record.to_proto()
    return type(record).from_proto(type(message).FromString(message.SerializeToString()))


@pytest.mark.parametrize("record", [SLOT, replace(SLOT, role="send"), RESULT, FAILED],
                         ids=["receive", "send", "ok", "failed"])
def test_records_round_trip_through_protobuf_bytes(record):
    assert _bytes_round_trip(record) == record


def test_the_carrying_messages_round_trip_with_their_new_fields():
    register = RegisterRequest("a", address="10.0.0.1", probe_port=7000, throughput_port=7500)
    assert _bytes_round_trip(register) == register
    assert register.to_proto().throughput_port == 7500
    beat = HeartbeatResult(5, throughput_slots=(SLOT, replace(SLOT, role="send")))
    assert _bytes_round_trip(beat) == beat
    report = ReportRequest("a", "b-1", throughput=(RESULT, FAILED))
    assert _bytes_round_trip(report) == report


def test_an_old_peer_reads_as_no_throughput():
    """An old agent sends no port; an old planner no slots; an old agent's Report no results."""
    assert RegisterRequest.from_proto(hulk_pb2.RegisterRequest(node_id="a")).throughput_port == 0
    assert HeartbeatResult.from_proto(hulk_pb2.HeartbeatResponse()).throughput_slots == ()
    assert ReportRequest.from_proto(hulk_pb2.ReportRequest(node_id="a")).throughput == ()


def test_the_receiver_closes_after_connect_delay_duration_and_grace():
    assert SLOT.end_ms == SLOT.start_ms + CONNECT_DELAY_MS + 3000 + GRACE_MS
    assert replace(SLOT, duration_s=0.75).end_ms == SLOT.start_ms + CONNECT_DELAY_MS + 750 + GRACE_MS


@settings(max_examples=200, derandomize=True, deadline=None)
@given(start_ms=st.integers(0, 2 ** 53), duration_s=st.floats(0.5, 30.0, exclude_min=True),
       streams=st.integers(1, 16), port=st.integers(1, 65535),
       secret=st.binary(min_size=SECRET_BYTES, max_size=SECRET_BYTES))
def test_any_slot_in_bounds_round_trips(start_ms, duration_s, streams, port, secret):
    slot = replace(SLOT, start_ms=start_ms, duration_s=duration_s, streams=streams, port=port,
                   secret=secret)
    assert _bytes_round_trip(slot) == slot


@settings(max_examples=200, derandomize=True, deadline=None)
@given(duration_s=st.floats(0.0, 60.0), size=st.integers(0, MAX_BYTES),
       gbps=st.floats(0.0, 1000.0), streams=st.integers(0, 16))
def test_any_result_in_bounds_round_trips(duration_s, size, gbps, streams):
    result = replace(RESULT, duration_s=duration_s, bytes=size, gbps=gbps, streams=streams)
    assert _bytes_round_trip(result) == result


BAD_SLOTS = [
    ("test_id", "ABCDEF0123456789" * 2, "32 lowercase hex digits"),
    ("test_id", "0" * 31, "32 lowercase hex digits"),
    ("test_id", "", "32 lowercase hex digits"),
    ("role", "both", "one of send, receive"),
    ("peer_id", "", "1-128 printable characters"),
    ("peer_id", "x" * 129, "1-128 printable characters"),
    ("peer_id", "a\nb", "1-128 printable characters"),
    ("peer_address", "", "1-255 printable characters"),
    ("port", 0, "between 1 and 65,535"),
    ("port", 65536, "between 1 and 65,535"),
    ("start_ms", -1, "unix ms between"),
    ("duration_s", 0.5, "seconds in (0.5, 30]"),
    ("duration_s", 30.001, "seconds in (0.5, 30]"),
    ("duration_s", math.nan, "seconds in (0.5, 30]"),
    ("duration_s", math.inf, "seconds in (0.5, 30]"),
    ("streams", 0, "between 1 and 16"),
    ("streams", 17, "between 1 and 16"),
    ("secret", b"", "32 bytes"),
    ("secret", bytes(31), "32 bytes"),
    ("secret", bytes(33), "32 bytes"),
]


@pytest.mark.parametrize("name, value, expected", BAD_SLOTS,
                         ids=[f"{n}={v!r}"[:40] for n, v, _ in BAD_SLOTS])
def test_a_slot_out_of_bounds_is_one_line_naming_its_field(name, value, expected):
    message = SLOT.to_proto()
    setattr(message, name, value)
    with pytest.raises(InputError) as caught:
        ThroughputSlot.from_proto(message, "throughput_slots[2]")
    text = str(caught.value)
    assert text.startswith(f"throughput_slots[2].{name}: expected ") and expected in text
    assert "\n" not in text and caught.value.field == f"throughput_slots[2].{name}"


BAD_RESULTS = [
    ("test_id", "g" * 32, "32 lowercase hex digits"),
    ("sender_id", "", "1-128 printable characters"),
    ("start_ms", -5, "unix ms between"),
    ("duration_s", -0.1, "seconds in [0, 60]"),
    ("duration_s", 60.5, "seconds in [0, 60]"),
    ("duration_s", math.nan, "seconds in [0, 60]"),
    ("bytes", MAX_BYTES + 1, "bytes between 0 and"),
    ("streams", 17, "between 0 and 16"),
    ("gbps", -1.0, "Gbit/s in [0, 1000]"),
    ("gbps", 1000.5, "Gbit/s in [0, 1000]"),
    ("gbps", math.inf, "Gbit/s in [0, 1000]"),
    ("gbps", math.nan, "Gbit/s in [0, 1000]"),
    ("detail", "x" * 201, "0-200 printable characters"),
    ("detail", "two\nlines", "0-200 printable characters"),
]


@pytest.mark.parametrize("name, value, expected", BAD_RESULTS,
                         ids=[f"{n}={v!r}"[:40] for n, v, _ in BAD_RESULTS])
def test_a_result_out_of_bounds_is_one_line_naming_its_field(name, value, expected):
    message = RESULT.to_proto()
    setattr(message, name, value)
    with pytest.raises(InputError) as caught:
        ThroughputResult.from_proto(message, "throughput[0]")
    text = str(caught.value)
    assert text.startswith(f"throughput[0].{name}: expected ") and expected in text
    assert "\n" not in text


def test_a_failed_result_must_say_zero_gbps():
    message = FAILED.to_proto()
    message.gbps = 1.5
    with pytest.raises(InputError, match=r"^throughput_result\.gbps: expected 0 for a failed"):
        ThroughputResult.from_proto(message)


def test_a_report_names_the_bad_result_and_a_heartbeat_keeps_a_bad_slot_for_the_agent():
    report = ReportRequest("a", "b", throughput=(RESULT,)).to_proto()
    report.throughput.add().CopyFrom(replace(RESULT, test_id="f" * 32).to_proto())
    report.throughput[1].streams = 99
    with pytest.raises(InputError, match=r"^throughput\[1\]\.streams: "):
        ReportRequest.from_proto(report)
    # A heartbeat reads its slots unchecked: one bad slot must not cost the heartbeat itself.
    beat = HeartbeatResult(1, peers_changed=True, throughput_slots=(SLOT,)).to_proto()
    beat.throughput_slots[0].streams = 99
    read = HeartbeatResult.from_proto(beat)
    assert read.peers_changed and read.throughput_slots[0].streams == 99
    with pytest.raises(InputError, match=r"^throughput_slots\[0\]\.streams: "):
        read.throughput_slots[0].check("throughput_slots[0]")


def test_records_built_in_process_are_checked_the_same_way():
    assert SLOT.check() is SLOT and RESULT.check() is RESULT
    with pytest.raises(InputError, match=r"^throughput_slot\.streams: "):
        replace(SLOT, streams=True).check()     # a bool is not a count
    with pytest.raises(InputError, match=r"^throughput_result\.ok: "):
        replace(RESULT, ok=1).check()
