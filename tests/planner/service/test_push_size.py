"""Pushes sized against the broker: every message is checked before any is published, and a push
goes summary first, so one that fails part-way never leaves placements without their summary."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hulk.errors import PlanningError, UnavailableError
from hulk.wire.broker import BrokerAddress, placement_topic, plan_topic
from hulk.wire.placement import (BROKER_MAX_PACKET_BYTES, MAX_PLACEMENT_BYTES, MAX_SUMMARY_BYTES,
                                 NodePlacement, publish_packet_bytes)
from planner.service.publisher import InMemoryPublisher, MqttPublisher, push_plan
from tests.helpers.signing import SIGNER, T0

FLEET = "f"


def plan(n_nodes: int, summary_padding: int) -> tuple[dict[str, NodePlacement], dict]:
    placements = {f"n{i}": NodePlacement(fleet=FLEET, node=f"n{i}", plan_id="p1") for i in range(n_nodes)}
    return placements, {"format": "hulk-plan-summary/2", "fleet": FLEET, "plan_id": "p1",
                        "jobs": [], "padding": "x" * summary_padding}


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_packet_size_counts_topic_headers_and_the_length_field():
    assert publish_packet_bytes("a/b", b"") == 1 + 1 + 2 + 3 + 2 + 1
    assert publish_packet_bytes("a/b", b"x" * 119) == 1 + 1 + 127      # one length byte up to 127
    assert publish_packet_bytes("a/b", b"x" * 120) == 1 + 2 + 128
    assert publish_packet_bytes("t", b"x" * 2_097_145) == 1 + 3 + 2_097_151   # 3 up to 128**3 - 1
    assert publish_packet_bytes("t", b"x" * 2_097_146) == 1 + 4 + 2_097_152
    topic = placement_topic("f" * 128, "n" * 128)   # the longest topic: the overhead allowed
    assert publish_packet_bytes(topic, b"x" * MAX_SUMMARY_BYTES) <= BROKER_MAX_PACKET_BYTES
    assert MAX_PLACEMENT_BYTES < MAX_SUMMARY_BYTES


async def test_an_oversized_summary_is_refused_before_anything_is_published():
    broker = InMemoryPublisher({"old": b"kept"}, max_packet_bytes=BROKER_MAX_PACKET_BYTES)
    placements, summary = plan(3, BROKER_MAX_PACKET_BYTES)
    with pytest.raises(PlanningError) as caught:
        await push_plan(broker, FLEET, placements, summary, signer=SIGNER, issued_at_ms=T0)
    text = one_line(caught)
    assert f"plan summary on {plan_topic(FLEET)}" in text and "max_packet_size of 2,097,152" in text
    assert "nothing was published" in text
    assert broker.published == [] and broker.retained == {"old": b"kept"}


async def test_a_summary_just_inside_the_limit_is_pushed():
    broker = InMemoryPublisher(max_packet_bytes=BROKER_MAX_PACKET_BYTES)
    placements, summary = plan(3, BROKER_MAX_PACKET_BYTES - 4096)
    count, _ = await push_plan(broker, FLEET, placements, summary, signer=SIGNER, issued_at_ms=T0)
    assert count == 4 and len(broker.retained[plan_topic(FLEET)]) > BROKER_MAX_PACKET_BYTES - 4096


async def test_a_placement_larger_than_an_agent_accepts_is_refused_whatever_the_broker_takes():
    broker = InMemoryPublisher()                       # no packet limit: the agent's limit holds
    topic = placement_topic(FLEET, "n1")
    with pytest.raises(PlanningError) as caught:
        await broker.publish_retained({plan_topic(FLEET): b"{}", topic: b"x" * (MAX_PLACEMENT_BYTES + 1)})
    assert f"the placement on {topic} is {MAX_PLACEMENT_BYTES + 1:,} bytes" in one_line(caught)
    assert broker.published == []


class FakeClient:
    """An aiomqtt client that records each publish when it starts and when its ack comes, fails
    the publishes of ``fail_topics``, and warns as aiomqtt does above ``pending_calls_threshold``
    publishes waiting for their acks."""

    def __init__(self, log: list[tuple[str, str]], fail_topics: set[str]):
        self.log, self.fail_topics = log, fail_topics
        self.pending_calls_threshold = 10
        self.pending = 0

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def publish(self, topic, payload, qos, retain):
        self.log.append(("sent", topic))
        self.pending += 1
        if self.pending > self.pending_calls_threshold:
            logging.getLogger("mqtt").warning("There are %d pending publish calls.", self.pending)
        await asyncio.sleep(0)      # let the other publishes of the same wave start
        self.pending -= 1
        if topic in self.fail_topics:
            import aiomqtt
            raise aiomqtt.MqttError("Operation timed out")
        self.log.append(("acked", topic))


def mqtt_publisher(log, fail_topics=frozenset(), **kwargs) -> MqttPublisher:
    async def no_pause(_s: float) -> None:
        return None

    return MqttPublisher(BrokerAddress("127.0.0.1", 1), attempts=2, sleep=no_pause,
                         client_factory=lambda *a, **k: FakeClient(log, set(fail_topics)), **kwargs)


async def test_the_summary_is_acknowledged_before_any_placement_is_sent():
    log: list[tuple[str, str]] = []
    placements, summary = plan(50, 100)
    await push_plan(mqtt_publisher(log), FLEET, placements, summary, signer=SIGNER, issued_at_ms=T0)
    first_placement = next(i for i, (_, topic) in enumerate(log) if topic.endswith("/placement"))
    assert log[:first_placement] == [("sent", plan_topic(FLEET)), ("acked", plan_topic(FLEET))]
    assert sum(1 for event, _ in log if event == "acked") == 51


async def test_a_summary_that_fails_leaves_every_placement_unsent_and_the_error_is_one_line():
    log: list[tuple[str, str]] = []
    placements, summary = plan(50, 100)
    with pytest.raises(UnavailableError) as caught:
        await push_plan(mqtt_publisher(log, {plan_topic(FLEET)}), FLEET, placements, summary,
                        signer=SIGNER, issued_at_ms=T0)
    assert "cannot publish (Operation timed out)" in one_line(caught)
    assert log == [("sent", plan_topic(FLEET))] * 2          # two attempts, no placement sent


async def test_a_summarys_removal_goes_after_the_clears():
    log: list[tuple[str, str]] = []
    clear = placement_topic(FLEET, "n1")
    await mqtt_publisher(log).publish_retained({plan_topic(FLEET): b"", clear: b"{}"})
    assert [topic for event, topic in log if event == "sent"] == [clear, plan_topic(FLEET)]


async def test_the_mqtt_publisher_checks_sizes_before_it_connects():
    log: list[tuple[str, str]] = []
    placements, summary = plan(3, 1000)
    with pytest.raises(PlanningError) as caught:
        await push_plan(mqtt_publisher(log, max_packet_bytes=900), FLEET, placements, summary,
                        signer=SIGNER, issued_at_ms=T0)
    assert "max_packet_size of 900" in one_line(caught) and log == []


async def test_a_large_push_does_not_warn_once_per_pending_publish(caplog):
    log: list[tuple[str, str]] = []
    placements, summary = plan(200, 100)
    with caplog.at_level(logging.WARNING):
        await push_plan(mqtt_publisher(log), FLEET, placements, summary, signer=SIGNER,
                        issued_at_ms=T0)
    assert sum(1 for event, _ in log if event == "acked") == 201
    assert not [r for r in caplog.records if "pending publish" in r.getMessage()]
