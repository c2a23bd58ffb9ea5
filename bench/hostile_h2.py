"""A minimal HTTP/2 client for the hostile round (bench/hostile_grpc.py): it sends what a gRPC
library would refuse to send (header names and values no library allows, frames out of order,
streams past the server's limit) from any loopback source address, and reads back what the
server answers: frames, the gRPC status of each stream, RST_STREAM and GOAWAY codes.

Standard library only. HPACK: requests are literal fields without indexing and without Huffman
coding; answers are decoded with the static and dynamic tables (a Huffman-coded string is kept
as ``"<huffman>"``: gRPC does not Huffman-code the values of ``grpc-status``/``grpc-message``).
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
MAX_FRAME = 16384                # the default SETTINGS_MAX_FRAME_SIZE
ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
          5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL",
          9: "COMPRESSION_ERROR", 11: "ENHANCE_YOUR_CALM"}
GRPC_CODES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
              4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED",
              8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE",
              12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS",
              16: "UNAUTHENTICATED"}
STATIC = [("", ""), (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
          (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
          (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
          (":status", "404"), (":status", "500"), ("accept-charset", ""),
          ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
          ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
          ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
          ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
          ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
          ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
          ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
          ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
          ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""),
          ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""),
          ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
          ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", "")]


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream & 0x7FFFFFFF) + payload


def _int(value: int, prefix: int, first: int = 0) -> bytes:
    top = (1 << prefix) - 1
    if value < top:
        return bytes([first | value])
    out, value = bytearray([first | top]), value - top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode(headers: list[tuple[bytes | str, bytes | str]]) -> bytes:
    """Literal header fields without indexing, names and values as given (nothing checked)."""
    out = bytearray()
    for name, value in headers:
        name = name.encode("latin-1") if isinstance(name, str) else name
        value = value.encode("latin-1") if isinstance(value, str) else value
        out += b"\x00" + _int(len(name), 7) + name + _int(len(value), 7) + value
    return bytes(out)


class Decoder:
    """HPACK decoding with the dynamic table (RFC 7541); Huffman strings become "<huffman>"."""

    def __init__(self) -> None:
        self.table: list[tuple[str, str]] = []
        self.size, self.max = 0, 4096

    def _get_int(self, data: bytes, at: int, prefix: int) -> tuple[int, int]:
        value = data[at] & ((1 << prefix) - 1)
        at += 1
        if value < (1 << prefix) - 1:
            return value, at
        shift = 0
        while True:
            b = data[at]
            at += 1
            value += (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value, at

    def _get_str(self, data: bytes, at: int) -> tuple[str, int]:
        huffman = bool(data[at] & 0x80)
        n, at = self._get_int(data, at, 7)
        raw = data[at:at + n]
        return ("<huffman>" if huffman else raw.decode("latin-1")), at + n

    def _entry(self, index: int) -> tuple[str, str]:
        if index < len(STATIC):
            return STATIC[index]
        return self.table[index - len(STATIC)]

    def _add(self, name: str, value: str) -> None:
        self.table.insert(0, (name, value))
        self.size += len(name) + len(value) + 32
        while self.size > self.max and self.table:
            n, v = self.table.pop()
            self.size -= len(n) + len(v) + 32

    def decode(self, data: bytes) -> list[tuple[str, str]]:
        out, at = [], 0
        while at < len(data):
            b = data[at]
            if b & 0x80:                        # indexed
                index, at = self._get_int(data, at, 7)
                out.append(self._entry(index))
            elif b & 0x40 or not b & 0x20:      # literal (incremental, without, never indexed)
                incremental = bool(b & 0x40)
                index, at = self._get_int(data, at, 6 if incremental else 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, at = self._get_str(data, at)
                value, at = self._get_str(data, at)
                out.append((name, value))
                if incremental:
                    self._add(name, value)
            else:                               # dynamic table size update
                self.max, at = self._get_int(data, at, 5)
                while self.size > self.max and self.table:
                    n, v = self.table.pop()
                    self.size -= len(n) + len(v) + 32
        return out


@dataclass
class Stream:
    headers: list[tuple[str, str]] = field(default_factory=list)
    data: int = 0
    reset: str | None = None
    ended: bool = False

    @property
    def grpc_status(self) -> str | None:
        for name, value in self.headers:
            if name == "grpc-status":
                return GRPC_CODES.get(int(value), value) if value.isdigit() else value
        return None

    @property
    def message(self) -> str:
        return next((v for n, v in self.headers if n == "grpc-message"), "")


class H2:
    """One HTTP/2 connection over TLS (ALPN h2), from ``source`` to ``target`` (HOST:PORT)."""

    def __init__(self, target: str, ca: bytes | None, *, source: str = "127.0.0.1",
                 timeout_s: float = 5.0, preface: bool = True):
        host, port = target.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=timeout_s,
                                       source_address=(source, 0))
        if ca is not None:
            ctx = ssl.create_default_context(cadata=ca.decode())
            ctx.set_alpn_protocols(["h2"])
            self.sock = ctx.wrap_socket(raw, server_hostname=host)
        else:
            self.sock = raw
        self.authority = target
        self.decoder = Decoder()
        self.streams: dict[int, Stream] = {}
        self.goaway: str | None = None
        self.closed = False
        self.buffer = b""
        self.next_id = 1
        self._headers_of: tuple[int, bytes, int] | None = None
        if preface:
            self.send(PREFACE + frame(SETTINGS, 0, 0))

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    def request_headers(self, path: str, extra: list[tuple] = ()) -> list[tuple]:
        return [(":method", "POST"), (":scheme", "https"), (":path", path),
                (":authority", self.authority), ("content-type", "application/grpc"),
                ("te", "trailers"), *extra]

    def open(self, path: str, extra: list[tuple] = (), *, body: bytes | None = None,
             end: bool = True) -> int:
        """A stream with a request's headers and, with ``body``, one gRPC message; ``end``: the
        request ends there (False: a half-open call). Returns the stream id."""
        sid = self.next_id
        self.next_id += 2
        block = encode(self.request_headers(path, list(extra)))
        end_now = end and body is None
        first, rest = block[:MAX_FRAME], block[MAX_FRAME:]
        flags = (END_STREAM if end_now else 0) | (0 if rest else END_HEADERS)
        out = frame(HEADERS, flags, sid, first)
        while rest:
            part, rest = rest[:MAX_FRAME], rest[MAX_FRAME:]
            out += frame(CONTINUATION, 0 if rest else END_HEADERS, sid, part)
        self.send(out)
        if body is not None:
            message = b"\x00" + struct.pack(">I", len(body)) + body
            self.send(frame(DATA, END_STREAM if end else 0, sid, message))
        self.streams[sid] = Stream()
        return sid

    def pump(self, seconds: float, *, until=None) -> None:
        """Read and handle frames for up to ``seconds`` (or until ``until()`` is true)."""
        deadline = time.monotonic() + seconds
        while not self.closed and time.monotonic() < deadline:
            if until is not None and until():
                return
            pending = self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0
            if not pending:
                ready, _, _ = select.select([self.sock], [], [],
                                            max(0.0, min(0.05, deadline - time.monotonic())))
                if not ready:
                    continue
            try:
                self.sock.settimeout(1.0)
                chunk = self.sock.recv(65536)
            except (ssl.SSLWantReadError, socket.timeout):
                continue
            except OSError:
                self.closed = True
                return
            if not chunk:
                self.closed = True
                return
            self.buffer += chunk
            self._frames()

    def _frames(self) -> None:
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < 9 + length:
                return
            kind, flags = self.buffer[3], self.buffer[4]
            sid = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
            payload = self.buffer[9:9 + length]
            self.buffer = self.buffer[9 + length:]
            self._handle(kind, flags, sid, payload)

    def _handle(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        stream = self.streams.setdefault(sid, Stream()) if sid else None
        if kind == SETTINGS and not flags & ACK:
            self.send(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.send(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else -1
            self.goaway = ERRORS.get(code, str(code))
        elif kind == RST_STREAM and stream is not None:
            code = int.from_bytes(payload[:4], "big") if len(payload) >= 4 else -1
            stream.reset, stream.ended = ERRORS.get(code, str(code)), True
        elif kind in (HEADERS, CONTINUATION) and stream is not None:
            block = payload
            if kind == HEADERS and flags & 0x8:          # padded
                block = block[1:len(block) - block[0]]
            if kind == HEADERS and flags & 0x20:         # priority
                block = block[5:]
            if kind == CONTINUATION and self._headers_of and self._headers_of[0] == sid:
                block = self._headers_of[1] + block
                flags |= self._headers_of[2]
            if not flags & END_HEADERS:
                self._headers_of = (sid, block, flags & END_STREAM)
                return
            self._headers_of = None
            try:
                stream.headers += self.decoder.decode(block)
            except (IndexError, ValueError):
                stream.headers.append(("x-undecodable", block.hex()[:80]))
            if flags & END_STREAM:
                stream.ended = True
        elif kind == DATA and stream is not None:
            stream.data += len(payload)
            if payload:       # give the window back: a large answer must not stall
                inc = struct.pack(">I", len(payload))
                self.send(frame(WINDOW_UPDATE, 0, 0, inc) + frame(WINDOW_UPDATE, 0, sid, inc))
            if flags & END_STREAM:
                stream.ended = True

    def wait(self, sid: int, seconds: float) -> Stream:
        self.pump(seconds, until=lambda: self.streams[sid].ended)
        return self.streams[sid]

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
