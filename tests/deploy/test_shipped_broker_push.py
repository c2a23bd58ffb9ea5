"""`plan --push` against the shipped broker configuration (deploy/mosquitto/hulk.conf): a
10,000-server plan goes through whole, and a plan whose summary the broker would refuse is
refused by the planner first, in one line, with nothing published."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from hulk.wire.broker import parse_broker_url, placement_topic, plan_topic
from hulk.wire.placement import (BROKER_MAX_PACKET_BYTES, parse_placement, parse_summary,
                                 publish_packet_bytes)
from planner.core.generate import generate_jobs, generate_regional_fleet
from planner.files.fleet import save_fleet_json
from planner.service.publisher import MqttPublisher
from tests.helpers.broker import MOSQUITTO
from tests.helpers.paths import REPO
from tests.helpers.processes import run_cli
from tests.helpers.signing import VERIFIER, write_signing_key
from tests.helpers.waits import wait_until

paho = pytest.importorskip("paho.mqtt.client")

from tests.helpers.shipped_broker import Client, ShippedBroker  # noqa: E402

OLD_LIMIT = 262144      # the shipped max_packet_size a 5,000-server summary outgrew


def test_the_shipped_packet_limit_is_the_one_the_planner_checks():
    conf = (REPO / "deploy" / "mosquitto" / "hulk.conf").read_text()
    (value,) = re.findall(r"^max_packet_size (\d+)$", conf, re.M)
    assert int(value) == BROKER_MAX_PACKET_BYTES


needs_mosquitto = pytest.mark.skipif(
    not Path(MOSQUITTO).exists() or not shutil.which("mosquitto_passwd"),
    reason="mosquitto not installed (make install)")


@pytest.fixture(scope="module")
def broker():
    b = ShippedBroker()
    b.account = b.enroll("planner", "--role", "planner")
    b.start()
    try:
        yield b
    finally:
        b.stop()


def url(broker: ShippedBroker) -> str:
    a = broker.account
    return (f"mqtts://{a['mqtt_username']}:{a['mqtt_password']}@127.0.0.1:{broker.tls_port}"
            f"?ca={broker.ca}")


def push(broker, tmp_path: Path, fleet_name: str, servers: int, sites: int, jobs: int):
    """`plan --method system-a --push` of ``jobs`` generated jobs on a generated fleet (System A
    plans in well under a second at any size; its summary is as large as the search's)."""
    save_fleet_json(generate_regional_fleet(servers, sites, seed=1), tmp_path / "fleet.json")
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump({"jobs": [
        {"name": j.name, "model": j.model, "steps": j.steps, "global_batch": j.global_batch}
        for j in generate_jobs(jobs, seed=1)]}, sort_keys=False))
    key = write_signing_key(tmp_path / "signing.key")
    return run_cli("plan", tmp_path / "jobs.yaml", "--fleet", tmp_path / "fleet.json",
                   "--no-compare", "--method", "system-a", "--push", "--mqtt", url(broker),
                   "--fleet-name", fleet_name, "--signing-key", key, timeout=240)


def read_retained(broker: ShippedBroker, topics: list[str], chunk: int = 500) -> dict[str, bytes]:
    """The retained payload of every topic, read with the planner's account a chunk of topics at
    a time (the broker queues at most max_queued_messages for one client)."""
    client = Client(broker, broker.account["mqtt_username"], broker.account["mqtt_password"])
    assert client.connect()
    try:
        for k in range(0, len(topics), chunk):
            client.c.subscribe([(topic, 1) for topic in topics[k:k + chunk]])
            wait_until(lambda: len(client.received) >= min(k + chunk, len(topics)), 30,
                       "the retained messages", detail=lambda: len(client.received))
    finally:
        client.close()
    return dict(client.received)


@pytest.mark.process
@pytest.mark.slow
@needs_mosquitto
def test_a_10000_server_plan_pushes_through_the_shipped_broker(broker, tmp_path):
    proc = push(broker, tmp_path, "big", 10_000, 200, 20)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pushed to" in proc.stdout and proc.stderr.count("\n") <= 1, proc.stderr[-2000:]
    nodes = [n.id for n in generate_regional_fleet(10_000, 200, seed=1).nodes]
    retained = read_retained(broker, [plan_topic("big")] + [placement_topic("big", n) for n in nodes])
    summary_raw = retained.pop(plan_topic("big"))
    assert publish_packet_bytes(plan_topic("big"), summary_raw) > OLD_LIMIT   # what it outgrew
    summary = parse_summary(summary_raw, verifier=VERIFIER)
    placements = [parse_placement(raw, verifier=VERIFIER) for raw in retained.values()]
    assert len(placements) == 10_000 and {p.node for p in placements} == set(nodes)
    placed = {p.node for p in placements if p.roles}
    assert placed == {n for job in summary.jobs for n in job.node_ids} and len(placed) >= 1000
    assert all(p.plan_id == summary.plan_id for p in placements)


@pytest.mark.process
@pytest.mark.slow
@needs_mosquitto
async def test_a_plan_too_large_for_the_broker_is_one_line_and_publishes_nothing(broker, tmp_path):
    proc = push(broker, tmp_path, "huge", 2000, 200, 100)     # a summary of about 3 MB
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert "plan summary on hulk/v1/huge/plan is a" in proc.stderr
    assert f"max_packet_size of {BROKER_MAX_PACKET_BYTES:,}" in proc.stderr
    assert "nothing was published" in proc.stderr
    publisher = MqttPublisher(parse_broker_url(url(broker)))
    assert await publisher.read_retained(plan_topic("huge"), wait_s=0.3) is None
    assert await publisher.read_retained("hulk/v1/huge/nodes/#", wait_s=0.3) is None
