"""mTLS from the agent's side (the agent presents its client certificate). A real `hulk-planner serve --client-ca` and a real mosquitto with
``require_certificate true``: without the node's certificate the agent is refused; with it (config
file fields, HULK_CLIENT_CERT/HULK_CLIENT_KEY, flags; ``?cert=&key=`` in the broker URL) it is in.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from agent.config import load_config
from agent.placement import PlacementSubscriber
from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime
from hulk import errors
from hulk.wire.broker import parse_broker_url
from hulk.wire.records import Inventory, LaunchStatus
from planner.security.tls import CertPaths, init_pki, issue_cert
from tests.helpers.paths import REPO
from tests.helpers.ports import free_port
from tests.helpers.processes import planner_command

pytestmark = pytest.mark.process


def run_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("pki")
    paths = init_pki(where, ["127.0.0.1", "localhost"])
    client = issue_cert(CertPaths(paths["ca"], paths["ca_key"]), where, "n1", client=True)
    return {**paths, "client_cert": client.cert, "client_key": client.key}


@pytest.fixture(scope="module")
def planner(tmp_path_factory, pki):
    """`hulk-planner serve` over TLS requiring client certificates; node n1 enrolled."""
    where = tmp_path_factory.mktemp("planner")
    db = where / "planner.sqlite"
    enrolled = subprocess.run([*planner_command(), "enroll", "n1", "--db", str(db), "--json"],
                              cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=60)
    assert enrolled.returncode == 0, enrolled.stderr
    token = json.loads(enrolled.stdout)["token"]
    port = free_port()
    log = where / "planner.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*planner_command(), "serve", "--db", str(db), "--listen", f"127.0.0.1:{port}",
             "--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"]),
             "--client-ca", str(pki["ca"])], cwd=REPO, env=run_env(), stdout=out,
            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while "listening on" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    yield {"target": f"127.0.0.1:{port}", "token": token, "db": db}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def agent_config(planner, pki, tmp_path: Path, *, with_cert: bool, how: str = "file"):
    """The agent's settings as an operator gives them: a config file, variables or flags."""
    base = {"planner": planner["target"], "node_id": "n1", "address": "127.0.0.1",
            "state_dir": str(tmp_path / "state"), "ca": str(pki["ca"])}
    cert = {"client_cert": str(pki["client_cert"]), "client_key": str(pki["client_key"])}
    env = {"HULK_TOKEN": planner["token"]}
    flags: dict[str, str] = {}
    if how == "file":
        config_file = tmp_path / "agent.yaml"
        config_file.write_text("".join(f"{k}: {v}\n" for k, v in
                                       {**base, **(cert if with_cert else {})}.items()))
        flags["config"] = str(config_file)
    elif how == "env":
        flags.update(base)
        if with_cert:
            env.update({"HULK_CLIENT_CERT": cert["client_cert"],
                        "HULK_CLIENT_KEY": cert["client_key"]})
    else:
        flags.update(base)
        if with_cert:
            flags.update(cert)
    return load_config(flags, env_reader=env.get)


@pytest.mark.parametrize("how", ["file", "env", "flags"])
async def test_grpc_needs_the_client_certificate_and_works_with_it(planner, pki, tmp_path, how):
    without = agent_config(planner, pki, tmp_path, with_cert=False, how=how)
    config = agent_config(planner, pki, tmp_path, with_cert=True, how=how)
    assert (config.client_cert, config.client_key) == (pki["client_cert"], pki["client_key"])
    refused = GrpcPlannerClient.connect(without.planner, insecure=False, ca=without.ca,
                                        token=without.token, call_timeout_s=5.0)
    accepted = GrpcPlannerClient.connect(config.planner, insecure=False, ca=config.ca,
                                         token=config.token, client_cert=config.client_cert,
                                         client_key=config.client_key, call_timeout_s=10.0)
    try:
        with pytest.raises(errors.UnavailableError):
            await refused.heartbeat("n1", int(time.time() * 1000), 0, 0, LaunchStatus())
        beat = await accepted.heartbeat("n1", int(time.time() * 1000), 0, 0, LaunchStatus())
        assert beat.server_time_ms > 0
    finally:
        await refused.close()
        await accepted.close()


async def test_the_agent_runtime_registers_through_mutual_tls(planner, pki, tmp_path):
    """AgentRuntime.from_config, as `hulk-agent` builds it, with the certificate in its file."""
    config = agent_config(planner, pki, tmp_path, with_cert=True)
    runtime = AgentRuntime.from_config(
        config, pinger=None, inventory_reader=lambda: Inventory(unavailable_reason="test host"))
    task = asyncio.create_task(runtime.run())
    try:
        registration = await asyncio.wait_for(runtime.wait_registered(), timeout=20)
        assert registration.fleet
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0


def test_a_client_certificate_without_its_key_is_a_config_error(pki, tmp_path):
    with pytest.raises(errors.ConfigError, match="client_key"):
        load_config({"planner": "p:1", "node_id": "n1", "client_cert": str(pki["client_cert"])},
                    env_reader=lambda name: None)
    with pytest.raises(errors.ConfigError, match="plaintext"):
        load_config({"planner": "p:1", "node_id": "n1", "insecure": "1",
                     "client_cert": str(pki["client_cert"]),
                     "client_key": str(pki["client_key"])}, env_reader=lambda name: None)
    with pytest.raises(errors.ConfigError, match="HULK_CLIENT_KEY"):
        load_config({"planner": "p:1", "node_id": "n1"},
                    env_reader={"HULK_CLIENT_CERT": str(pki["client_cert"]),
                                "HULK_CLIENT_KEY": str(tmp_path / "missing.key")}.get)


# ------------------------------------------------------------------------------------ MQTT

@pytest.fixture
def mtls_broker(tmp_path, pki):
    """mosquitto with a TLS listener that requires a client certificate from the fleet CA."""
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosquitto).exists():
        pytest.skip("mosquitto is not installed")
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    lines = [f"listener {port} 127.0.0.1", f"cafile {pki['ca']}",
             f"certfile {pki['server_cert']}", f"keyfile {pki['server_key']}",
             "require_certificate true", "allow_anonymous true", "persistence false",
             f"log_dest file {tmp_path / 'mosquitto.log'}"]
    if os.geteuid() == 0:
        lines.append("user root")  # else it drops to 'mosquitto', which cannot read the keys
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([mosquitto, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()[:500]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "mosquitto did not listen"
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)


async def _subscriber_connects(url: str, tmp_path: Path) -> bool:
    subscriber = PlacementSubscriber(parse_broker_url(url), fleet="f", node_id="n1",
                                     state_dir=tmp_path, backoff_initial_s=0.1,
                                     backoff_max_s=0.2)
    task = asyncio.create_task(subscriber.run())
    try:
        await asyncio.wait_for(subscriber.connected.wait(), timeout=4)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_mqtt_needs_the_client_certificate_and_works_with_it(mtls_broker, pki, tmp_path):
    base = f"mqtts://127.0.0.1:{mtls_broker}?ca={pki['ca']}"
    assert not await _subscriber_connects(base, tmp_path / "a")
    assert await _subscriber_connects(
        f"{base}&cert={pki['client_cert']}&key={pki['client_key']}", tmp_path / "b")
