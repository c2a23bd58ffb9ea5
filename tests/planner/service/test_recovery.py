"""The Replanner's decisions against an in-memory broker (the pure decisions are tested in
tests/planner/core/test_recovery.py)."""

from __future__ import annotations

from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from planner.service.publisher import push_new_plan
from planner.service.recovery import Replanner
from hulk.wire.signing import Signer
from planner.service.publisher import RESIGN_BEFORE_MS, VALIDITY_MS
from tests.helpers.plans import manual_plan, two_city_net
from tests.helpers.signing import SIGNER, VERIFIER


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
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    before = dict(broker.retained)
    now = [100_000]
    seen = {n: now[0] for n in net.ids}
    seen["n2"] = now[0] - 5_000

    async def last_seen():
        return seen

    async def network():
        return net

    replanner = Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network, timeout_s=3,
                          clock_ms=lambda: now[0], started_ms=0)    # serving for a long time
    report = await replanner.check()
    assert report is not None and report.down == ["n2"] and report.replanned == ["a"]
    assert report.kept == ["b"]
    pushed = broker.published[-1]
    assert placement_topic("lab", "n4") not in pushed                  # kept job: not touched
    assert broker.retained[placement_topic("lab", "n4")] == before[placement_topic("lab", "n4")]
    assert pushed[placement_topic("lab", "n2")] == b""                   # the dead node is cleared
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    a = next(j for j in summary.jobs if j.name == "a")
    assert "n2" not in a.node_ids and a.plan_id == report.plan_id
    assert next(j for j in summary.jobs if j.name == "b").plan_id == "p1"
    for node in a.node_ids:
        role = parse_placement(broker.retained[placement_topic("lab", node)], verifier=VERIFIER).roles[0]
        assert role.job == "a" and role.plan_id == report.plan_id
    # A second check finds nothing to do: the plan no longer uses the dead node.
    assert await replanner.check() is None


async def test_replanner_ignores_nodes_the_store_does_not_monitor():
    net = two_city_net()
    broker = MemoryBroker()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)

    async def last_seen():
        return {"n0": 100_000}        # only n0 has an agent; the others came from a fleet file

    async def network():
        return net

    replanner = Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network, timeout_s=3,
                          clock_ms=lambda: 101_000)
    assert await replanner.check() is None


async def test_replanner_without_a_plan_does_nothing():
    async def never():
        raise AssertionError("not needed without a plan")

    replanner = Replanner(MemoryBroker(), fleet="lab", signer=SIGNER, last_seen=never, network=never)
    assert await replanner.check() is None


async def test_a_restarted_planner_gives_every_node_a_full_timeout_before_calling_it_silent():
    """serve restarted after an hour down: the store's heartbeats are an hour old, yet no job is
    stopped; a node still silent a full timeout after the restart is re-planned as usual."""
    net = two_city_net(per_city=4)
    broker = MemoryBroker()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    restart = 3_600_000 + 100_000
    now = [restart]
    seen = {n: 100_000 for n in net.ids}                 # last heard an hour before the restart

    async def last_seen():
        return seen

    async def network():
        return net

    replanner = Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network, timeout_s=3,
                          clock_ms=lambda: now[0])
    assert await replanner.check() is None               # right after the restart
    now[0] = restart + 2_500
    seen.update({n: now[0] for n in net.ids if n != "n2"})   # the agents are back within seconds
    assert await replanner.check() is None
    assert broker.published[-1:] and len(broker.published) == 1    # nothing pushed but the plan
    now[0] = restart + 3_500                             # n2 never came back
    report = await replanner.check()
    assert report is not None and report.down == ["n2"]


async def test_a_summary_that_does_not_verify_is_logged_and_left_alone(caplog):
    """Recovery never re-plans from (nor re-signs) what another key signed: commands read back
    from the broker are acted on only when the planner's own key signed them."""
    net = two_city_net(per_city=4)
    broker = MemoryBroker()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=Signer.generate())
    seen = {n: 0 for n in net.ids}                        # every node silent: re-planning would push

    async def last_seen():
        return seen

    async def network():
        return net

    replanner = Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network,
                          timeout_s=3, clock_ms=lambda: 100_000, started_ms=0)
    assert await replanner.check() is None
    assert len(broker.published) == 1                     # only the foreign push itself
    assert any("does not verify" in r.getMessage() and "bad signature" in r.getMessage()
               for r in caplog.records)


