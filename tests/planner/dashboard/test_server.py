"""The dashboard's HTTP(S) server in this process: a real server on loopback, a real SQLite store,
serve's TLS files and the operator token; and serve's --dashboard flag errors (exit 2, one line)."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
from pathlib import Path

import pytest

from hulk.errors import ConfigError
from hulk.http_server import ConnectionLimits
from planner import cli
from planner.core.fleet import Fleet, Link, Node
from planner.dashboard.server import DashboardServer, TokenCheck, check_exposure, parse_listen, tls_context
from planner.dashboard.snapshot import DashboardState
from planner.security.tls import init_pki, issue_cert
from planner.service.store import Store

TOKEN = "op-token-0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    return init_pki(tmp_path_factory.mktemp("pki"), ["127.0.0.1", "localhost"])


@pytest.fixture
def state(tmp_path):
    """The documents of a real store holding a two-city fleet."""
    nodes = (Node("bj-1", city="Beijing", gpus=8, memory_gb=320.0),
             Node("tk-1", city="Tokyo", gpus=4, memory_gb=160.0))
    store = Store(tmp_path / "planner.sqlite")
    store.import_fleet(Fleet(nodes, (Link("bj-1", "tk-1", rtt_ms=42.0, samples=5),)))
    dashboard = DashboardState(fleet="test", node_timeout_s=30, window_days=90)
    dashboard.refresh(store)
    store.close()
    yield dashboard
    dashboard.close()


@pytest.fixture
def serve_dashboard(state):
    servers = []

    def start(**kwargs) -> DashboardServer:
        server = DashboardServer("127.0.0.1:0", state, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def get(server: DashboardServer, path: str, headers: dict | None = None, method: str = "GET",
        context: ssl.SSLContext | None = None) -> tuple[int, dict, bytes]:
    conn = (http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
            if server.tls else http.client.HTTPConnection("127.0.0.1", server.port, timeout=10))
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_the_page_and_documents_need_the_token_as_basic_or_bearer(serve_dashboard):
    server = serve_dashboard(token=TokenCheck(TOKEN))
    for headers in ({}, basic("op", TOKEN[:-1] + "x"), {"Authorization": f"Bearer {TOKEN}x"},
                    {"Authorization": "Basic !!!"}, {"Authorization": TOKEN}):
        status, head, _ = get(server, "/api/fleet", headers)
        assert status == 401, headers
        assert head["WWW-Authenticate"].startswith('Basic realm="hulk dashboard"')
    assert get(server, "/")[0] == 401
    status, head, body = get(server, "/api/fleet", basic("anyone", TOKEN))
    assert status == 200 and head["Content-Type"] == "application/json"
    fleet = json.loads(body)
    assert [n["id"] for n in fleet["nodes"]] == ["bj-1", "tk-1"]
    assert fleet["links"][0]["rtt_ms"] == 42.0
    status, _, body = get(server, "/", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and b'<svg id="map"' in body


def test_read_only_routes_headers_and_no_way_out_of_the_static_folder(serve_dashboard):
    server = serve_dashboard()
    status, head, body = get(server, "/static/app.js")
    assert status == 200 and head["Content-Type"].startswith("text/javascript")
    assert "script-src 'self'" in head["Content-Security-Policy"]
    assert head["X-Frame-Options"] == "DENY" and head["Cache-Control"] == "no-store"
    for path in ("/static/../server.py", "/static/%2e%2e/server.py", "/api/nodes", "/etc/passwd",
                 "/static/"):
        assert get(server, path)[0] == 404, path
    assert get(server, "/api/jobs", method="POST")[0] == 501
    status, head, body = get(server, "/api/plan", method="HEAD")
    assert status == 200 and body == b"" and int(head["Content-Length"]) > 0
    assert json.loads(get(server, "/api/plan")[2])["status"] == "none"     # no jobs


def test_documents_answer_503_until_the_first_snapshot(tmp_path):
    state = DashboardState(fleet="test", node_timeout_s=30, window_days=90)
    server = DashboardServer("127.0.0.1:0", state)
    server.start()
    try:
        status, head, _ = get(server, "/api/fleet")
        assert status == 503 and head["Retry-After"] == "2"
    finally:
        server.close()


def test_https_with_serves_certificate_and_client_certificates_when_serve_requires_them(
        serve_dashboard, pki, tmp_path):
    server = serve_dashboard(tls=tls_context(pki["server_cert"], pki["server_key"]))
    trust = ssl.create_default_context(cafile=str(pki["ca"]))
    assert server.url.startswith("https://127.0.0.1:")
    assert get(server, "/api/jobs", context=trust)[0] == 200
    with pytest.raises(ssl.SSLError):     # a client that does not trust the fleet's CA
        get(server, "/api/jobs", context=ssl.create_default_context())

    mutual = serve_dashboard(tls=tls_context(pki["server_cert"], pki["server_key"], pki["ca"]))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(mutual, "/api/jobs", context=trust)
    from planner.security.tls import CertPaths
    client = issue_cert(CertPaths(pki["ca"], pki["ca_key"]), tmp_path, "operator", client=True)
    with_cert = ssl.create_default_context(cafile=str(pki["ca"]))
    with_cert.load_cert_chain(str(client.cert), str(client.key))
    assert get(mutual, "/api/jobs", context=with_cert)[0] == 200


def test_idle_connections_from_one_source_leave_the_operator_an_answer(serve_dashboard, pki):
    server = serve_dashboard(token=TokenCheck(TOKEN),
                             tls=tls_context(pki["server_cert"], pki["server_key"]))
    # More idle TCP connections than the server has slots, none starting TLS or a request.
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=15,
                                     source_address=("127.0.0.1", 0)) for _ in range(70)]
    try:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", server.port, timeout=15, source_address=("127.0.0.2", 0),
            context=ssl.create_default_context(cafile=str(pki["ca"])))
        try:
            conn.request("GET", "/api/fleet", headers={"Authorization": f"Bearer {TOKEN}"})
            answer = conn.getresponse()
            assert answer.status == 200 and "bj-1" in answer.read().decode()
        finally:
            conn.close()
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_that_never_starts_tls_is_closed_at_the_head_deadline(state, pki):
    server = DashboardServer("127.0.0.1:0", state, token=TokenCheck(TOKEN),
                             tls=tls_context(pki["server_cert"], pki["server_key"]),
                             limits=ConnectionLimits(head_timeout_s=0.3))
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
            try:
                assert sock.recv(1) == b""     # EOF within the 15 s bound, not a timeout
            except ConnectionResetError:
                pass
    finally:
        server.stop()
        server.httpd.server_close()


def test_addresses_public_binds_and_token_files_are_checked(tmp_path):
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8080", "host:", ":80", "host:http", "host:70000", ""):
        with pytest.raises(ConfigError, match="--dashboard: expected HOST:PORT"):
            parse_listen(bad)
    check_exposure("127.0.0.1", token=False)
    check_exposure("localhost", token=False)
    for public in ("0.0.0.0", "192.0.2.7", "planner.example.org", "::"):
        with pytest.raises(ConfigError, match="without authentication"):
            check_exposure(public, token=False)
        check_exposure(public, token=True)

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        TokenCheck.from_file(token)
    token.chmod(0o640)     # root:hulk-planner 0640 is fine
    assert TokenCheck.from_file(token).allows(f"Bearer {TOKEN}")
    token.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        TokenCheck.from_file(token)
    with pytest.raises(ConfigError, match="cannot read the token"):
        TokenCheck.from_file(tmp_path / "missing")


def run_serve(tmp_path, capsys, *flags: str) -> tuple[int, str]:
    code = cli.main(["serve", "--db", str(tmp_path / "p.sqlite"), "--listen", "127.0.0.1:0",
                     "--insecure", *flags])
    return code, capsys.readouterr().err.strip()


def test_serve_refuses_bad_dashboard_flags_with_one_line_and_exit_2(tmp_path, capsys):
    code, err = run_serve(tmp_path, capsys, "--dashboard", "0.0.0.0:0")
    assert code == 2 and "without authentication" in err and len(err.splitlines()) == 1
    code, err = run_serve(tmp_path, capsys, "--dashboard", "nonsense")
    assert code == 2 and "expected HOST:PORT" in err and len(err.splitlines()) == 1
    code, err = run_serve(tmp_path, capsys, "--dashboard-token", str(tmp_path / "t"))
    assert code == 2 and "needs --dashboard" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run_serve(tmp_path, capsys, "--dashboard", f"127.0.0.1:{port}")
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p.sqlite").exists()     # refused before the store was opened
