"""The shipped mosquitto configuration (deploy/mosquitto/hulk.conf), run for real with test paths
and ports, with accounts made by `hulk-planner enroll`: each node reads only its own placement and
publishes nothing."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.helpers.broker import MOSQUITTO
from tests.helpers.waits import wait_until

paho = pytest.importorskip("paho.mqtt.client")

from tests.helpers.shipped_broker import Client, ShippedBroker  # noqa: E402

FLEET = "f1"

pytestmark = pytest.mark.process
if not Path(MOSQUITTO).exists() or not shutil.which("mosquitto_passwd"):
    pytestmark = [pytestmark, pytest.mark.skip(reason="mosquitto / mosquitto_passwd not installed "
                                                      "(make install adds Debian's mosquitto)")]


def _topic(node: str) -> str:
    return f"hulk/v1/{FLEET}/nodes/{node}/placement"


@pytest.fixture(scope="module")
def broker():
    b = ShippedBroker()
    accounts = {"planner": b.enroll("planner", "--role", "planner"),
                "n1": b.enroll("n1"), "n2": b.enroll("n2")}
    b.accounts = accounts
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _client(broker, name: str) -> Client:
    acc = broker.accounts[name]
    client = Client(broker, acc["mqtt_username"], acc["mqtt_password"])
    assert client.connect(), f"{name} could not connect"
    return client


def test_acl_file_grants_each_node_only_its_own_placement(broker):
    acl = (broker.dir / "acl").read_text()
    assert "user n1\ntopic read hulk/v1/+/nodes/n1/placement\n" in acl
    assert "user planner\ntopic readwrite hulk/v1/#\n" in acl
    assert any(line.startswith("n1:$7$") for line in (broker.dir / "passwd").read_text().splitlines())
    assert broker.accounts["n1"]["mqtt_password"] not in (broker.dir / "passwd").read_text()


def test_node_reads_its_own_placement_but_not_another_nodes(broker):
    planner = _client(broker, "planner")
    planner.publish(_topic("n1"), b'{"for": "n1"}')
    planner.publish(_topic("n2"), b'{"for": "n2"}')
    n1 = _client(broker, "n1")
    try:
        n1.subscribe(_topic("n2"))
        n1.subscribe(f"hulk/v1/{FLEET}/#")          # a wildcard reaches nothing extra either
        n1.subscribe(_topic("n1"))
        wait_until(lambda: any(t == _topic("n1") for t, _ in n1.received), 3, "n1's placement")
        time.sleep(1.0)  # give any wrongly delivered message time to arrive
        assert {t for t, _ in n1.received} == {_topic("n1")}
        assert all(p == b'{"for": "n1"}' for _, p in n1.received)
    finally:
        n1.close()
        planner.close()


def test_node_cannot_publish_placements(broker):
    watcher = _client(broker, "planner")
    watcher.subscribe(f"hulk/v1/{FLEET}/#")
    time.sleep(0.3)
    watcher.received.clear()
    n1 = _client(broker, "n1")
    try:
        n1.publish(_topic("n1"), b'{"forged": true}')
        n1.publish(_topic("n2"), b'{"forged": true}')
        n1.publish(f"hulk/v1/{FLEET}/plan", b'{"forged": true}')
        # Positive control: the planner's own publish does reach the watcher. (The watcher
        # publishes it: the broker binds client ids to accounts, so a second planner connection
        # would end the watcher's session.)
        watcher.publish(f"hulk/v1/{FLEET}/plan", b"real", retain=False)
        wait_until(lambda: (f"hulk/v1/{FLEET}/plan", b"real") in watcher.received, 3,
                   "the planner's own plan message")
        time.sleep(0.5)
        assert not [m for m in watcher.received if b"forged" in m[1]]
    finally:
        n1.close()
        watcher.close()


def test_anonymous_wrong_password_and_plaintext_are_refused(broker):
    assert not Client(broker, None, None).connect()
    assert not Client(broker, "n1", "wrong-password").connect()
    plain = Client(broker, "n1", broker.accounts["n1"]["mqtt_password"], tls=False)
    assert not plain.connect()


def test_revoked_node_cannot_connect_after_reload(broker):
    n3 = broker.enroll("n3")
    broker.reload()
    client = Client(broker, "n3", n3["mqtt_password"])
    assert client.connect()
    client.close()
    broker.revoke("n3")
    broker.reload()
    assert "user n3" not in (broker.dir / "acl").read_text()
    assert not Client(broker, "n3", n3["mqtt_password"]).connect()


def test_projects_own_clients_over_mqtts_deliver_only_the_nodes_placement(broker, tmp_path):
    """planner/service/publisher.py publishing with the planner account and agent/placement.py subscribing with
    n1's account, both over TLS (mqtts://...?ca=) to the shipped configuration."""
    import asyncio
    import contextlib

    from agent.placement import PlacementSubscriber
    from hulk.wire.broker import parse_broker_url
    from planner.service.publisher import MqttPublisher

    def url(name: str) -> str:
        acc = broker.accounts[name]
        return (f"mqtts://{acc['mqtt_username']}:{acc['mqtt_password']}@127.0.0.1:"
                f"{broker.tls_port}?ca={broker.ca}")

    from hulk.wire.placement import NodePlacement
    from tests.helpers.signing import SIGNER, T0, VERIFIER

    def placement(node: str) -> bytes:
        return NodePlacement(fleet="tlsf", node=node, plan_id="p9").signed(
            SIGNER, issued_at_ms=T0, expires_at_ms=T0 + 3_600_000).to_bytes()

    async def scenario() -> tuple[list, bytes | None]:
        publisher = MqttPublisher(parse_broker_url(url("planner")))
        await publisher.publish_retained({"hulk/v1/tlsf/nodes/n1/placement": placement("n1"),
                                          "hulk/v1/tlsf/nodes/n2/placement": placement("n2")})
        changes: list = []
        sub = PlacementSubscriber(parse_broker_url(url("n1")), fleet="tlsf", node_id="n1",
                                  state_dir=tmp_path / "n1", on_change=changes.append,
                                  backoff_initial_s=0.1, backoff_max_s=0.5, verifier=VERIFIER)
        task = asyncio.create_task(sub.run())
        try:
            for _ in range(200):
                if changes:
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # n1's account reading n2's retained placement with the planner's own reader: nothing.
        spy = MqttPublisher(parse_broker_url(url("n1")))
        stolen = await spy.read_retained("hulk/v1/tlsf/nodes/n2/placement", wait_s=1.0)
        return changes, stolen

    changes, stolen = asyncio.run(scenario())
    assert [c.node for c in changes] == ["n1"]
    assert stolen is None
