"""The shipped broker's limits: a node cannot take over another node's client id, the
planner's own concurrent connections still deliver, and one host cannot exhaust the connections."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers.broker import MOSQUITTO
from tests.helpers.waits import wait_until

paho = pytest.importorskip("paho.mqtt.client")

from hulk.wire.broker import parse_broker_url  # noqa: E402
from planner.service.publisher import MqttPublisher  # noqa: E402
from tests.helpers.shipped_broker import Client, ShippedBroker  # noqa: E402

FLEET = "f1"
pytestmark = pytest.mark.process
if not Path(MOSQUITTO).exists() or not shutil.which("mosquitto_passwd"):
    pytestmark = [pytestmark, pytest.mark.skip(reason="mosquitto not installed (make install)")]


def topic(node: str) -> str:
    return f"hulk/v1/{FLEET}/nodes/{node}/placement"


@pytest.fixture(scope="module")
def broker():
    b = ShippedBroker()
    b.accounts = {"planner": b.enroll("planner", "--role", "planner"),
                  "n1": b.enroll("n1"), "n2": b.enroll("n2")}
    b.start()
    try:
        yield b
    finally:
        b.stop()


def connect(broker, name: str, client_id: str | None = None) -> Client:
    account = broker.accounts[name]
    client = Client(broker, account["mqtt_username"], account["mqtt_password"], client_id=client_id)
    assert client.connect(), f"{name} could not connect"
    return client


def test_a_node_cannot_take_over_another_nodes_client_id(broker):
    n1 = connect(broker, "n1", client_id="hulk-agent-n1")      # the agent's own client id
    n1.subscribe(topic("n1"))
    intruder = connect(broker, "n2", client_id="hulk-agent-n1")  # n2 claims n1's client id
    planner = connect(broker, "planner")
    try:
        time.sleep(0.5)
        assert n1.disconnects == 0                  # n1 was not thrown off
        planner.publish(topic("n1"), b'{"for": "n1"}')
        wait_until(lambda: (topic("n1"), b'{"for": "n1"}') in n1.received, 5,
                   "n1's placement after the takeover attempt")
        assert n1.disconnects == 0
    finally:
        for client in (intruder, planner, n1):
            client.close()


def test_the_planners_concurrent_connections_all_deliver(broker):
    """Serve's recovery and an operator's `plan --push` use the same account at the same time."""
    account = broker.accounts["planner"]
    url = (f"mqtts://{account['mqtt_username']}:{account['mqtt_password']}@127.0.0.1:"
           f"{broker.tls_port}?ca={broker.ca}")
    address = parse_broker_url(url)

    async def push(k: int) -> None:
        await MqttPublisher(address).publish_retained({topic(f"c{k}"): f"m{k}".encode()})

    async def all_pushes() -> None:
        for _ in range(3):
            await asyncio.gather(*(push(k) for k in range(4)))

    asyncio.run(all_pushes())
    reader = MqttPublisher(address)
    for k in range(4):
        assert asyncio.run(reader.read_retained(topic(f"c{k}"), wait_s=3)) == f"m{k}".encode()
