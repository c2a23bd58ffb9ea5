"""An agent that cannot verify the planner's or the broker's certificate (no CA, another CA) ends
with one line naming what to fix and exit code 2 rather than retrying for ever while looking
healthy; a planner that is merely down is retried. A real `hulk-planner serve` over TLS, the
shipped mosquitto configuration over TLS, real `hulk-agent` processes."""

from __future__ import annotations

import subprocess
import time

import pytest

from hulk import errors
from planner.security.tls import init_pki
from tests.helpers.ports import free_port
from tests.helpers.processes import agent_command, planner_command, stop_process, worktree_env
from tests.helpers.shipped_broker import ShippedBroker
from tests.helpers.waits import wait_until

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The shipped broker (TLS, accounts by enroll) and `serve` over TLS on the same db and CA."""
    broker = ShippedBroker()
    node = broker.enroll("n1")
    broker.start()
    where = tmp_path_factory.mktemp("planner")
    port = free_port()
    log = where / "planner.log"
    tls = broker.dir / "tls"
    with open(log, "w") as out:
        proc = subprocess.Popen([*planner_command(), "serve", "--db", str(broker.db), "--listen",
                                 f"127.0.0.1:{port}", "--tls-cert", str(tls / "server.pem"),
                                 "--tls-key", str(tls / "server.key")],
                                env=worktree_env(), stdout=out, stderr=subprocess.STDOUT)
    wait_until(lambda: "listening on" in log.read_text(), 30, "serve to listen",
               detail=log.read_text)
    other = init_pki(where / "other-ca", ["127.0.0.1"])["ca"]   # a CA that signed nothing here
    yield {"planner": f"127.0.0.1:{port}", "ca": broker.ca, "other_ca": other,
           "token": node["token"], "password": node["mqtt_password"], "broker": broker}
    stop_process(proc)
    broker.stop()


def agent(fleet, tmp_path, *, ca, planner=None, broker_ca=None) -> subprocess.Popen:
    """``broker_ca``: None for no broker, "" for an mqtts URL without ?ca=."""
    argv = [*agent_command(), "--planner", planner or fleet["planner"], "--node-id", "n1",
            "--state-dir", str(tmp_path / "state"), "--address", "127.0.0.1"]
    if ca is not None:
        argv += ["--ca", str(ca)]
    if broker_ca is not None:
        port = fleet["broker"].tls_port
        query = f"?ca={broker_ca}" if broker_ca else ""
        argv += ["--mqtt", f"mqtts://n1:{fleet['password']}@127.0.0.1:{port}{query}"]
    return subprocess.Popen(argv, env={**worktree_env(), "HULK_TOKEN": fleet["token"]},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended(proc: subprocess.Popen, timeout: float = 40) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        raise AssertionError("the agent is still running: " + proc.communicate()[1][-2000:])
    return proc.returncode, err


@pytest.mark.parametrize("which", ["none", "other"])
def test_a_planner_certificate_that_does_not_verify_ends_the_agent_with_exit_2(fleet, tmp_path,
                                                                               which):
    ca = None if which == "none" else fleet["other_ca"]
    code, err = ended(agent(fleet, tmp_path, ca=ca))
    last = err.strip().splitlines()[-1]
    assert code == 2, err[-2000:]
    assert last.startswith(f"hulk-agent: TLS: the certificate of the planner {fleet['planner']} "
                           "does not verify against "), last
    assert ("the system's CAs (no CA is configured)" if ca is None else f"the CA in {ca}") in last
    assert "set ca (HULK_CA, --ca) to the fleet's ca.pem" in last
    assert f"{errors.CERTIFICATE_FAILURES_FATAL} times in a row" in last
    assert "Traceback" not in err


@pytest.mark.parametrize("which", ["none", "other"])
def test_a_broker_certificate_that_does_not_verify_ends_the_agent_with_exit_2(fleet, tmp_path,
                                                                              which):
    """The planner verifies (right CA); the broker URL has no ?ca=, or another CA."""
    broker_ca = "" if which == "none" else fleet["other_ca"]
    code, err = ended(agent(fleet, tmp_path, ca=fleet["ca"], broker_ca=broker_ca))
    last = err.strip().splitlines()[-1]
    assert code == 2, err[-2000:]
    assert "TLS: the certificate of the broker 127.0.0.1:" in last, last
    assert ("the system's CAs (no CA is configured)" if which == "none"
            else f"the CA in {fleet['other_ca']}") in last
    assert "?ca= in the broker URL (HULK_MQTT, --mqtt)" in last
    assert "Traceback" not in err


def test_with_the_right_cas_the_agent_registers_and_subscribes(fleet, tmp_path):
    """The same agent with both CAs right runs on (the control for the two above)."""
    proc = agent(fleet, tmp_path, ca=fleet["ca"], broker_ca=fleet["ca"])
    try:
        lines: list[str] = []

        def subscribed() -> bool:
            lines.append(proc.stderr.readline())
            return "subscribed to hulk/v1/" in lines[-1] or proc.poll() is not None
        wait_until(subscribed, 30, "the agent to subscribe", detail=lambda: "".join(lines))
        assert proc.poll() is None, "".join(lines)
    finally:
        stop_process(proc)


def test_a_planner_that_is_down_is_retried_not_fatal(fleet, tmp_path):
    proc = agent(fleet, tmp_path, ca=fleet["ca"], planner=f"127.0.0.1:{free_port()}")
    try:
        time.sleep(8)   # past the attempts that end an agent whose certificate fails (~3 s)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
    finally:
        stop_process(proc)
    assert "register failed" in proc.communicate()[1]


@pytest.mark.parametrize("message, certificate", [
    ("Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
     "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK", True),
    ("Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1a000064:ECDSA routines:"
     "OPENSSL_internal:BAD_SIGNATURE: certificate signature failure: OK", True),
    ("Custom verification check failed with error: UNAUTHENTICATED: Hostname Verification Check "
     "failed.", True),
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:5: Failed to "
     "connect to remote host: Connection refused", False),
    ("Deadline Exceeded", False),
])
def test_only_a_certificate_failure_becomes_a_certificate_error(message, certificate):
    """The texts grpcio 1.85 gives for no CA, another CA with the same name, a wrong host, and
    two outages (seen with the real server above)."""
    import grpc

    err = errors.from_grpc(grpc.StatusCode.UNAVAILABLE, message)
    assert isinstance(err, errors.UnavailableError)
    assert isinstance(err, errors.CertificateError) is certificate
