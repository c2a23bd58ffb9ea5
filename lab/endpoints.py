"""What an operator reaches in a running lab (``python -m lab.run --dashboard --metrics``): serve's
dashboard and ``/metrics``, and the broker with an operator's account, each printed as the
command that reaches it from the shell lab.run was started in.

The lab's addresses exist only inside its namespaces, so every command runs in the hub's
(``ip netns exec NETNS ...``), as an operator's shell on the planner host would:

- ``--dashboard [HOST:PORT]`` (default 10.77.0.1:8443, the hub's address, as deploy/INSTALL.md's
  ``0.0.0.0:8443``): serve's ``--dashboard`` with ``--dashboard-token WORK/dashboard.token``, a
  token made as INSTALL.md makes it (``openssl rand -hex 32``, mode 0600); HTTPS with the lab's
  CA under ``--secure``, plain HTTP without;
- ``--metrics [HOST:PORT]`` (default 127.0.0.1:9108, the hub's loopback, as INSTALL.md's
  drop-in): serve's ``--metrics``;
- the broker: under ``--secure`` the operator account of :mod:`lab.secure` (``hulk-operator``,
  read-only on ``hulk/v1/<fleet>/#``), printed with its password and a ``mosquitto_sub`` line
  with the CA; without it the anonymous plaintext broker.

``python -m lab.ctl restart planner -- --dashboard ...`` adds the same flags to a running lab's
serve (:func:`serve_flags` says which).
"""

from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path

from lab.netns import HUB_ADDRESS

DASHBOARD = f"{HUB_ADDRESS}:8443"
METRICS = "127.0.0.1:9108"
TOKEN_FILE = "dashboard.token"


def make_token(work: Path) -> Path:
    """WORK/dashboard.token: 32 random bytes in hex, mode 0600 (kept if it exists)."""
    path = work / TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    return path


def serve_flags(dashboard: str | None, metrics: str | None, token: Path | None) -> list[str]:
    """serve's flags for the dashboard (with its token file) and /metrics."""
    flags = []
    if dashboard:
        if token is None:
            raise ValueError("a lab dashboard needs a token file")
        flags += ["--dashboard", dashboard, "--dashboard-token", str(token)]
    if metrics:
        flags += ["--metrics", metrics]
    return flags


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _in_hub(netns: str, argv: list[str]) -> str:
    return f"ip netns exec {netns} " + " ".join(argv)


def dashboard_lines(netns: str, dashboard: str, token: Path, ca: Path | None) -> list[str]:
    """The dashboard's URL, who may open it, and curl lines for the page and its JSON."""
    scheme = "https" if ca is not None else "http"
    url = f"{scheme}://{dashboard}/"
    cacert = ["--cacert", shlex.quote(str(ca))] if ca is not None else []
    bearer = ["-H", f'"Authorization: Bearer $(cat {shlex.quote(str(token))})"']
    return [f"lab: dashboard {url} (any user name, the token in {token} as password, or a "
            "bearer token); in the hub:",
            "  " + _in_hub(netns, ["curl", "-s", *cacert, *bearer, f"{url}api/fleet"]),
            "  " + _in_hub(netns, ["curl", "-s", *cacert, *bearer, url, "| head -5"])]


def metrics_lines(netns: str, metrics: str) -> list[str]:
    url = f"http://{metrics}/metrics"
    return [f"lab: metrics {url}; in the hub:",
            "  " + _in_hub(netns, ["curl", "-s", url, "| grep '^hulk_nodes'"])]


def broker_lines(netns: str, fleet: str, *, port: int, user: str = "", password: str = "",
                 ca: Path | None = None) -> list[str]:
    """The operator's broker account (secure lab) or the anonymous broker, and a mosquitto_sub
    line that prints every message of the fleet's topics."""
    topic = f"hulk/v1/{fleet}/#"
    argv = ["mosquitto_sub", "-h", HUB_ADDRESS, "-p", str(port)]
    if ca is not None:
        argv += ["--cafile", shlex.quote(str(ca))]
    if user:
        argv += ["-u", user, "-P", shlex.quote(password)]
    argv += ["-t", shlex.quote(topic), "-v", "-W", "5"]
    if user:
        head = (f"lab: broker account {user}, password {password}: reads {topic}, publishes "
                "nothing (the ACL grants no write; mosquitto drops its publishes); in the hub:")
    else:
        head = f"lab: broker {HUB_ADDRESS}:{port}, anonymous (plaintext lab); in the hub:"
    return [head, "  " + _in_hub(netns, argv)]


def access_lines(netns: str, fleet: str, *, dashboard: str | None, metrics: str | None,
                 token: Path | None, hub=None, mqtt_port: int) -> list[str]:
    """Everything above for one lab (``hub``: the secure lab's :class:`lab.secure.SecureHub`)."""
    ca = hub.ca if hub is not None else None
    out = []
    if dashboard and token is not None:
        out += dashboard_lines(netns, dashboard, token, ca)
    if metrics:
        out += metrics_lines(netns, metrics)
    if hub is not None:
        from lab.secure import OPERATOR_ACCOUNT, TLS_PORT
        out += broker_lines(netns, hub.fleet, port=TLS_PORT, user=OPERATOR_ACCOUNT,
                            password=hub.operator_password, ca=ca)
    else:
        out += broker_lines(netns, fleet, port=mqtt_port)
    return out
