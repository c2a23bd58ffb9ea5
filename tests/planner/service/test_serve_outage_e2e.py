"""serve down for far longer than the node lease: its agents keep their leases from the broker.

Real mosquitto, real `hulk-planner serve --mqtt` (killed with SIGKILL, so only its last will
tells the broker), a real agent runtime. While serve is gone the agent re-reads serve's retained
presence and renews its lease from each ``offline`` answer (agent/presence.py); once serve is
back (``online``) the heartbeats renew it again and the broker's answers renew nothing.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from hulk.wire.broker import parse_broker_url
from hulk.wire.presence import OFFLINE, ONLINE, parse_presence, presence_topic
from planner.service.publisher import MqttPublisher
from tests.helpers.agents import Agent
from tests.helpers.processes import start_planner
from tests.helpers.signing import VERIFIER, write_signing_key
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process

NODE_TIMEOUT_S = 3.0


def serve_args(broker, key) -> tuple[str, ...]:
    return ("--fleet-name", "lab", "--mqtt", broker.url, "--node-timeout", str(NODE_TIMEOUT_S),
            "--signing-key", str(key), "--recovery-interval", "0.25")


async def retained_presence(broker):
    raw = await MqttPublisher(parse_broker_url(broker.url)).read_retained(presence_topic("lab"))
    return parse_presence(raw, verifier=VERIFIER, source="test") if raw else None


async def test_serve_killed_for_three_leases_leaves_the_node_lease_valid(broker, tmp_path):
    db = tmp_path / "planner.sqlite"
    key = write_signing_key(tmp_path / "signing.key")
    planner = start_planner(db, extra=serve_args(broker, key))
    agent = Agent("n1", planner.address, broker.url, tmp_path / "n1")
    agent.start()
    try:
        lease = agent.runtime.lease
        await wait_until_async(lambda: lease.valid() and agent.component.subscriber is not None
                               and agent.component.subscriber.presence.state == ONLINE, 30,
                               "the agent registered, leased and saw serve online")
        assert (await retained_presence(broker)).state == ONLINE
        watch = agent.component.subscriber.presence
        assert watch.renewals == 0

        planner.proc.send_signal(signal.SIGKILL)
        planner.proc.wait(10)
        await wait_until_async(lambda: watch.offline, 10, "the broker's will: serve offline")
        assert (await retained_presence(broker)).state == OFFLINE
        # Three leases (2.7 s each) without serve: the lease is never let lapse.
        end = time.monotonic() + 3 * NODE_TIMEOUT_S
        lapsed = 0
        while time.monotonic() < end:
            lapsed += not lease.valid()
            await asyncio.sleep(0.1)
        assert lapsed == 0, f"the lease lapsed in {lapsed} of the samples while serve was down"
        assert watch.renewals >= 3

        planner = start_planner(db, port=int(planner.address.rsplit(":", 1)[1]),
                                extra=serve_args(broker, key))
        await wait_until_async(lambda: watch.state == ONLINE, 30, "serve online again")
        renewals = watch.renewals
        await asyncio.sleep(2 * NODE_TIMEOUT_S)
        assert lease.valid()              # heartbeats again
        assert watch.renewals == renewals
    finally:
        await agent.stop()
        planner.stop()
    assert (await retained_presence(broker)).state == OFFLINE   # a clean stop says so itself
