"""hulk/metrics.py: the /metrics endpoint on its own registry, in this process."""

from __future__ import annotations

import logging
import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from hulk.errors import ConfigError
from hulk.metrics import start_metrics_server


def test_two_endpoints_serve_their_own_registries_and_close():
    servers = []
    for n in (1, 2):
        registry = CollectorRegistry()
        Counter("hulk_test_things", "things", registry=registry).inc(n)
        servers.append(start_metrics_server("127.0.0.1:0", registry))
    try:
        for n, server in enumerate(servers, 1):
            with urllib.request.urlopen(server.url, timeout=10) as answer:
                assert f"hulk_test_things_total {float(n)}" in answer.read().decode()
    finally:
        for server in servers:
            server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(servers[0].url, timeout=2)


def test_a_port_in_use_is_a_one_line_config_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError) as caught:
            start_metrics_server(address, CollectorRegistry(), field="--metrics")
    assert str(caught.value).startswith(f"--metrics: cannot serve /metrics on {address}: ")
    assert "\n" not in str(caught.value)


def test_a_public_address_is_warned_about(caplog):
    caplog.set_level(logging.WARNING, logger="hulk.metrics")
    server = start_metrics_server("0.0.0.0:0", CollectorRegistry())
    server.close()
    assert "without authentication" in caplog.text
    caplog.clear()
    start_metrics_server("127.0.0.1:0", CollectorRegistry()).close()
    assert caplog.text == ""
