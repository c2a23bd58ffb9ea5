"""The Prometheus ``/metrics`` endpoint both programs serve (``--metrics HOST:PORT``).

Each program keeps its metrics in its own ``CollectorRegistry`` (never prometheus-client's global
default), so tests can run several planners and agents in one process. The endpoint is
prometheus-client's own threaded HTTP server; it is off unless ``--metrics`` is given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hulk.addresses import is_loopback, parse_host_port
from hulk.errors import ConfigError

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


def start_metrics_server(address: str, registry: Any, *, field: str = "--metrics") -> MetricsServer:
    """Serve ``registry`` at http://HOST:PORT/metrics on a daemon thread. A bad address or a port
    that cannot be bound (in use, not permitted, unknown host) is a one-line ConfigError."""
    from prometheus_client import start_http_server

    host, port = parse_metrics_address(address, field=field)
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise ConfigError(f"cannot serve /metrics on {address}: {err.strerror or err}",
                          field=field) from None
    if not is_loopback(host):
        log.warning("serving /metrics on %s without authentication: let only your Prometheus "
                    "reach it (firewall, management network)", address)
    return MetricsServer(host, httpd.server_address[1], httpd, thread)
