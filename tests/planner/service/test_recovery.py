"""Recovery decisions (pure) and the Replanner's decisions against an in-memory broker."""

from __future__ import annotations



from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from planner.core.plan import Plan
from planner.service.publisher import push_new_plan
from planner.service.recovery import Replanner, down_nodes, jobs_using, replan_jobs, sub_network
from tests.helpers.plans import job, manual_plan, two_city_net


def test_down_nodes_are_those_silent_past_the_timeout():
    seen = {"a": 10_000, "b": 7_001, "c": 6_999, "d": None}
    assert down_nodes(seen, now_ms=10_000, timeout_s=3) == {"c", "d"}
    assert down_nodes({}, now_ms=10_000, timeout_s=3) == set()


def test_jobs_using_names_only_jobs_with_a_role_on_the_nodes():
    net = two_city_net()
    plan = manual_plan(net)
    assert jobs_using(plan, net, {"n3"}) == {"a"}
    assert jobs_using(plan, net, {"n5", "unknown"}) == set()
    assert jobs_using(plan, net, {"n0", "n4"}) == {"a", "b"}


def test_sub_network_keeps_the_chosen_rows_and_columns():
    net = two_city_net()
    sub = sub_network(net, [5, 0])
    assert sub.ids == ["n5", "n0"] and sub.rtt_ms[0, 1] == net.rtt_ms[5, 0]


def test_replan_moves_only_the_affected_job_onto_free_nodes():
    net = two_city_net(per_city=4)          # n0..n7
    plan = manual_plan(net)                 # a on n0-n3, b on n4; n5, n6, n7 free
    result = replan_jobs(plan, net, [plan.placements[0].job], down={"n1"}, seed=0)
    assert result.replanned == ["a"] and result.kept == ["b"] and result.lost == []
    by_name = {p.job.name: p for p in result.plan.placements}
    assert by_name["b"] == plan.placements[1]                       # untouched, same object
    new_nodes = {net.ids[i] for i in by_name["a"].nodes}
    assert new_nodes <= {"n0", "n2", "n3", "n5", "n6", "n7"} and "n1" not in new_nodes
    assert "n4" not in new_nodes                                     # the kept job's node
    assert by_name["a"].stages[0].lo == 0 and by_name["a"].stages[-1].hi == 48


def test_replan_with_no_free_node_marks_the_job_unplaced():
    net = two_city_net(per_city=1)          # n0, n1
    from planner.core.costmodel import Placement, Stage

    plan = Plan("manual", [Placement(job("a"), (Stage(0, 48, (0,)),), 4),
                           Placement(job("b"), (Stage(0, 48, (1,)),), 4)])
    result = replan_jobs(plan, net, [job("a")], down={"n0"})
    assert result.lost == ["a"] and result.kept == ["b"]
    assert [u.name for u in result.plan.unplaced] == ["a"]


class MemoryBroker:
    """In-memory retained topics (pure-logic stand-in for the broker)."""

    def __init__(self):
        self.retained: dict[str, bytes] = {}
        self.published: list[dict[str, bytes]] = []

    async def publish_retained(self, messages):
        self.published.append(dict(messages))
        for topic, payload in messages.items():
            if payload:
                self.retained[topic] = payload
            else:
                self.retained.pop(topic, None)

    async def read_retained(self, topic, wait_s=1.0):
        return self.retained.get(topic)


async def test_replanner_pushes_new_roles_only_to_the_affected_job_and_clears_the_dead_node():
    net = two_city_net(per_city=4)
    broker = MemoryBroker()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1)
    before = dict(broker.retained)
    now = [100_000]
    seen = {n: now[0] for n in net.ids}
    seen["n2"] = now[0] - 5_000

    async def last_seen():
        return seen

    async def network():
        return net

    replanner = Replanner(broker, fleet="lab", last_seen=last_seen, network=network, timeout_s=3,
                          clock_ms=lambda: now[0])
    report = await replanner.check()
    assert report is not None and report.down == ["n2"] and report.replanned == ["a"]
    assert report.kept == ["b"]
    pushed = broker.published[-1]
    assert placement_topic("lab", "n4") not in pushed                  # kept job: not touched
    assert broker.retained[placement_topic("lab", "n4")] == before[placement_topic("lab", "n4")]
    assert pushed[placement_topic("lab", "n2")] == b""                   # the dead node is cleared
    summary = parse_summary(broker.retained[plan_topic("lab")])
    a = next(j for j in summary.jobs if j.name == "a")
    assert "n2" not in a.node_ids and a.plan_id == report.plan_id
    assert next(j for j in summary.jobs if j.name == "b").plan_id == "p1"
    for node in a.node_ids:
        role = parse_placement(broker.retained[placement_topic("lab", node)]).roles[0]
        assert role.job == "a" and role.plan_id == report.plan_id
    # A second check finds nothing to do: the plan no longer uses the dead node.
    assert await replanner.check() is None


async def test_replanner_ignores_nodes_the_store_does_not_monitor():
    net = two_city_net()
    broker = MemoryBroker()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1)

    async def last_seen():
        return {"n0": 100_000}        # only n0 has an agent; the others came from a fleet file

    async def network():
        return net

    replanner = Replanner(broker, fleet="lab", last_seen=last_seen, network=network, timeout_s=3,
                          clock_ms=lambda: 101_000)
    assert await replanner.check() is None


async def test_replanner_without_a_plan_does_nothing():
    async def never():
        raise AssertionError("not needed without a plan")

    replanner = Replanner(MemoryBroker(), fleet="lab", last_seen=never, network=never)
    assert await replanner.check() is None
