"""The throughput-test records of the gRPC contract: the slots the planner hands both agents of a
test (in a HeartbeatResponse) and the result the receiving agent reports (in a ReportRequest).

Both records convert themselves like those of :mod:`hulk.wire.records`; unlike those, reading one
from the wire checks it (``from_proto(msg, where)``): a slot tells an agent to open a port and a
result becomes a measured bandwidth that plans trust, so a value out of bounds is an InputError
naming the field, one line. ``check(where)`` runs the same checks on a record built in process.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from hulk.errors import InputError
from hulk.v1 import hulk_pb2
from hulk.validate import shown

SECRET_BYTES = 32              # the one-time HMAC key both sides of a test share
CONNECT_DELAY_MS = 500         # the sender connects this long after the receiver starts listening
GRACE_MS = 3000                # the receiver stays open this long after the sender should be done
MIN_DURATION_S = 0.5           # exclusive: a shorter test measures its own start-up
MAX_DURATION_S = 30.0
MAX_STREAMS = 16
MAX_GBPS = 1000.0              # above any link a fleet has: a larger figure is a bug or a lie
MAX_RESULT_DURATION_S = 60.0   # the measured window, inside one slot
MAX_BYTES = int(MAX_GBPS * 1e9 / 8 * MAX_RESULT_DURATION_S)
MAX_DETAIL_CHARS = 200
MAX_ID_CHARS = 128             # a node id (hulk.validate.NAME_RE)
MAX_ADDRESS_CHARS = 255        # a host name or an IP address
MAX_MS = 2 ** 53               # unix milliseconds; any int64 a float still holds exactly
ROLES = ("send", "receive")
TEST_ID_RE = re.compile(r"[0-9a-f]{32}")


def _fail(where: str, name: str, expected: str, got: object) -> InputError:
    return InputError(f"expected {expected}, got {shown(got)}", field=f"{where}.{name}")


def _text(where: str, name: str, value: object, max_chars: int, *, empty: bool = False) -> None:
    if not isinstance(value, str) or (not value and not empty) or len(value) > max_chars \
            or not value.isprintable():
        least = 0 if empty else 1
        raise _fail(where, name, f"{least}-{max_chars} printable characters", value)


def _integer(where: str, name: str, value: object, low: int, high: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(where, name, f"{what} between {low:,} and {high:,}", value)


def _number(where: str, name: str, value: object, low: float, high: float, unit: str, *,
            above: bool = False) -> None:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and (low < value if above else low <= value) and value <= high)
    if not ok:
        bracket = "(" if above else "["
        raise _fail(where, name, f"{unit} in {bracket}{low:g}, {high:g}]", value)


def _test_id(where: str, value: object) -> None:
    if not isinstance(value, str) or not TEST_ID_RE.fullmatch(value):
        raise _fail(where, "test_id", "32 lowercase hex digits", value)


@dataclass(frozen=True)
class ThroughputSlot:
    """One side of one test, as the planner hands it to an agent (HeartbeatResponse)."""

    test_id: str               # 32 lowercase hex digits, unique per test
    role: str                  # "send" | "receive"
    peer_id: str               # the other node's id
    peer_address: str          # the receiver's address for the sender; the sender's for the receiver
    port: int                  # the receiver's throughput port (both sides get it)
    start_ms: int              # unix ms: the receiver listens from here; the sender connects later
    duration_s: float          # seconds the sender sends
    streams: int               # parallel TCP streams
    secret: bytes              # SECRET_BYTES random bytes, one-time, the same for both sides

    @property
    def end_ms(self) -> int:
        """Unix ms after which the receiver is closed."""
        return self.start_ms + CONNECT_DELAY_MS + round(self.duration_s * 1000) + GRACE_MS

    def check(self, where: str = "throughput_slot") -> ThroughputSlot:
        """This slot, or an InputError naming the first field out of bounds."""
        _test_id(where, self.test_id)
        if self.role not in ROLES:
            raise _fail(where, "role", "one of " + ", ".join(ROLES), self.role)
        _text(where, "peer_id", self.peer_id, MAX_ID_CHARS)
        _text(where, "peer_address", self.peer_address, MAX_ADDRESS_CHARS)
        _integer(where, "port", self.port, 1, 65535, "a TCP port")
        _integer(where, "start_ms", self.start_ms, 0, MAX_MS, "unix ms")
        _number(where, "duration_s", self.duration_s, MIN_DURATION_S, MAX_DURATION_S, "seconds",
                above=True)
        _integer(where, "streams", self.streams, 1, MAX_STREAMS, "a number of streams")
        if not isinstance(self.secret, bytes) or len(self.secret) != SECRET_BYTES:
            size = len(self.secret) if isinstance(self.secret, (bytes, bytearray)) else self.secret
            raise _fail(where, "secret", f"{SECRET_BYTES} bytes", size)
        return self

    def to_proto(self) -> hulk_pb2.ThroughputSlot:
        return hulk_pb2.ThroughputSlot(**{f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_proto(cls, msg: hulk_pb2.ThroughputSlot, where: str = "throughput_slot", *,
                   check: bool = True) -> ThroughputSlot:
        """The slot ``msg`` holds; checked unless ``check`` is False (then as sent)."""
        slot = cls(**{f.name: getattr(msg, f.name) for f in fields(cls)})
        return slot.check(where) if check else slot


@dataclass(frozen=True)
class ThroughputResult:
    """What the receiving agent measured (ReportRequest); stored once per test_id."""

    test_id: str
    sender_id: str             # the peer that sent
    start_ms: int              # first measured byte, unix ms
    duration_s: float          # measured window (s)
    bytes: int                 # bytes received in the measured window
    streams: int               # streams that authenticated
    gbps: float                # bytes*8/duration_s/1e9
    ok: bool                   # False: the test failed (peer never came, auth failed...); gbps 0
    detail: str = ""           # one line, why it failed

    def check(self, where: str = "throughput_result") -> ThroughputResult:
        """This result, or an InputError naming the first field out of bounds."""
        _test_id(where, self.test_id)
        _text(where, "sender_id", self.sender_id, MAX_ID_CHARS)
        _integer(where, "start_ms", self.start_ms, 0, MAX_MS, "unix ms")
        _number(where, "duration_s", self.duration_s, 0.0, MAX_RESULT_DURATION_S, "seconds")
        _integer(where, "bytes", self.bytes, 0, MAX_BYTES, "a number of bytes")
        _integer(where, "streams", self.streams, 0, MAX_STREAMS, "a number of streams")
        _number(where, "gbps", self.gbps, 0.0, MAX_GBPS, "Gbit/s")
        if not isinstance(self.ok, bool):
            raise _fail(where, "ok", "true or false", self.ok)
        if not self.ok and self.gbps != 0.0:
            raise _fail(where, "gbps", "0 for a failed test", self.gbps)
        _text(where, "detail", self.detail, MAX_DETAIL_CHARS, empty=True)
        return self

    def to_proto(self) -> hulk_pb2.ThroughputResult:
        return hulk_pb2.ThroughputResult(**{f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_proto(cls, msg: hulk_pb2.ThroughputResult,
                   where: str = "throughput_result") -> ThroughputResult:
        return cls(**{f.name: getattr(msg, f.name) for f in fields(cls)}).check(where)
