"""A bounded HTTP(S) server for the auxiliary ports (the dashboard, ``/metrics``).

An unauthenticated peer must not be able to hold what an operator or Prometheus needs, so:

- each source address (an IPv6 source by its /64) holds at most ``per_source`` connections and
  the server at most ``total``; a connection over its source's cap is closed as soon as it is
  accepted. When the total is reached, a newcomer takes the place of its own source's
  longest-waiting connection that has not sent a request head yet (an idle kept-alive one, or
  one its client gave up on), else, if its source holds none or at least two fewer than the
  source holding the most, of that source's longest-waiting one (fair shares: many slow sources cannot
  lock out the operator); otherwise it is closed. Threads never exceed ``total`` plus the evicted ones, which end at
  once (their socket is shut down under them);
- the TLS handshake, the request line and the headers of every request must arrive within
  ``head_timeout_s`` of the server starting to wait for them: a deadline, not a per-read timeout,
  so a peer dripping a byte at a time is cut off as surely as a silent one, and a kept-alive
  connection idles no longer than that;
- sending an answer may take at most ``write_timeout_s`` (a peer that never reads).

Standard library only: the agent serves ``/metrics`` through it.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hulk.errors import ConfigError

log = logging.getLogger(__name__)

WARN_EVERY = 1000     # refused connections: the first is logged, then one in this many


@dataclass(frozen=True)
class ConnectionLimits:
    """Caps and timeouts of one server."""

    head_timeout_s: float = 5.0
    write_timeout_s: float = 30.0
    per_source: int = 8
    total: int = 64

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "write_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < 3600):
                raise ConfigError(f"expected {name} between 0 and 3600 seconds, got {value!r}")
        for name in ("per_source", "total"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool)
                    and 1 <= value <= 10_000):
                raise ConfigError(f"expected {name} between 1 and 10000 connections, got {value!r}")


def source_key(host: str) -> str:
    """The address a per-source cap counts: IPv4 as is (also IPv4-mapped IPv6), IPv6 by its /64
    (one host usually holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _DeadlineReader(io.RawIOBase):
    """The connection's reads: while ``deadline`` (time.monotonic) is set none waits past it,
    otherwise each waits at most ``timeout_s``."""

    def __init__(self, sock: socket.socket, timeout_s: float):
        self.sock, self.timeout_s = sock, timeout_s
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.deadline is None:
            self.sock.settimeout(self.timeout_s)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's head did not arrive in time")
            self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class BoundedHandler(BaseHTTPRequestHandler):
    """BaseHTTPRequestHandler with the server's head deadline on every request."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        limits: ConnectionLimits = self.server.limits   # type: ignore[attr-defined]
        deadline = time.monotonic() + limits.head_timeout_s
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(limits.head_timeout_s)
            self.request.do_handshake()
        self.timeout = limits.write_timeout_s
        super().setup()
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection, limits.write_timeout_s)
        self._reader.deadline = deadline
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        if self._reader.deadline is None:
            limits: ConnectionLimits = self.server.limits   # type: ignore[attr-defined]
            self._reader.deadline = time.monotonic() + limits.head_timeout_s
            self.server.head_waiting(self.request, True)   # type: ignore[attr-defined]
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()     # reads the headers: the head is complete after this
        self.server.head_waiting(self.request, False)      # type: ignore[attr-defined]
        self._reader.deadline = None
        self.connection.settimeout(self._reader.timeout_s)   # the answer's writes
        return ok


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, under ``limits``; ``tls`` wraps each connection (the handshake
    happens on the connection's own thread, under the head deadline)."""

    daemon_threads = True
    request_queue_size = 128   # a burst of connections waits to be accepted (and refused) in order

    def __init__(self, address, handler, *, limits: ConnectionLimits = ConnectionLimits(),
                 family: int = socket.AF_INET, tls: ssl.SSLContext | None = None,
                 name: str = "http"):
        self.address_family = family
        self.limits, self.tls, self.name = limits, tls, name
        self._lock = threading.Lock()
        self._per_source: dict[str, int] = {}
        self._open: dict[socket.socket, str] = {}
        self._waiting: dict[socket.socket, float] = {}   # no request head yet: since when
        self.refused = self.evicted = 0
        super().__init__(address, handler)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def get_request(self):
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def verify_request(self, request, client_address) -> bool:
        key = source_key(str(client_address[0]))
        victim = None
        with self._lock:
            held = self._per_source.get(key, 0)
            ok = held < self.limits.per_source
            if ok and len(self._open) >= self.limits.total:
                victim = self._victim(key, held)
                ok = victim is not None
                if victim is not None:
                    self._forget(victim)
                    self.evicted += 1
            if ok:
                self._per_source[key] = held + 1
                self._open[request] = key
                self._waiting[request] = time.monotonic()
            else:
                self.refused += 1
                refused = self.refused
        if victim is not None:
            try:    # its thread's read ends now and the thread with it
                socket.socket.shutdown(victim, socket.SHUT_RDWR)
            except OSError:
                pass
        if not ok and refused % WARN_EVERY == 1:
            log.warning("%s: refusing connections over the caps (%d from one source, %d in all); "
                        "%d refused so far, the latest from %s", self.name, self.limits.per_source,
                        self.limits.total, refused, key)
        return ok

    def _victim(self, newcomer: str, newcomer_holds: int) -> socket.socket | None:
        """The connection a newcomer from source ``newcomer`` takes the place of (caller holds
        the lock): the longest-waiting one with no request head yet of its own source (a client
        reconnecting replaces its own idle one), else of the source that holds the most, if that
        source holds two more than the newcomer's (equal shares do not flip back and forth) or
        the newcomer's holds none (a new source always gets in while a connection waits)."""
        best = None
        for sock, since in self._waiting.items():
            key = self._open[sock]
            held = self._per_source[key]
            rank = (key == newcomer, held, -since)
            fair = held > newcomer_holds + (newcomer_holds > 0)
            if (key == newcomer or fair) and (best is None or rank > best[0]):
                best = (rank, sock)
        return None if best is None else best[1]

    def _forget(self, request) -> None:
        """Frees the connection's slot (caller holds the lock); a second call does nothing."""
        self._waiting.pop(request, None)
        key = self._open.pop(request, None)
        if key is not None:
            left = self._per_source[key] - 1
            if left:
                self._per_source[key] = left
            else:
                del self._per_source[key]

    def head_waiting(self, request, waiting: bool) -> None:
        """The handler waits for a request head (an idle kept-alive connection too) or has one."""
        with self._lock:
            if request not in self._open:
                return
            if waiting:
                self._waiting.setdefault(request, time.monotonic())
            else:
                self._waiting.pop(request, None)

    def _release(self, request) -> None:
        with self._lock:
            self._forget(request)

    def process_request(self, request, client_address) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)    # no thread started: the slot is free again
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def handle_error(self, request, client_address) -> None:
        # A peer that breaks off, fails the TLS handshake or runs out of time: not our fault.
        log.debug("%s: connection from %s ended with an error", self.name, client_address,
                  exc_info=True)

    def server_close(self) -> None:
        with self._lock:
            still_open = list(self._open)
        for sock in still_open:   # wakes their threads now, so closing joins them promptly
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
        super().server_close()
