"""Push and subscribe through a real mosquitto (tests/fixtures/broker.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from hulk.errors import UnavailableError
from hulk.wire.broker import parse_broker_url, placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from planner.service.publisher import MqttPublisher, RetainedPlan, push_new_plan
from agent.placement import PlacementSubscriber
from tests.helpers.plans import manual_plan, two_city_net
from tests.helpers.signing import SIGNER, T0, VERIFIER
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process


class Agents:
    """Real subscribers, one per node, each with its own state dir; records every change."""

    def __init__(self, url: str, tmp_path, node_ids, fleet: str = "lab", **kwargs):
        self.changes: dict[str, list] = {n: [] for n in node_ids}
        self.subs = {n: PlacementSubscriber(parse_broker_url(url), fleet=fleet, node_id=n,
                                            state_dir=tmp_path / n,
                                            on_change=self.changes[n].append,
                                            backoff_initial_s=0.1, backoff_max_s=0.5,
                                            verifier=VERIFIER, **kwargs)
                     for n in node_ids}
        self.tasks: list[asyncio.Task] = []

    async def __aenter__(self):
        self.tasks = [asyncio.create_task(s.run()) for s in self.subs.values()]
        await wait_until_async(lambda: all(s.connected.is_set() for s in self.subs.values()), what="subscribe")
        return self

    async def __aexit__(self, *exc):
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def test_each_of_three_agents_receives_exactly_its_own_placement(broker, tmp_path):
    net = two_city_net()
    plan = manual_plan(net)
    publisher = MqttPublisher(parse_broker_url(broker.url))
    async with Agents(broker.url, tmp_path, ["n0", "n3", "n5"]) as agents:
        pushed = await push_new_plan(publisher, plan, net, fleet="lab", plan_id="p1", issued_at_ms=T0 + 1,
                                     signer=SIGNER)
        await wait_until_async(lambda: agents.changes["n0"] and agents.changes["n3"], what="placements")
        await asyncio.sleep(0.3)  # room for any stray second delivery
        for node in ["n0", "n3"]:
            assert agents.changes[node] == [pushed[node]]          # once, and its own
            stored = parse_placement((tmp_path / node / "placement.json").read_bytes())
            assert stored == pushed[node] and stored.node == node
        await wait_until_async(lambda: agents.changes["n5"], what="n5's clear")
        (clear,) = agents.changes["n5"]                            # no role: a signed clear, no file
        assert clear.roles == () and clear.plan_id == "p1" and clear.node == "n5"
        assert not (tmp_path / "n5" / "placement.json").exists()
        assert all(s.ignored == 0 for s in agents.subs.values())
    summary = parse_summary(await publisher.read_retained(plan_topic("lab")), verifier=VERIFIER)
    assert summary.plan_id == "p1" and [j.name for j in summary.jobs] == ["a", "b"]


async def test_broker_restart_loses_nothing(broker, tmp_path):
    net = two_city_net()
    publisher = MqttPublisher(parse_broker_url(broker.url))
    async with Agents(broker.url, tmp_path, ["n0", "n1"]) as agents:
        first = await push_new_plan(publisher, manual_plan(net), net, fleet="lab", plan_id="p1",
                                    issued_at_ms=T0 + 1, signer=SIGNER)
        await wait_until_async(lambda: agents.changes["n0"] and agents.changes["n1"], what="first plan")
        broker.stop()
        await wait_until_async(lambda: not agents.subs["n0"].connected.is_set(), what="disconnect")
        await asyncio.sleep(0.5)                      # a few reconnect attempts fail meanwhile
        broker.start()
        await wait_until_async(lambda: all(s.connects >= 2 for s in agents.subs.values()), what="reconnect")
        # The retained placements survived the restart (persistence) ...
        retained = await publisher.read_retained(placement_topic("lab", "n0"))
        assert parse_placement(retained) == first["n0"]
        await asyncio.sleep(0.3)
        # ... and their redelivery on reconnect did not count as a change (no restart of the job).
        assert agents.changes["n0"] == [first["n0"]]
        # A plan pushed after the restart arrives.
        second = await push_new_plan(publisher, manual_plan(net), net, fleet="lab", plan_id="p2",
                                     issued_at_ms=T0 + 2, signer=SIGNER)
        await wait_until_async(lambda: len(agents.changes["n1"]) == 2, what="second plan")
        assert agents.changes["n1"][-1] == second["n1"]


async def test_broker_restart_with_agent_connecting_afterwards_gets_the_retained_placement(broker, tmp_path):
    net = two_city_net()
    publisher = MqttPublisher(parse_broker_url(broker.url))
    pushed = await push_new_plan(publisher, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=T0 + 1, signer=SIGNER)
    broker.restart()
    async with Agents(broker.url, tmp_path, ["n2"]) as agents:
        await wait_until_async(lambda: agents.changes["n2"], what="retained placement")
        assert agents.changes["n2"] == [pushed["n2"]]


async def test_malformed_message_is_logged_and_ignored_and_previous_placement_stays(broker, tmp_path, caplog):
    net = two_city_net()
    publisher = MqttPublisher(parse_broker_url(broker.url))
    async with Agents(broker.url, tmp_path, ["n4"]) as agents:
        pushed = await push_new_plan(publisher, manual_plan(net), net, fleet="lab", plan_id="p1",
                                     issued_at_ms=T0 + 1, signer=SIGNER)
        await wait_until_async(lambda: agents.changes["n4"], what="placement")
        path = tmp_path / "n4" / "placement.json"
        before = path.read_bytes()
        caplog.set_level(logging.WARNING, logger="agent.placement")
        topic = placement_topic("lab", "n4")
        wrong_node = pushed["n4"].to_bytes().replace(b'"node":"n4"', b'"node":"n0"')  # signature breaks
        signed_for_n0 = pushed["n0"].to_bytes()
        deep = b'{"format":"hulk-placement/2","roles":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        for bad in [b"{not json", b'{"format": "hulk-placement/9"}', wrong_node, signed_for_n0, deep]:
            await publisher.publish_retained({topic: bad})
        await wait_until_async(lambda: agents.subs["n4"].ignored == 5, what="five ignored messages")
        assert path.read_bytes() == before
        assert agents.changes["n4"] == [pushed["n4"]]
        assert agents.subs["n4"].current == pushed["n4"]
        logged = [r.getMessage() for r in caplog.records if "refused placement" in r.getMessage()]
        assert len(logged) == 5 and "format" in logged[1] and "bad signature" in logged[2]
        assert "expected node 'n4'" in logged[3] and "nested too deeply" in logged[4]
        assert all("\n" not in line for line in logged)


async def test_an_empty_retained_message_is_ignored_and_a_signed_clear_clears(broker, tmp_path, caplog):
    """Deleting the retained placement (an empty message: no signature, no seq) stops nothing;
    the planner's signed placement without roles clears the node."""
    net = two_city_net()
    publisher = MqttPublisher(parse_broker_url(broker.url))
    caplog.set_level(logging.INFO, logger="agent.placement")
    async with Agents(broker.url, tmp_path, ["n0"]) as agents:
        pushed = await push_new_plan(publisher, manual_plan(net), net, fleet="lab", plan_id="p1",
                                     issued_at_ms=T0 + 1, signer=SIGNER)
        await wait_until_async(lambda: agents.changes["n0"], what="placement")
        await publisher.publish_retained({placement_topic("lab", "n0"): b""})
        await wait_until_async(lambda: any("was deleted" in r.getMessage() for r in caplog.records),
                               what="the deletion logged")
        assert agents.changes["n0"] == [pushed["n0"]] and agents.subs["n0"].current == pushed["n0"]
        assert parse_placement((tmp_path / "n0" / "placement.json").read_bytes()) == pushed["n0"]
        plan = RetainedPlan(publisher, fleet="lab", signer=SIGNER)
        await plan.replace({}, None, issued_at_ms=T0 + 2, clear=["n0"])
        await wait_until_async(lambda: len(agents.changes["n0"]) == 2, what="clear")
        assert agents.changes["n0"][-1].roles == () and agents.changes["n0"][-1].seq > pushed["n0"].seq
        assert not (tmp_path / "n0" / "placement.json").exists()


