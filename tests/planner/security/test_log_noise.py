"""grpcio's tracebacks for what a peer without a token sent stay out of serve's log."""

from __future__ import annotations

import logging
import sys

from planner.security.guard import PeerEncodingNoise, quiet_peer_encoding_errors


def record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    try:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    except UnicodeDecodeError:
        exc_info = sys.exc_info()
    return logging.LogRecord("grpc._cython.cygrpc", level, __file__, 1, message, (), exc_info)


def test_a_peers_undecodable_header_or_ended_call_is_dropped_and_counted():
    noise = PeerEncodingNoise()
    for message in ("Invalid encoding on b'Bearer \\xff' (malformed token)",
                    "ExecuteBatchError raised in core by servicer method [/grpc.health.v1."
                    "Health/Check] (Compression bit set but no encoding configured)"):
        r = record(message)
        assert noise.filter(r) is logging.getLogger().isEnabledFor(logging.DEBUG)
        assert r.exc_info is None                 # never a traceback, even at DEBUG
    assert noise.dropped == 2
    other = record("Unexpected [ValueError] raised by servicer method [/hulk.v1.Planner/Report]")
    assert noise.filter(other) and other.exc_info is not None     # a real bug stays loud


def test_it_is_installed_once_on_grpcs_logger():
    first, second = quiet_peer_encoding_errors(), quiet_peer_encoding_errors()
    assert first is second
    assert sum(isinstance(f, PeerEncodingNoise)
               for f in logging.getLogger("grpc._cython.cygrpc").filters) == 1
