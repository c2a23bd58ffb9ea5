"""The Prometheus ``/metrics`` endpoint both programs serve (``--metrics HOST:PORT``).

Each program keeps its metrics in its own ``CollectorRegistry`` (never prometheus-client's global
default), so tests can run several planners and agents in one process. The endpoint is off
unless ``--metrics`` is given; it is served by ``hulk.http_server`` (connections capped per source
and in all, a deadline on each request's head), with prometheus-client's WSGI application
rendering the registry (format negotiation, gzip, ``name[]`` filters).
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hulk.addresses import is_loopback, parse_host_port
from hulk.errors import ConfigError
from hulk.http_server import BoundedHandler, BoundedHTTPServer, ConnectionLimits

log = logging.getLogger(__name__)


def parse_metrics_address(text: str, *, field: str | None = "--metrics") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port); a ConfigError names ``field``
    (None: the message alone)."""
    return parse_host_port(str(text).strip(), field=field,
                           wants="HOST:PORT to serve /metrics on (e.g. 127.0.0.1:9108)")


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``close()`` stops it."""

    host: str
    port: int
    httpd: Any
    thread: Any

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class _MetricsHandler(BoundedHandler):
    server_version = "hulk-metrics"
    sys_version = ""

    def do_GET(self) -> None:       # noqa: N802 (the standard library's names)
        url = urlsplit(self.path)
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": url.path, "QUERY_STRING": url.query,
                   "HTTP_ACCEPT": self.headers.get("Accept"),
                   "HTTP_ACCEPT_ENCODING": self.headers.get("Accept-Encoding")}
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            answer.update(status=int(status.split(" ", 1)[0]), headers=headers)

        payload = b"".join(self.server.app(environ, start_response))   # type: ignore[attr-defined]
        self.send_response(answer["status"])
        for name, value in answer["headers"]:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args) -> None:   # noqa: A002 (the base class's name)
        log.debug("metrics %s: " + format, self.address_string(), *args)


def start_metrics_server(address: str, registry: Any, *, field: str = "--metrics",
                         limits: ConnectionLimits = ConnectionLimits()) -> MetricsServer:
    """Serve ``registry`` at http://HOST:PORT/metrics on a daemon thread, under ``limits``. A bad
    address or a port that cannot be bound (in use, not permitted, unknown host) is a one-line
    ConfigError."""
    from prometheus_client import make_wsgi_app

    host, port = parse_metrics_address(address, field=field)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        httpd = BoundedHTTPServer((host, port), _MetricsHandler, limits=limits, family=family,
                                  name="/metrics")
    except (OSError, OverflowError) as err:
        reason = getattr(err, "strerror", None) or err
        raise ConfigError(f"cannot serve /metrics on {address}: {reason}", field=field) from None
    httpd.app = make_wsgi_app(registry)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                              name="metrics-http", daemon=True)
    thread.start()
    if not is_loopback(host):
        log.warning("serving /metrics on %s without authentication: let only your Prometheus "
                    "reach it (firewall, management network)", address)
    return MetricsServer(host, httpd.server_address[1], httpd, thread)
