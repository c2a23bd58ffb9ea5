"""The MQTT contract shared by the planner and the agent: broker URLs and topic names.

Topics (docs/DESIGN.md): ``hulk/v1/<fleet>/nodes/<node_id>/placement`` (retained, QoS 1, per node;
an empty retained message clears it) and ``hulk/v1/<fleet>/plan`` (retained plan summary).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from hulk.errors import ConfigError
from hulk.validate import NAME_EXPECTED, is_name, shown

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = None
    tls: bool = False              # mqtts://: TLS to the broker (deploy/mosquitto/hulk.conf)
    ca: str | None = None          # mqtts://...?ca=PATH: the fleet CA; None: the system's CAs
    cert: str | None = None        # mqtts://...&cert=PATH&key=PATH: this client's certificate
    key: str | None = None         # and its private key (PEM), for a broker requiring them

    def __repr__(self) -> str:  # never print the password
        user = f"{self.username}:***@" if self.username else ""
        scheme = "mqtts" if self.tls else "mqtt"
        return f"BrokerAddress({scheme}://{user}{self.host}:{self.port})"

    __str__ = __repr__


def parse_broker_url(url: str, *, source: str = "--mqtt") -> BrokerAddress:
    """``mqtt://[user:pass@]HOST[:PORT]`` or
    ``mqtts://[user:pass@]HOST[:PORT][?ca=PATH][&cert=PATH&key=PATH]`` -> BrokerAddress; anything
    else is a ConfigError. ``cert`` and ``key`` (a client certificate, for a broker that requires
    one: mosquitto's ``require_certificate true``) come together."""
    text = (url or "").strip()
    expected = ("expected mqtt://[USER:PASS@]HOST[:PORT] or "
                "mqtts://[USER:PASS@]HOST[:PORT][?ca=PATH][&cert=PATH&key=PATH]")
    try:
        parts = urlsplit(text)
        port = parts.port
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ConfigError(f"{expected}, got {hide_password(text)!r}", field=source) from None
    tls = parts.scheme == "mqtts"
    options = {name: values[0] for name, values in query.items()}
    if (parts.scheme not in ("mqtt", "mqtts") or not parts.hostname
            or parts.path not in ("", "/")
            or (query and (not tls or not set(query) <= {"ca", "cert", "key"}
                           or any(len(values) != 1 or not values[0]
                                  for values in query.values())))
            or ("cert" in options) != ("key" in options)):
        raise ConfigError(f"{expected}, got {hide_password(text)!r}", field=source)
    return BrokerAddress(
        host=parts.hostname,
        port=port if port is not None else (DEFAULT_TLS_PORT if tls else DEFAULT_PORT),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        tls=tls,
        ca=options.get("ca"),
        cert=options.get("cert"),
        key=options.get("key"),
    )


def hide_password(url: str) -> str:
    """``url`` with the password between ``user:`` and ``@`` shown as ``***`` (in a URL too
    malformed to tell, all that comes before the ``@``)."""
    hidden = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", url)
    if hidden == url and "@" in url:
        hidden = re.sub(r"^[^@]*@", "***@", url)
    return hidden


def client_tls_kwargs(broker: BrokerAddress) -> dict[str, Any]:
    """Extra aiomqtt.Client arguments for a TLS broker ({} for plaintext, so fakes need not care)."""
    if not broker.tls:
        return {}
    import aiomqtt

    return {"tls_params": aiomqtt.TLSParameters(ca_certs=broker.ca, certfile=broker.cert,
                                                keyfile=broker.key)}


def check_name(value: str, what: str) -> str:
    """Fleet names and node ids become topic levels: no '/', '+', '#' or spaces."""
    if not is_name(value):
        raise ConfigError(f"expected {NAME_EXPECTED}, got {shown(value)}", field=what)
    return value


def placement_topic(fleet: str, node_id: str) -> str:
    return f"hulk/v1/{check_name(fleet, 'fleet')}/nodes/{check_name(node_id, 'node id')}/placement"


def plan_topic(fleet: str) -> str:
    return f"hulk/v1/{check_name(fleet, 'fleet')}/plan"
