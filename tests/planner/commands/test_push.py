"""`hulk-planner plan --push` and the broker URL: errors are one line, pushes land on the broker."""

from __future__ import annotations

import json

import pytest

from hulk.errors import ConfigError
from hulk.wire.broker import parse_broker_url, placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from planner.service.publisher import MqttPublisher

from tests.helpers.processes import run_cli
from tests.helpers.signing import VERIFIER, write_signing_key


def test_broker_url_forms():
    b = parse_broker_url("mqtt://user:p%40ss@10.0.0.1:1884")
    assert (b.host, b.port, b.username, b.password) == ("10.0.0.1", 1884, "user", "p@ss")
    assert "p@ss" not in repr(b)
    assert parse_broker_url("mqtt://broker").port == 1883
    for bad in ["", "tcp://x:1", "mqtt://", "mqtt://x:99999", "mqtt://x:1/path", "x:1883"]:
        with pytest.raises(ConfigError, match="--mqtt: expected mqtt://"):
            parse_broker_url(bad)


def plan_cli(tmp_path, *extra):
    fleet = {"nodes": [{"id": f"n{i}", "city": "Beijing", "gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB",
                        "compute_capability": 8.0, "memory_gb": 320} for i in range(3)],
             "links": [{"src": "n0", "dst": "n1", "rtt_ms": 2.0}, {"src": "n1", "dst": "n2", "rtt_ms": 2.0},
                       {"src": "n0", "dst": "n2", "rtt_ms": 2.0}]}
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    (tmp_path / "jobs.yaml").write_text("jobs:\n  - {name: a, model: gpt2-xl}\n")
    return run_cli("plan", tmp_path / "jobs.yaml", "--fleet", tmp_path / "fleet.json",
                   "--no-compare", *extra)


@pytest.mark.process
def test_push_without_a_broker_url_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.delenv("HULK_MQTT", raising=False)
    proc = plan_cli(tmp_path, "--push")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--mqtt" in proc.stderr


@pytest.mark.process
async def test_push_without_a_signing_key_is_a_one_line_error_and_pushes_nothing(broker, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.delenv("HULK_SIGNING_KEY", raising=False)
    proc = plan_cli(tmp_path, "--push", "--mqtt", broker.url, "--fleet-name", "ops")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "--signing-key" in proc.stderr and "placements are signed" in proc.stderr
    publisher = MqttPublisher(parse_broker_url(broker.url))
    assert await publisher.read_retained(plan_topic("ops"), wait_s=0.3) is None


@pytest.mark.process
async def test_plan_push_publishes_every_placed_node_and_the_summary(broker, tmp_path):
    key = write_signing_key(tmp_path / "signing.key")
    proc = plan_cli(tmp_path, "--push", "--mqtt", broker.url, "--fleet-name", "ops", "--signing-key", key)
    assert proc.returncode == 0, proc.stderr
    assert "pushed to" in proc.stdout
    publisher = MqttPublisher(parse_broker_url(broker.url))
    summary = parse_summary(await publisher.read_retained(plan_topic("ops")), verifier=VERIFIER)
    (job,) = summary.jobs
    assert summary.expires_at_ms - summary.issued_at_ms == 7 * 86_400_000
    for node in job.node_ids:
        placement = parse_placement(await publisher.read_retained(placement_topic("ops", node)),
                                    verifier=VERIFIER)
        assert placement.node == node and placement.roles[0].plan_id == summary.plan_id
        assert placement.issued_at_ms == summary.issued_at_ms
    broker.stop()
    down = plan_cli(tmp_path, "--push", "--mqtt", broker.url, "--signing-key", key)
    assert down.returncode == 1 and f"127.0.0.1:{broker.port}" in down.stderr
    assert down.stderr.strip().count("\n") == 0
