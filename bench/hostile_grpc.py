"""The hostile round's gRPC class: calls before authentication against a real `hulk-planner
serve` over TLS with enrolled nodes (bench/hostile_common.py Serve).

Each probe is held when what came back on the wire is one of the probe's expected answers (a
specific gRPC status such as UNAUTHENTICATED, INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
DEADLINE_EXCEEDED, UNIMPLEMENTED, or for bytes that are not gRPC at all an HTTP/2 reset, a GOAWAY
or the connection closed within a bound), serve logged no traceback meanwhile, and afterwards
(for the probes that hold calls: while they are held) an enrolled agent's Register and Heartbeat,
over a new connection, were answered within 1 s each. INTERNAL and UNKNOWN are not specific.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator

import grpc

from bench.call_holder import Holder
from bench.hostile_common import Outcome, Serve, enrolled_answers, register_request
from bench.hostile_h2 import (DATA, HEADERS, H2, PING, PREFACE, SETTINGS, WINDOW_UPDATE,
                              encode, frame)
from hulk.v1 import hulk_pb2

REGISTER, HEARTBEAT, REPORT = ("/hulk.v1.Planner/Register", "/hulk.v1.Planner/Heartbeat",
                               "/hulk.v1.Planner/Report")
CHECK = "/grpc.health.v1.Health/Check"
SOURCES = [f"127.0.0.{n}" for n in range(2, 12)]
UNAUTH = {"UNAUTHENTICATED"}
REFUSED = {"RST REFUSED_STREAM", "RST ENHANCE_YOUR_CALM"}   # HTTP/2's answers to excess streams
ALL = "each specific"      # a probe of many calls: every one ended with an expected status
WIRE = {"GOAWAY", "closed", "RST_STREAM"}       # what bytes that are not gRPC may get
WHERE_GUARD = "planner/security/guard.py (NodeGuard.intercept_service)"


def raw_call(serve: Serve, method: str, data: bytes, metadata=(), timeout: float = 10.0,
             channel=None) -> tuple[str, str]:
    own = channel is None
    channel = channel or serve.channel()
    try:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        call(data, metadata=metadata, timeout=timeout)
        return "OK", ""
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""
    finally:
        if own:
            channel.close()


def register_bytes(node: str = "n1", **extra) -> bytes:
    return register_request(node, **extra).SerializeToString()


def report_bytes(samples: int, node: str = "n1") -> bytes:
    now = int(time.time() * 1000)
    return hulk_pb2.ReportRequest(node_id=node, batch_id=os.urandom(8).hex(), samples=[
        hulk_pb2.Sample(peer_id="n2", sent_at_ms=now - i, kind=hulk_pb2.PROBE_KIND_ICMP,
                        payload_bytes=56, rtt_ms=1.0, timeout_ms=2000.0)
        for i in range(samples)]).SerializeToString()


def h2_call(serve: Serve, path: str, extra=(), body: bytes | None = b"", *, wait_s: float = 10,
            source: str = "127.0.0.1") -> tuple[str, str]:
    """One call over the raw HTTP/2 client: (grpc status, or RST_STREAM/GOAWAY/closed; detail)."""
    conn = H2(serve.target, serve.ca, source=source)
    try:
        sid = conn.open(path, list(extra), body=body)
        stream = conn.wait(sid, wait_s)
        if stream.grpc_status:
            return stream.grpc_status, stream.message[:160]
        if stream.reset:
            return "RST_STREAM", stream.reset
        if conn.goaway:
            return "GOAWAY", conn.goaway
        return ("closed" if conn.closed else "no answer"), f"headers {stream.headers[:3]}"
    finally:
        conn.close()


def wire_probe(serve: Serve, payload: bytes, *, tls: bool = True, preface: bool = False,
               bound_s: float = 15.0) -> tuple[str, str]:
    """Send ``payload`` and read until the server closes or says GOAWAY (within ``bound_s``). A
    connection still open then is left with ``LINGERING``: serve's idle bound (60 s with no call
    open) must close it, checked at the end of the class."""
    start = time.monotonic()
    try:
        conn = H2(serve.target, serve.ca if tls else None, preface=preface)
    except (OSError, ssl.SSLError) as err:
        return "closed", f"at connect: {type(err).__name__}"
    conn.send(payload)
    conn.pump(bound_s, until=lambda: conn.goaway is not None)
    took = time.monotonic() - start
    if conn.goaway or conn.closed:
        conn.close()
        return ("GOAWAY", f"{conn.goaway} after {took:.1f} s") if conn.goaway else (
            "closed", f"after {took:.1f} s")
    LINGERING.append((conn, start))
    return "lingering", f"still open after {bound_s:g} s"


LINGERING: list[tuple[H2, float]] = []
IDLE_BOUND_S = 60.0 + 15.0      # ServerLimits.max_connection_idle_s and a margin


def lingering_closed(name: str, conn: H2, since: float) -> tuple[str, str]:
    conn.pump(max(2.0, since + IDLE_BOUND_S - time.monotonic()),   # read what came meanwhile
              until=lambda: conn.goaway is not None)
    took = time.monotonic() - since
    state = "GOAWAY" if conn.goaway else "closed" if conn.closed else "open"
    conn.close()
    if state == "open":
        return "open", f"still open {took:.0f} s after the probe"
    return state, f"{conn.goaway or 'closed'} {took:.0f} s after the probe (the idle bound)"


def refused_stream(codes: dict[str, int], details: dict[str, str]) -> dict[str, int]:
    """UNAVAILABLE 'Received RST_STREAM with error code 7' is the client's name for a stream the
    server refused (REFUSED_STREAM: over MAX_CONCURRENT_STREAMS, safe to retry)."""
    out = dict(codes)
    if "error code 7" in details.get("UNAVAILABLE", "") and "UNAVAILABLE" in out:
        out["RST REFUSED_STREAM"] = out.pop("UNAVAILABLE")
    return out


def holder_probe(serve: Serve, count: int, kinds, token: str | None = None,
                 expected: set[str] = frozenset()) -> tuple[str, str, Holder]:
    holder = Holder(serve.target, serve.ca, count, token=token, kinds=kinds)
    ended = refused_stream(holder.ended, holder.details)
    bad = sorted(set(ended) - set(expected))
    summary = f"{count} {'/'.join(kinds)} calls: {ended}, {holder.open_count()} still open"
    return (bad[0] if bad else ALL), summary, holder


def raw_streams(serve: Serve, sources: list[str], conns: int, streams: int, path: str,
                body: bytes | None, end: bool) -> tuple[Counter, list[H2]]:
    """``conns`` connections from each source, ``streams`` calls on each; returns what the
    streams ended with so far and the connections (still open, for the caller to close)."""
    opened: list[H2] = []
    got: Counter = Counter()
    for source in sources:
        for _ in range(conns):
            try:
                conn = H2(serve.target, serve.ca, source=source)
            except OSError as err:
                got[f"connect {type(err).__name__}"] += 1
                continue
            opened.append(conn)
            for _ in range(streams):
                conn.open(path, [], body=body, end=end)
            conn.pump(0.2)     # SETTINGS acked at once, as any client does
    for conn in opened:
        conn.pump(0.05)
        for stream in conn.streams.values():
            got[stream.grpc_status or (f"RST {stream.reset}" if stream.reset else
                                       "GOAWAY" if conn.goaway else "open")] += 1
    return got, opened


# ------------------------------------------------------------------------------------ probes

Probe = Callable[[Serve], tuple[str, str]]


def probes(serve: Serve) -> Iterator[tuple[str, set[str], Probe]]:
    """(name, the answers that hold, the probe)."""
    t1, t2 = serve.tokens["n1"], serve.tokens["n2"]
    bearer = lambda t: (("authorization", f"Bearer {t}"),)  # noqa: E731
    fake = f"hulk1.{os.urandom(8).hex()}.{'A' * 43}"
    # -- no token
    yield "no token: Register", UNAUTH, lambda s: raw_call(s, REGISTER, register_bytes())
    yield "no token: Heartbeat", UNAUTH, lambda s: raw_call(
        s, HEARTBEAT, hulk_pb2.HeartbeatRequest(node_id="n1").SerializeToString())
    yield "no token: Report", UNAUTH, lambda s: raw_call(s, REPORT, report_bytes(10))
    yield "no token: 3 MB Report", UNAUTH, lambda s: raw_call(s, REPORT, b"\x0a" * (3 << 20))
    # -- wrong tokens
    yield "wrong token (well formed, unknown id)", UNAUTH, lambda s: raw_call(
        s, REGISTER, register_bytes(), bearer(fake))
    yield "wrong token (known id, wrong secret)", UNAUTH, lambda s: raw_call(
        s, REGISTER, register_bytes(), bearer(t1.rsplit(".", 1)[0] + "." + "B" * 43))
    yield "n2's token speaking for n1", {"PERMISSION_DENIED"}, lambda s: raw_call(
        s, REGISTER, register_bytes("n1"), bearer(t2))
    yield "Basic scheme", UNAUTH, lambda s: raw_call(
        s, REGISTER, register_bytes(), (("authorization", "Basic dXNlcjpwYXNz"),))
    yield "Bearer with nothing after it", UNAUTH, lambda s: raw_call(
        s, REGISTER, register_bytes(), (("authorization", "Bearer "),))
    yield "a bad token first, the good one second", UNAUTH | {"OK"}, lambda s: raw_call(
        s, REGISTER, register_bytes(), (("authorization", "Bearer x"),
                                        ("authorization", f"Bearer {t1}")))
    yield "40 wrong tokens in a row from the agent's address", UNAUTH | {"RESOURCE_EXHAUSTED"}, \
        lambda s: many_wrong(s, 40)
    # -- malformed metadata (bytes no gRPC library sends)
    yield "authorization not UTF-8", UNAUTH, lambda s: h2_call(
        s, REGISTER, [("authorization", b"Bearer \xff\xfe\x00bad")], register_bytes())
    yield "authorization with CR LF inside", UNAUTH, lambda s: h2_call(
        s, REGISTER, [("authorization", f"Bearer {t1}\r\nx-injected: 1")], register_bytes())
    yield "an upper-case header name", {"RST_STREAM", "GOAWAY", "INVALID_ARGUMENT"} | UNAUTH, \
        lambda s: h2_call(s, REGISTER, [("Authorization", f"Bearer {t1}")], register_bytes())
    yield "a header name with a space", {"RST_STREAM", "GOAWAY", "INVALID_ARGUMENT"} | UNAUTH, \
        lambda s: h2_call(s, REGISTER, [("bad name", "v")], register_bytes())
    yield "grpc-timeout not a timeout", {"INVALID_ARGUMENT", "RST_STREAM"} | UNAUTH, \
        lambda s: h2_call(s, REGISTER, [("grpc-timeout", "soon")], register_bytes())
    yield "grpc-timeout of 1 ns (valid token)", {"DEADLINE_EXCEEDED", "OK"}, lambda s: h2_call(
        s, REGISTER, [("grpc-timeout", "1n"), *bearer(t1)], register_bytes())
    yield "grpc-encoding nobody knows", {"UNIMPLEMENTED", "INVALID_ARGUMENT"} | UNAUTH, \
        lambda s: h2_call(s, REGISTER, [("grpc-encoding", "zstd-bogus"), *bearer(t1)],
                          register_bytes())
    yield "content-type not gRPC", {"RST_STREAM", "INVALID_ARGUMENT", "closed"} | UNAUTH, \
        lambda s: h2_call(s, REGISTER, [("content-type", "text/html")], register_bytes())
    # -- huge metadata
    yield "100 KiB authorization value", UNAUTH | {"RESOURCE_EXHAUSTED", "RST_STREAM"}, \
        lambda s: raw_call(s, REGISTER, register_bytes(),
                           (("authorization", "Bearer " + "A" * (100 << 10)),))
    yield "2,000 headers of 100 bytes (raw)", {"RESOURCE_EXHAUSTED", "RST_STREAM",
                                                "GOAWAY"} | UNAUTH, \
        lambda s: h2_call(s, REGISTER, [(f"x-h{i}", "v" * 100) for i in range(2000)],
                          register_bytes())
    yield "1 MiB header over CONTINUATION frames (raw)", {"RESOURCE_EXHAUSTED", "RST_STREAM",
                                                          "GOAWAY", "closed"} | UNAUTH, \
        lambda s: h2_call(s, REGISTER, [("x-big", "v" * (1 << 20))], register_bytes())
    # -- oversized and malformed messages
    yield "100 KiB Register (valid token)", {"INVALID_ARGUMENT"}, lambda s: raw_call(
        s, REGISTER, register_bytes(hostname="h" * (100 << 10)), bearer(t1))
    yield "5 MiB Report (valid token)", {"RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"}, \
        lambda s: raw_call(s, REPORT, b"\x0a" * (5 << 20), bearer(t1))
    yield "5 MiB Report (no token)", UNAUTH | {"RESOURCE_EXHAUSTED"}, lambda s: raw_call(
        s, REPORT, b"\x0a" * (5 << 20))
    yield "20,000 samples in one Report (valid token)", {"INVALID_ARGUMENT",
                                                          "RESOURCE_EXHAUSTED"}, \
        lambda s: raw_call(s, REPORT, report_bytes(20_000), bearer(t1))
    yield "bytes that are no protobuf (valid token)", {"INVALID_ARGUMENT"}, lambda s: raw_call(
        s, REGISTER, b"\xff" * 64, bearer(t1))
    yield "a message claiming 4 GiB, 10 bytes sent (raw, valid token)", {
        "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "RST_STREAM"}, lambda s: lie(s, t1)
    yield "a message flagged compressed, not compressed (valid token)", {
        "INVALID_ARGUMENT", "UNIMPLEMENTED", "RST_STREAM"}, lambda s: lie(s, t1, compressed=True)
    yield "Health/Check flagged compressed (public, no token)", {
        "INVALID_ARGUMENT", "UNIMPLEMENTED", "RST_STREAM"}, lambda s: lie(
            s, None, CHECK, compressed=True)
    # -- bytes that are not HTTP/2
    yield "TLS, then 4 KiB of random bytes", WIRE, lambda s: wire_probe(s, os.urandom(4096))
    yield "TLS, then an HTTP/1.1 request", WIRE | {"HTTP/1.1 answer"}, lambda s: wire_probe(
        s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    yield "plain TCP garbage to the TLS port", WIRE, lambda s: wire_probe(
        s, os.urandom(4096), tls=False)
    yield "preface, then a frame of unknown type claiming 16 MiB", WIRE, lambda s: wire_probe(
        s, PREFACE + frame(SETTINGS, 0, 0) + b"\xff\xff\xff\xee\x00\x00\x00\x00\x01" + b"x" * 100)
    yield "preface, then SETTINGS with a window over 2^31", WIRE, lambda s: wire_probe(
        s, PREFACE + frame(SETTINGS, 0, 0, b"\x00\x04\x80\x00\x00\x00"))
    yield "HEADERS on stream 0", WIRE, lambda s: wire_probe(
        s, PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x5, 0, encode([(":path", "/")])))
    yield "HPACK index out of range", WIRE, lambda s: wire_probe(
        s, PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x5, 1, b"\xff\xff\xff\x0f"))
    yield "DATA on a stream never opened", WIRE, lambda s: wire_probe(
        s, PREFACE + frame(SETTINGS, 0, 0) + frame(DATA, 1, 7, b"\x00" * 10))
    yield "WINDOW_UPDATE of 0", WIRE, lambda s: wire_probe(
        s, PREFACE + frame(SETTINGS, 0, 0) + frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"))
    yield "10,000 PINGs", WIRE, lambda s: wire_probe(
        s, PREFACE + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"\x00" * 8) * 10_000, bound_s=5)
    yield "TCP connections that never start TLS (50, from 10 sources)", {"closed"}, \
        lambda s: silent_connections(s, 50, tls=False)
    yield "TLS connections that never send the preface (50, from 10 sources)", {"closed",
                                                                                 "GOAWAY"}, \
        lambda s: silent_connections(s, 50, tls=True)
    # -- unknown methods
    yield "unknown method (no token)", {"UNIMPLEMENTED"} | UNAUTH, lambda s: raw_call(
        s, "/hulk.v1.Planner/Nope", b"")
    yield "unknown method (valid token)", {"UNIMPLEMENTED"}, lambda s: raw_call(
        s, "/hulk.v1.Planner/Nope", b"", bearer(t1))
    yield "server reflection", {"UNIMPLEMENTED"} | UNAUTH, lambda s: raw_call(
        s, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", b"")
    yield "path without a slash (raw)", {"UNIMPLEMENTED", "RST_STREAM"} | UNAUTH, \
        lambda s: h2_call(s, "Register", [], b"")
    yield "a 10 KiB path (raw)", {"UNIMPLEMENTED", "RST_STREAM"} | UNAUTH, lambda s: h2_call(
        s, "/" + "a" * 10240, [], b"")
    yield "path traversal in the method (raw)", {"UNIMPLEMENTED", "RST_STREAM"} | UNAUTH, \
        lambda s: h2_call(s, "/hulk.v1.Planner/../grpc.health.v1.Health/Check", [], b"")


def many_wrong(serve: Serve, n: int) -> tuple[str, str]:
    channel, codes = serve.channel(), Counter()
    for i in range(n):
        codes[raw_call(serve, REGISTER, register_bytes(), (
            ("authorization", f"Bearer hulk1.{i:016x}.{'C' * 43}"),), channel=channel)[0]] += 1
    channel.close()
    bad = sorted(set(codes) - {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED"})
    return (bad[0] if bad else "UNAUTHENTICATED"), repr(dict(codes))


def lie(serve: Serve, token: str | None, path: str = REGISTER, *,
        compressed: bool = False) -> tuple[str, str]:
    """A gRPC message that lies: flagged compressed (it is not), or claiming 4 GiB (10 bytes)."""
    conn = H2(serve.target, serve.ca)
    try:
        extra = [("authorization", f"Bearer {token}")] if token else []
        sid = conn.open(path, extra, body=None, end=False)
        body = register_bytes() if path == REGISTER else b""
        message = (b"\x01" + len(body).to_bytes(4, "big") + body if compressed
                   else b"\x00\xff\xff\xff\xff" + b"x" * 10)
        conn.send(frame(DATA, 1, sid, message))
        stream = conn.wait(sid, 15)
        return (stream.grpc_status or ("RST_STREAM" if stream.reset else "no answer"),
                stream.message or stream.reset or "")
    finally:
        conn.close()


def silent_connections(serve: Serve, count: int, *, tls: bool) -> tuple[str, str]:
    """``count`` connections from SOURCES that say nothing; all must be closed by serve within
    its handshake bound (10 s) plus a margin. Meanwhile the enrolled agent must get in."""
    host, port = serve.target.rsplit(":", 1)
    socks = []
    for i in range(count):
        raw = socket.create_connection((host, int(port)), timeout=5,
                                       source_address=(SOURCES[i % len(SOURCES)], 0))
        if tls:
            ctx = ssl.create_default_context(cadata=serve.ca.decode())
            ctx.set_alpn_protocols(["h2"])
            raw = ctx.wrap_socket(raw, server_hostname=host)
        socks.append(raw)
    ok, why = enrolled_answers(serve)
    start, still = time.monotonic(), list(socks)
    while still and time.monotonic() - start < 16:
        for sock in list(still):
            sock.settimeout(0.01)
            try:
                if sock.recv(4096) == b"":
                    still.remove(sock)
            except (socket.timeout, ssl.SSLWantReadError):
                pass
            except OSError:
                still.remove(sock)
        time.sleep(0.2)
    for sock in socks:
        sock.close()
    took = time.monotonic() - start
    if not ok:
        return "enrolled refused", why
    if still:
        return "open", f"{len(still)} of {count} still open after {took:.0f} s"
    return "closed", f"all {count} closed by serve within {took:.1f} s"


def held_probes(serve: Serve) -> Iterator[tuple[str, set[str], Callable]]:
    """Probes that hold calls or connections open while the enrolled agent is checked."""
    t2 = serve.tokens["n2"]
    ended = {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"} | REFUSED | {ALL}

    def hold(count, kinds, token=None):
        def run(s):
            code, detail, holder = holder_probe(s, count, kinds, token, ended)
            return code, detail, [holder]
        return run

    yield "1,100 half-open Register + Health/Watch, no token (one source)", ended, \
        hold(1100, ("watch", "register"))
    yield "5,000 half-open Register + Health/Watch, no token (one source)", ended, \
        hold(5000, ("watch", "register"))
    yield "600 half-open Health/Check (public, no token)", ended, hold(600, ("check",))
    yield "60 half-open Register with n2's valid token", ended, hold(60, ("register",), t2)

    def streams(count_conns, per, path, body, end, label):
        def run(s):
            got, conns = raw_streams(s, SOURCES, count_conns, per, path, body, end)
            bad = sorted(k for k in got if k not in ended | {"open"})
            return (bad[0] if bad else ALL), f"{label}: {dict(got)}", conns
        return run

    yield "5,000 half-open Register streams from 10 sources (raw, 5 connections each)", \
        ended | {"open"}, streams(5, 100, REGISTER, None, False, "streams")
    yield "2,000 half-open Health/Check streams from 10 sources (raw)", ended | {"open"}, \
        streams(2, 100, CHECK, None, False, "streams")
    yield "1,000 Health/Watch streams from 10 sources (raw)", ended | {"open"}, \
        streams(1, 100, "/grpc.health.v1.Health/Watch", b"", True, "streams")
    yield "500 streams at once on one connection (over MAX_CONCURRENT_STREAMS)", \
        ended | {"open"}, lambda s: streams_one(s, 500)
    yield "2,000 streams opened and reset at once (rapid reset)", {"closed", "GOAWAY", "open"}, \
        rapid_reset
    yield "1,000 unary calls at once without a token (one channel)", ended, many_calls


def streams_one(serve: Serve, count: int):
    got, conns = raw_streams(serve, ["127.0.0.1"], 1, count, REGISTER, None, False)
    bad = sorted(k for k in got if k not in {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED",
                                             "DEADLINE_EXCEEDED", "open"} | REFUSED)
    return (bad[0] if bad else ALL), f"{dict(got)}", conns


def rapid_reset(serve: Serve):
    conn = H2(serve.target, serve.ca, source="127.0.0.5")
    out = b""
    for i in range(2000):
        sid = 1 + 2 * i
        out += frame(HEADERS, 0x4, sid, encode(conn.request_headers(REGISTER))) + frame(
            3, 0, sid, b"\x00\x00\x00\x08")
    conn.send(out)
    conn.pump(2.0, until=lambda: conn.goaway is not None)
    state = "GOAWAY" if conn.goaway else ("closed" if conn.closed else "open")
    return state, f"connection {state} {conn.goaway or ''}".strip(), [conn]


def many_calls(serve: Serve):
    channel = serve.channel()
    call = channel.unary_unary(REGISTER, request_serializer=None, response_deserializer=None)
    futures = [call.future(register_bytes(), timeout=20) for _ in range(1000)]
    codes: Counter = Counter()
    details: dict[str, str] = {}
    for f in futures:
        try:
            f.result()
            codes["OK"] += 1
        except grpc.RpcError as err:
            codes[err.code().name] += 1
            details.setdefault(err.code().name, err.details() or "")
    codes = Counter(refused_stream(codes, details))
    bad = sorted(set(codes) - {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED"} - REFUSED)
    return (bad[0] if bad else ALL), f"{dict(codes)}", [channel]


def grpc_round(work, progress=None) -> Iterator[Outcome]:
    serve = Serve(work / "grpc").start()
    LINGERING.clear()
    later: list[tuple[str, set[str], str, float, tuple[bool, str], tuple[H2, float]]] = []
    try:
        ok, why = enrolled_answers(serve)
        if not ok:
            yield Outcome("enrolled agent before any probe", False, None, 0.0, why)
            return
        serve.new_log()
        for name, expected, probe in probes(serve):
            start = time.monotonic()
            try:
                code, detail = probe(serve)
            except Exception as err:   # the probe itself broke: report it, go on
                code, detail = "probe error", f"{type(err).__name__}: {err}"
            took = time.monotonic() - start
            if code == "lingering":     # judged once serve's idle bound has passed
                later.append((name, expected, detail, took, enrolled_answers(serve),
                              LINGERING.pop()))
                continue
            yield judge(serve, name, expected, code, detail, took)
        for name, expected, probe in held_probes(serve):
            start = time.monotonic()
            before = serve.rss_mib()
            try:
                code, detail, holders = probe(serve)
            except Exception as err:
                code, detail, holders = "probe error", f"{type(err).__name__}: {err}", []
            took = time.monotonic() - start
            detail += f"; serve RSS {before:.0f} -> {serve.rss_mib():.0f} MiB"
            yield judge(serve, name, expected, code, detail, took, holders)
        for name, expected, detail, took, enrolled, (conn, since) in later:
            code, end = lingering_closed(name, conn, since)
            yield judge(serve, name, expected, code, f"{detail}; {end}", took, enrolled=enrolled)
    finally:
        for conn, _ in LINGERING:
            conn.close()
        serve.stop()


def judge(serve: Serve, name: str, expected: set[str], code: str, detail: str, took: float,
          held_open=(), enrolled: tuple[bool, str] | None = None) -> Outcome:
    """Held: ``code`` expected, the enrolled agent answered (checked now, while ``held_open`` is
    still held, unless ``enrolled`` was checked earlier), no traceback in serve's log."""
    ok, said = enrolled or enrolled_answers(serve)
    for held in held_open:
        try:
            held.close()
        except Exception:   # noqa: BLE001 - closing what a probe held must not end the round
            pass
    log = serve.new_log()
    traceback = "Traceback" in log
    held = code in expected and ok and not traceback
    why = [] if code in expected else [f"answered {code}"]
    if not ok:
        why.append(said)
    if traceback:
        first = next((ln for ln in log.splitlines() if "ERROR" in ln), log.strip()[:160])
        why.append(f"serve logged a traceback: {first[:200]}")
    text = f"{detail}; {said}" if held else "; ".join(why) + f" ({detail})"
    where = "" if held else WHERE_GUARD
    if traceback and "ExecuteBatchError" in log:
        where = ("planner/security/guard.py (_enforce: context.abort on a call gRPC core has "
                 "already ended; grpc._cython.cygrpc logs the ExecuteBatchError with a traceback)")
    elif code == "INTERNAL" and any(w in detail for w in GRPC_CORE_WORDS):
        where = ("grpc core (grpcio's HTTP/2 metadata and message parsing) answers before any "
                 "interceptor runs; not in Hulk's code")
    elif traceback and "cygrpc" in log:
        where = ("grpcio's grpc._cython.cygrpc logger (an ERROR with a traceback for metadata "
                 "that is not UTF-8), let through by serve's logging (planner/cli.py "
                 "logging.basicConfig)")
    return Outcome(name, held, code, took, text[:700], expected="/".join(sorted(expected)),
                   where=where)


GRPC_CORE_WORDS = ("Illegal header key", "Error parsing", "Compression bit")