async def test_placements_near_expiry_are_re_signed_with_the_same_roles_and_forgeries_left_alone(caplog):
    net = two_city_net(per_city=4)
    broker = MemoryBroker()
    pushed = await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1",
                                 issued_at_ms=1, signer=SIGNER)
    forged_topic = placement_topic("lab", "n4")
    forged = pushed["n4"].signed(Signer.generate(), issued_at_ms=2, expires_at_ms=3).to_bytes()
    broker.retained[forged_topic] = forged
    now = [1 + VALIDITY_MS - RESIGN_BEFORE_MS - 1000]     # not yet due

    async def last_seen():
        return {n: now[0] for n in net.ids}

    async def network():
        return net

    replanner = Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network,
                          timeout_s=3, clock_ms=lambda: now[0], started_ms=0)
    assert await replanner.check() is None and len(broker.published) == 1
    now[0] += 2000                                          # less than RESIGN_BEFORE_MS left
    assert await replanner.check() is None and len(broker.published) == 2
    assert forged_topic not in broker.published[-1] and broker.retained[forged_topic] == forged
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert summary.issued_at_ms == now[0] and summary.expires_at_ms == now[0] + VALIDITY_MS
    for node, old in pushed.items():
        if node == "n4":
            continue
        new = parse_placement(broker.retained[placement_topic("lab", node)], verifier=VERIFIER)
        assert new.roles == old.roles and new.plan_id == old.plan_id
        assert new.issued_at_ms == now[0]
    assert any("re-signing: leaving" in r.getMessage() for r in caplog.records)


async def test_a_replanned_job_starts_again_with_its_restart_count():
    """The re-placed job's roles carry its restarts so far plus this one (HULK_RESTART_COUNT),
    which the training program uses to resume from its checkpoint."""
    net = two_city_net(per_city=4)
    broker = MemoryBroker()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    seen = {n: 100_000 for n in net.ids}
    seen["n2"] = 95_000

    async def last_seen():
        return seen

    async def network():
        return net

    async def restart_counts():
        return {"a": 2, "b": 0}

    replanner = Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network,
                          timeout_s=3, clock_ms=lambda: 100_000, started_ms=0,
                          restart_counts=restart_counts)
    report = await replanner.check()
    assert report is not None and report.replanned == ["a"]
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    (a,) = [j for j in summary.jobs if j.name == "a"]
    for node in a.node_ids:
        role = parse_placement(broker.retained[placement_topic("lab", node)],
                               verifier=VERIFIER).roles[0]
        assert role.job == "a" and role.restart_count == 3


async def test_recovery_repairs_the_running_placement_first_and_re_plans_only_what_it_cannot():
    """By default the Replanner's new plan is the warm-started repair's (planner.search.repair),
    and ``search`` is not asked; a job whose node the network no longer has (no placement to
    repair) is re-planned in full by ``search``."""
    from planner.core.recovery import sub_network
    from planner.search import plan_search
    from planner.search.repair import repair_jobs

    net = two_city_net(per_city=6)
    plan = manual_plan(net)                      # a on n0-n3, b on n4
    broker = MemoryBroker()
    await push_new_plan(broker, plan, net, fleet="lab", plan_id="p1", issued_at_ms=1, signer=SIGNER)
    seen = {n: 100_000 for n in net.ids}
    seen["n2"] = 95_000
    live = [net]

    async def last_seen():
        return seen

    async def network():
        return live[0]

    asked = []

    def search(jobs, sub, seed=0):
        asked.append([j.name for j in jobs])
        return plan_search(jobs, sub, seed=seed)

    replanner = Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network,
                          timeout_s=3, clock_ms=lambda: 100_000, started_ms=0, search=search)
    report = await replanner.check()
    assert report is not None and report.replanned == ["a"] and asked == []
    expected = repair_jobs(plan, net, [plan.placements[0].job], ["n2"], search=search).plan
    a = next(p for p in expected.placements if p.job.name == "a")
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert next(j for j in summary.jobs if j.name == "a").node_ids == [net.ids[i] for i in a.nodes]

    # Now n4 (job b's node) leaves the fleet and a node of a's new placement goes silent.
    live[0] = sub_network(net, [i for i in range(net.n) if net.ids[i] != "n4"])
    silent = next(j for j in summary.jobs if j.name == "a").node_ids[0]
    seen[silent] = 95_000
    report = await replanner.check()
    assert report is not None and report.replanned == ["a", "b"] and asked == [["b"]]
