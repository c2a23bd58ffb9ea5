"""``HOST:PORT`` listen addresses, as the HTTP endpoints take them (``--metrics``,
``--dashboard``), and whether a host is loopback."""

from __future__ import annotations

import ipaddress

from hulk.errors import ConfigError


def parse_host_port(value: str, *, field: str | None, wants: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port); else a ConfigError naming
    ``field`` that says ``expected {wants}, got ...``."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"expected {wants}, got {value!r}", field=field)
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses; a name may resolve anywhere, so any
    other name counts as public."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