async def test_pushing_to_a_broker_that_is_down_is_unavailable(broker):
    broker.stop()
    publisher = MqttPublisher(parse_broker_url(broker.url), timeout_s=2)
    with pytest.raises(UnavailableError, match=f"127.0.0.1:{broker.port}"):
        await publisher.publish_retained({plan_topic("lab"): b"{}"})


async def test_a_restarted_agent_follows_the_broker_not_its_stale_file(broker, tmp_path):
    net = two_city_net()
    publisher = MqttPublisher(parse_broker_url(broker.url))
    pushed = await push_new_plan(publisher, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=T0 + 1, signer=SIGNER)
    async with Agents(broker.url, tmp_path, ["n0", "n1"]) as agents:
        await wait_until_async(lambda: agents.changes["n0"] and agents.changes["n1"], what="placements")
    # While both agents are down, n0 is cleared (re-planned away); n1 keeps its placement.
    await RetainedPlan(publisher, fleet="lab", signer=SIGNER).replace(
        {}, None, issued_at_ms=T0 + 2, clear=["n0"])
    async with Agents(broker.url, tmp_path, ["n0", "n1"], retained_wait_s=0.3) as agents:
        await wait_until_async(lambda: agents.changes["n1"], what="n1's retained placement")
        assert agents.changes["n1"] == [pushed["n1"]]        # acted on again after the restart
        await wait_until_async(lambda: agents.changes["n0"], what="n0's clear")
        assert [c.roles for c in agents.changes["n0"]] == [()]
        assert not (tmp_path / "n0" / "placement.json").exists()


async def test_with_nothing_retained_a_restarted_agent_acts_on_its_file(broker, tmp_path):
    """The retained placement lost (deleted, a broker without persistence): the restarted agent
    hands its stored placement, verified again, to the launcher, which adopts what still runs;
    with no file either, the launcher is told that nothing runs."""
    net = two_city_net()
    publisher = MqttPublisher(parse_broker_url(broker.url))
    pushed = await push_new_plan(publisher, manual_plan(net), net, fleet="lab", plan_id="p1",
                                 issued_at_ms=T0 + 1, signer=SIGNER)
    async with Agents(broker.url, tmp_path, ["n0"]) as agents:
        await wait_until_async(lambda: agents.changes["n0"], what="placement")
    await publisher.publish_retained({placement_topic("lab", "n0"): b"", placement_topic("lab", "n7"): b""})
    async with Agents(broker.url, tmp_path, ["n0", "n7"], retained_wait_s=0.3) as agents:
        await wait_until_async(lambda: agents.changes["n0"] and agents.changes["n7"],
                               what="the stored placement, and None")
        assert agents.changes["n0"] == [pushed["n0"]] and agents.changes["n7"] == [None]
        assert agents.subs["n0"].current == pushed["n0"]
