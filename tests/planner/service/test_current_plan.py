"""The current plan as the broker retains it (RetainedPlan) over the in-memory broker shipped beside
MqttPublisher (InMemoryPublisher); the real broker is tests/planner/service/test_publisher.py's."""

from __future__ import annotations

import pytest

from hulk.errors import InputError, UnavailableError
from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import parse_placement
from hulk.wire.signing import Signer
from planner.service.publisher import InMemoryPublisher, push_new_plan
from tests.helpers.plans import manual_plan, two_city_net
from tests.helpers.serve import current_plan, is_clear
from tests.helpers.signing import SIGNER, VERIFIER


async def test_the_in_memory_broker_retains_deletes_on_empty_payloads_and_can_be_down():
    broker = InMemoryPublisher({"t/0": b"kept"})
    await broker.publish_retained({"t/1": b"one", "t/0": b""})
    assert broker.retained == {"t/1": b"one"} and broker.published == [{"t/1": b"one", "t/0": b""}]
    assert await broker.read_retained("t/1") == b"one" and await broker.read_retained("t/0") is None
    broker.unavailable = True
    with pytest.raises(UnavailableError):
        await broker.read_retained("t/1")
    with pytest.raises(UnavailableError):
        await broker.publish_retained({"t/2": b"two"})
    assert len(broker.published) == 1


async def test_the_current_plan_is_the_verified_retained_summary():
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    plan = current_plan(broker)
    assert await plan.summary() is None
    pushed = await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1",
                                 issued_at_ms=1, signer=SIGNER)
    summary = await plan.summary()
    assert summary.plan_id == "p1" and {j.name for j in summary.jobs} == {"a", "b"}
    with pytest.raises(InputError, match="signature"):
        await current_plan(broker, Signer.generate()).summary()     # another planner's key

    # Placements that do not verify, or name another node, are left out of what is read back.
    broker.retained[placement_topic("lab", "n1")] = pushed["n0"].to_bytes()
    forged = pushed["n4"].signed(Signer.generate(), issued_at_ms=2, expires_at_ms=3)
    broker.retained[placement_topic("lab", "n4")] = forged.to_bytes()
    read = await plan.placements(net.ids)
    assert sorted(read) == ["n0", "n2", "n3", "n5", "n6", "n7"] and read["n0"].roles == pushed["n0"].roles
    assert all(read[n].roles == () for n in ["n5", "n6", "n7"])   # no role in the plan: cleared


async def test_replacing_the_plan_with_none_clears_its_nodes_and_the_summary():
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    count = await current_plan(broker).replace({}, None, issued_at_ms=5, clear=["n0", "n4"])
    pushed = broker.published[-1]
    assert count == 3 and sorted(pushed) == sorted(
        [placement_topic("lab", "n0"), placement_topic("lab", "n4"), plan_topic("lab")])
    assert pushed[plan_topic("lab")] == b""                      # no plan: the summary goes
    for node in ["n0", "n4"]:                                    # the nodes: signed clears
        assert is_clear(pushed[placement_topic("lab", node)])
        clear = parse_placement(pushed[placement_topic("lab", node)], verifier=VERIFIER)
        assert clear.plan_id == "cleared" and clear.seq >= 5 and clear.issued_at_ms == 5
    assert await current_plan(broker).summary() is None
    assert placement_topic("lab", "n1") in broker.retained       # not named: left alone
