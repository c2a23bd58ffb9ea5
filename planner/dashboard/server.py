"""The dashboard's HTTP(S) server: the page at ``/``, its JSON at ``/api/fleet``, ``/api/jobs``
and ``/api/plan``, read-only (GET and HEAD).

Authentication is an operator token (``serve --dashboard-token FILE``), given as the password of
HTTP basic authentication (any user name: browsers ask for it) or as ``Authorization: Bearer``;
compared in constant time. When serve runs with TLS the dashboard serves HTTPS with the same
certificate and, with ``--client-ca``, requires the same client certificates. Without a token it
binds only loopback addresses (``check_exposure``).

The server is ``hulk.http_server``'s (a thread per connection, connections capped per source
address and in all, the TLS handshake and each request's head under a deadline, so idle peers
cannot starve an operator); handlers only read the finished documents of ``DashboardState``,
never the store.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import os
import socket
import ssl
import stat
import threading
from pathlib import Path
from urllib.parse import urlsplit

from hulk.addresses import is_loopback, parse_host_port
from hulk.errors import ConfigError
from hulk.http_server import BoundedHandler, BoundedHTTPServer, ConnectionLimits
from planner.dashboard.snapshot import DOCUMENTS

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
STATIC_FILES = {"index.html": "text/html; charset=utf-8",
                "app.js": "text/javascript; charset=utf-8",
                "style.css": "text/css; charset=utf-8"}
MIN_TOKEN_CHARS = 16
REALM = "hulk dashboard"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


# ------------------------------------------------------------------------------ the address

def parse_listen(text: str, flag: str = "--dashboard") -> tuple[str, int]:
    """(host, port) of HOST:PORT (``[::1]:8080`` for IPv6); ConfigError otherwise."""
    return parse_host_port(text or "", field=flag, wants="HOST:PORT (e.g. 127.0.0.1:8080)")


def check_exposure(host: str, *, token: bool, flag: str = "--dashboard") -> None:
    """Refuse a public address without a token."""
    if not is_loopback(host) and not token:
        raise ConfigError(f"refusing to serve the dashboard on {host} without authentication: "
                          "give --dashboard-token FILE, or bind 127.0.0.1", field=flag)


# ----------------------------------------------------------------------------- authentication

class TokenCheck:
    """The operator token: basic authentication's password (any user) or a bearer token."""

    def __init__(self, token: str):
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"expected a token of at least {MIN_TOKEN_CHARS} characters",
                              field="--dashboard-token")
        self._token = token.encode()

    @classmethod
    def from_file(cls, path: str | os.PathLike, flag: str = "--dashboard-token") -> TokenCheck:
        """The first line of ``path``; a file every user may read is refused (chmod 600, or 640
        with the planner's group)."""
        try:
            info = os.stat(path)
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the token: {getattr(exc, 'strerror', None) or exc}",
                              path=str(path), field=flag) from exc
        if info.st_mode & stat.S_IRWXO:
            raise ConfigError(f"every user may read it (mode {stat.S_IMODE(info.st_mode):o}): "
                              "chmod 600 it", path=str(path), field=flag)
        token = (text.splitlines() or [""])[0].strip()
        try:
            return cls(token)
        except ConfigError as exc:
            raise ConfigError(str(exc).split(": ", 1)[-1], path=str(path), field=flag) from None

    def allows(self, header: str | None) -> bool:
        scheme, _, value = (header or "").strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer":
            given = value.encode()
        elif scheme.lower() == "basic":
            try:
                given = base64.b64decode(value, validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        else:
            return False
        return hmac.compare_digest(given, self._token)


def tls_context(cert: str | os.PathLike, key: str | os.PathLike,
                client_ca: str | os.PathLike | None = None) -> ssl.SSLContext:
    """Server TLS from serve's PEM files; with ``client_ca`` a client certificate it signed is
    required, as on gRPC."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
        if client_ca:
            context.load_verify_locations(cafile=str(client_ca))
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files for the dashboard: {exc}",
                          path=str(cert), field="--tls-cert") from exc
    return context


# ------------------------------------------------------------------------------------ serving

class DashboardHandler(BoundedHandler):
    server_version = "hulk-dashboard"
    sys_version = ""

    def do_GET(self) -> None:      # noqa: N802 (the standard library's names)
        self._respond(body=True)

    def do_HEAD(self) -> None:     # noqa: N802
        self._respond(body=False)

    def _respond(self, *, body: bool) -> None:
        app: DashboardServer = self.server.dashboard   # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        if app.token is not None and not app.token.allows(self.headers.get("Authorization")):
            self._send(401, b"authentication required\n", "text/plain; charset=utf-8", body,
                       {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})
            return
        if path in ("/", "/index.html"):
            path = "/static/index.html"
        if path.startswith("/static/") and path[8:] in app.static:
            name = path[8:]
            self._send(200, app.static[name], STATIC_FILES[name], body)
        elif path.startswith("/api/") and path[5:] in DOCUMENTS:
            doc = app.state.document(path[5:])
            if doc is None:
                self._send(503, b'{"error": "starting: no snapshot of the store yet"}\n',
                           "application/json", body, {"Retry-After": "2"})
            else:
                self._send(200, json.dumps(doc, allow_nan=False, separators=(",", ":")).encode(),
                           "application/json", body)
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8", body)

    def _send(self, code: int, payload: bytes, content_type: str, body: bool,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args) -> None:   # noqa: A002 (the base class's name)
        log.debug("dashboard %s: " + format, self.address_string(), *args)


class DashboardServer:
    """The dashboard on ``listen`` (HOST:PORT; port 0 picks a free one). Binds when made, so a bad
    address or a port in use is a ConfigError before serve starts anything else."""

    def __init__(self, listen: str, state, *, token: TokenCheck | None = None,
                 tls: ssl.SSLContext | None = None, flag: str = "--dashboard",
                 limits: ConnectionLimits = ConnectionLimits()):
        host, port = parse_listen(listen, flag)
        check_exposure(host, token=token is not None, flag=flag)
        self.state, self.token, self.tls = state, token, tls
        self.static = {name: (STATIC_DIR / name).read_bytes() for name in STATIC_FILES}
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.httpd = BoundedHTTPServer((host, port), DashboardHandler, limits=limits,
                                           family=family, tls=tls, name="dashboard")
        except (OSError, OverflowError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(f"cannot listen on {listen}: {reason}", field=flag) from exc
        self.httpd.dashboard = self
        if tls is None and not is_loopback(host):
            log.warning("dashboard on %s over plain HTTP (serve --insecure): its token travels in "
                        "clear; serve with --tls-cert/--tls-key", host)
        self.host, self.port = host, self.httpd.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dashboard-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop answering (the socket stays bound until ``close``)."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self.httpd.server_close()
        self.state.close()
