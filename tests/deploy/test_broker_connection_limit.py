"""One host cannot lock the fleet out of the broker.

Reproduced as found: a mosquitto with the usual 1,024 file descriptors, the shipped configuration,
and one host opening 1,100 idle connections to the agents' port. Without a per-source limit the
broker runs out of descriptors and a real agent from another address cannot connect; with the
shipped nftables rules (deploy/nftables/hulk-broker.nft) that host gets 256 connections and the
agent connects and reads its placement. All of it inside a network namespace of the test's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.broker import MOSQUITTO
from tests.helpers.paths import REPO
from tests.helpers.processes import stop_process
from tests.helpers.waits import wait_until

paho = pytest.importorskip("paho.mqtt.client")

from tests.helpers.shipped_broker import ShippedBroker  # noqa: E402

RULES = REPO / "deploy" / "nftables" / "hulk-broker.nft"
TOPIC = "hulk/v1/f1/nodes/n1/placement"
pytestmark = [pytest.mark.process, pytest.mark.root]
if os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip") \
        or not Path(MOSQUITTO).exists() or not shutil.which("mosquitto_passwd"):
    pytestmark.append(pytest.mark.skip(reason="needs root, nft, ip and mosquitto (make install)"))

# Runs inside the namespace: the flood from 127.0.0.2, then a real agent (n1) from 127.0.0.3.
CLIENT = r"""
import json, socket, ssl, sys, threading, time
import paho.mqtt.client as paho

account, ca, flood = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
deadline = time.time() + 10
while True:
    try:
        socket.create_connection(("127.0.0.1", 8883), timeout=1).close()
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.1)
held, refused = [], 0
for _ in range(flood):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", 8883))
        held.append(s)
    except OSError:
        refused += 1
        s.close()
time.sleep(0.5)
got = threading.Event()
c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="n1")
c.username_pw_set(account["mqtt_username"], account["mqtt_password"])
c.tls_set(ca_certs=ca, tls_version=ssl.PROTOCOL_TLS_CLIENT)
c.on_connect = lambda cl, u, f, rc, p=None: cl.subscribe(%r, qos=1) if not rc.is_failure else None
c.on_message = lambda cl, u, m: got.set()
try:
    c.connect("127.0.0.1", 8883, keepalive=30, bind_address="127.0.0.3")
    c.loop_start()
    got.wait(8)
    c.loop_stop()
except OSError:
    pass
print(json.dumps({"held": len(held), "refused": refused, "agent_got_placement": got.is_set()}))
""" % TOPIC


def run_in(namespace: str, *command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", namespace, *command], capture_output=True,
                          text=True, **kwargs)


@pytest.fixture
def namespace():
    name = f"hulkmq{os.getpid()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        run_in(name, "ip", "link", "set", "lo", "up", check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def flood_and_connect(namespace: str, *, with_rules: bool) -> dict:
    broker = ShippedBroker(shipped_ports=True)
    account = broker.enroll("n1")
    planner = broker.enroll("planner", "--role", "planner")
    if with_rules:
        loaded = run_in(namespace, "nft", "-f", str(RULES))
        assert loaded.returncode == 0, loaded.stderr
    proc = subprocess.Popen(["ip", "netns", "exec", namespace, "prlimit", "--nofile=1024:1024",
                             MOSQUITTO, "-c", str(broker.conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # The placement n1 should read, retained, published through the loopback listener.
        publish = ["mosquitto_pub", "-h", "127.0.0.1", "-p", "1883", "-u",
                   planner["mqtt_username"], "-P", planner["mqtt_password"], "-t", TOPIC, "-r",
                   "-q", "1", "-m", '{"for": "n1"}']
        wait_until(lambda: run_in(namespace, *publish, timeout=30).returncode == 0, 10,
                   "the broker to take the planner's placement")
        done = run_in(namespace, sys.executable, "-c", CLIENT, json.dumps(account),
                      str(broker.ca), "1100", timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stop_process(proc)
        broker.stop()


def test_without_a_per_source_limit_one_host_locks_the_agents_out(namespace):
    """The finding, reproduced: the control that shows the limit below is needed."""
    result = flood_and_connect(namespace, with_rules=False)
    assert result["held"] > 900 and not result["agent_got_placement"], result


def test_the_shipped_rules_cap_one_host_and_the_agent_still_connects(namespace):
    result = flood_and_connect(namespace, with_rules=True)
    assert result == {"held": 256, "refused": 1100 - 256, "agent_got_placement": True}
