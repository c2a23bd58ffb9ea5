"""Placement sequence numbers (planner/service/placement_seq.py) and what the publisher signs with
them: every node's numbers only grow, in memory and in the store (across instances and restarts,
and when the clock goes back); clears and re-sent placements are signed and newer."""

from __future__ import annotations

import random

from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import NodePlacement, parse_placement
from planner.service.database import Database
from planner.service.placement_seq import ClockSequence, StoreSequence
from planner.service.publisher import InMemoryPublisher, RetainedPlan, push_new_plan
from planner.service.store import Store
from tests.helpers.plans import manual_plan, two_city_net
from tests.helpers.signing import SIGNER, VERIFIER


def test_the_clock_sequence_follows_the_clock_and_never_repeats():
    seq = ClockSequence()
    assert seq.next(["a", "b"], 1000) == {"a": 1000, "b": 1000}
    assert seq.next(["a"], 1000) == {"a": 1001}                 # same millisecond
    assert seq.next(["a", "b"], 500) == {"a": 1002, "b": 1001}  # the clock went back
    assert seq.next(["c"], 2000) == {"c": 2000}
    assert seq.next([], 3000) == {}


def test_the_store_sequence_grows_across_instances_on_one_file_whatever_the_clock(tmp_path):
    path = tmp_path / "planner.db"
    rng = random.Random(27)
    last: dict[str, int] = {}
    now = 1_000_000
    for round_ in range(40):
        # A fresh instance (a restarted serve) now and then, on the same file.
        with Database(path) as database:
            sequence = StoreSequence(database)
            for _ in range(5):
                now += rng.choice([-50_000, -1, 0, 0, 1, 7, 30_000])   # the clock jumps back too
                nodes = rng.sample(["n0", "n1", "n2", "n3"], rng.randint(1, 4))
                got = sequence.next(nodes, now)
                assert sorted(got) == sorted(nodes)
                for node, seq in got.items():
                    assert seq > last.get(node, 0) and seq >= now, (round_, node, seq, now)
                    last[node] = seq


def test_two_store_sequences_on_one_file_never_issue_the_same_number(tmp_path):
    path = tmp_path / "planner.db"
    with Database(path) as one, Store(path) as two:
        a, b = StoreSequence(one), StoreSequence(two)
        issued = [a.next(["n0"], 5)["n0"], b.next(["n0"], 5)["n0"], a.next(["n0"], 5)["n0"]]
    assert issued == [5, 6, 7]


def test_many_nodes_in_one_call(tmp_path):
    with Database(tmp_path / "planner.db") as database:
        nodes = [f"n{i}" for i in range(1200)]
        first = StoreSequence(database).next(nodes, 10)
        again = StoreSequence(database).next(nodes, 10)
    assert set(first.values()) == {10} and set(again.values()) == {11}


async def test_a_push_clears_the_nodes_without_a_role_with_signed_newer_placements():
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    sequence = ClockSequence()
    pushed = await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1",
                                 issued_at_ms=100, signer=SIGNER, sequence=sequence)
    messages = broker.published[-1]
    assert set(messages) == {placement_topic("lab", n) for n in net.ids} | {plan_topic("lab")}
    for node in net.ids:
        placement = parse_placement(messages[placement_topic("lab", node)], verifier=VERIFIER)
        assert placement.seq == 100 and placement.plan_id == "p1"
        assert (placement.roles != ()) == (node in pushed)
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p2",
                        issued_at_ms=100, signer=SIGNER, sequence=sequence)
    assert all(parse_placement(broker.retained[placement_topic("lab", n)]).seq == 101 for n in net.ids)


async def test_resend_re_signs_exactly_the_given_placements_and_leaves_the_summary():
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    plan = RetainedPlan(broker, fleet="lab", signer=SIGNER)
    pushed = await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1",
                                 issued_at_ms=100, signer=SIGNER)
    summary = broker.retained[plan_topic("lab")]
    clear = NodePlacement(fleet="lab", node="n1", plan_id="cleared")
    count = await plan.resend({"n0": pushed["n0"], "n1": clear}, issued_at_ms=5000)
    assert count == 2 and set(broker.published[-1]) == {placement_topic("lab", "n0"),
                                                         placement_topic("lab", "n1")}
    assert broker.retained[plan_topic("lab")] == summary
    n0 = parse_placement(broker.retained[placement_topic("lab", "n0")], verifier=VERIFIER)
    n1 = parse_placement(broker.retained[placement_topic("lab", "n1")], verifier=VERIFIER)
    assert n0.roles == pushed["n0"].roles and n0.seq > pushed["n0"].seq and n0.issued_at_ms == 5000
    assert n1.roles == () and n1.seq >= 5000
    # Sent again: newer again (an agent accepts each).
    await plan.resend({"n0": n0}, issued_at_ms=5000)
    assert parse_placement(broker.retained[placement_topic("lab", "n0")]).seq > n0.seq
