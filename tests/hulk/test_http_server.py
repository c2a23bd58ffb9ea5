"""hulk/http_server.py through the /metrics endpoint, with real sockets on loopback: idle
connections from one source cannot starve another source, the server's threads stay bounded,
and a peer that is silent or drips its request's head is cut off at the deadline."""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from hulk.errors import ConfigError
from hulk.http_server import ConnectionLimits, source_key
from hulk.metrics import start_metrics_server
from tests.helpers.waits import wait_until

BOUND_S = 15.0   # the most any wait here may take before the test fails (never a pace)


@pytest.fixture
def serve_metrics():
    servers = []

    def start(limits: ConnectionLimits = ConnectionLimits()):
        registry = CollectorRegistry()
        Counter("hulk_test_things", "things", registry=registry).inc(3)
        server = start_metrics_server("127.0.0.1:0", registry, limits=limits)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=BOUND_S,
                                    source_address=(source, 0))


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF or reset), waiting at most BOUND_S."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def scrape(port: int, source: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=BOUND_S,
                                      source_address=(source, 0))
    try:
        conn.request("GET", "/metrics")
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def test_200_idle_connections_from_one_source_hold_few_threads_and_not_prometheus(serve_metrics):
    server = serve_metrics()
    limits = server.httpd.limits
    before = threading.active_count()
    idle = [connect(server.port, "127.0.0.1") for _ in range(200)]
    try:
        # Accepted in order: by the time this scrape is answered, all 200 were taken or refused.
        status, text = scrape(server.port, "127.0.0.2")
        assert status == 200 and "hulk_test_things_total 3.0" in text
        assert threading.active_count() <= before + limits.per_source + 1
        assert all(closed_by_server(sock) for sock in idle[limits.per_source:])
        assert server.httpd.open_connections <= limits.per_source + 1
    finally:
        for sock in idle:
            sock.close()


def closed_soon(sock: socket.socket, wait_s: float = 2.0) -> bool:
    ready, _, _ = select.select([sock], [], [], wait_s)
    return bool(ready) and closed_by_server(sock)


def test_the_total_cap_holds_over_many_sources(serve_metrics):
    limits = ConnectionLimits(head_timeout_s=120, per_source=4, total=16)
    server = serve_metrics(limits)
    idle = [connect(server.port, f"127.0.0.{2 + n // 4}") for n in range(40)]
    try:
        # The newcomers of the sixth source on take the places of the first sources' oldest
        # until every source holds its share; the total never moves past the cap.
        scrape(server.port, "127.0.0.1")     # accepted in order: all 40 were seen by now
        closed = sum(closed_soon(sock, 0.5) for sock in idle)
        # The scrape took one attacker's place and gave it up when it ended.
        assert closed == 40 - limits.total + 1 == server.httpd.refused + server.httpd.evicted
        assert wait_until(lambda: server.httpd.open_connections == limits.total - 1, BOUND_S)
    finally:
        for sock in idle:
            sock.close()


def test_slow_connections_from_many_sources_leave_the_operator_answered(serve_metrics):
    limits = ConnectionLimits(head_timeout_s=120, per_source=4, total=16)
    server = serve_metrics(limits)
    sources = [f"127.0.0.{n}" for n in range(2, 11)]          # nine sources, as in the issue
    slow: list[socket.socket] = []
    try:
        answered = 0
        for _ in range(10):
            for source in sources:     # every source holds all it may, again before each GET
                for _ in range(limits.per_source):
                    sock = connect(server.port, source)
                    sock.sendall(b"GET /metrics HTTP/1.1\r\n")    # a head that never ends
                    slow.append(sock)
            status, text = scrape(server.port, "127.0.0.1")
            answered += status == 200 and "hulk_test_things_total 3.0" in text
        assert answered == 10
        assert server.httpd.open_connections <= limits.total and server.httpd.evicted > 0
    finally:
        for sock in slow:
            sock.close()


def test_a_silent_connection_is_closed_at_the_head_deadline(serve_metrics):
    server = serve_metrics(ConnectionLimits(head_timeout_s=0.3))
    with connect(server.port, "127.0.0.1") as sock:
        assert closed_by_server(sock)
    # A kept-alive connection gets the same deadline for its next request.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=BOUND_S)
    conn.request("GET", "/metrics")
    assert conn.getresponse().read()
    assert closed_by_server(conn.sock)
    conn.close()


def test_a_dripped_request_head_is_cut_off_at_the_deadline(serve_metrics):
    server = serve_metrics(ConnectionLimits(head_timeout_s=1.0))
    with connect(server.port, "127.0.0.1") as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        stop = time.monotonic() + BOUND_S
        while time.monotonic() < stop:   # a byte every 0.1 s: each read is quick, the head is not
            try:
                sock.sendall(b"a")
            except OSError:     # closed already
                break
            if select.select([sock], [], [], 0.1)[0]:
                break
        assert closed_by_server(sock)


def test_limits_are_checked_and_sources_grouped():
    for bad in ({"per_source": 0}, {"total": 10**6}, {"head_timeout_s": 0},
                {"write_timeout_s": float("nan")}, {"per_source": 2.5}):
        with pytest.raises(ConfigError):
            ConnectionLimits(**bad)
    assert source_key("10.1.2.3") == "10.1.2.3"
    assert source_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert source_key("2001:db8:1:2::5") == source_key("2001:db8:1:2:ffff::9")
    assert source_key("2001:db8:1:2::5") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:3::5") != source_key("2001:db8:1:2::5")
