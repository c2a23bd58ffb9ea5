"""The Replanner's decisions against an in-memory broker (the pure decisions are tested in
tests/planner/core/test_recovery.py)."""

from __future__ import annotations

from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from hulk.wire.signing import Signer
from planner.core.placements import job_spec
from planner.methods import planner_for
from planner.service.publisher import (RESIGN_BEFORE_MS, VALIDITY_MS, InMemoryPublisher,
                                       push_new_plan)
from planner.service.recovery import Replanner
from planner.service.store import Store
from tests.helpers.plans import manual_plan, two_city_net
from tests.helpers.serve import OPTIONS, FakeNodes, current_plan, is_clear, store_jobs
from tests.helpers.signing import SIGNER, VERIFIER


SEARCH = planner_for("search")     # quicker than serve's default on these tiny fleets


def replanner(broker, nodes, jobs=None, *, now, **kw) -> Replanner:
    """Recovery of fleet ``lab`` (3 s node timeout) at time ``now()`` (ms); plain search."""
    return Replanner(current_plan(broker), nodes, jobs, options=OPTIONS, clock_ms=now,
                     planner=kw.pop("planner", SEARCH), **kw)


async def test_replanner_pushes_new_roles_only_to_the_affected_job_and_clears_the_dead_node():
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    before = dict(broker.retained)
    now = [100_000]
    seen = {n: now[0] for n in net.ids}
    seen["n2"] = now[0] - 5_000
    recovery = replanner(broker, FakeNodes(net, seen), now=lambda: now[0],
                         started_ms=0)    # serving for a long time
    report = await recovery.check()
    assert report is not None and report.down == ["n2"] and report.replanned == ["a"]
    assert report.kept == ["b"]
    pushed = broker.published[-1]
    assert placement_topic("lab", "n4") not in pushed                  # kept job: not touched
    assert broker.retained[placement_topic("lab", "n4")] == before[placement_topic("lab", "n4")]
    assert is_clear(pushed[placement_topic("lab", "n2")])               # the dead node is cleared
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    a = next(j for j in summary.jobs if j.name == "a")
    assert "n2" not in a.node_ids and a.plan_id == report.plan_id
    assert next(j for j in summary.jobs if j.name == "b").plan_id == "p1"
    for node in a.node_ids:
        role = parse_placement(broker.retained[placement_topic("lab", node)], verifier=VERIFIER).roles[0]
        assert role.job == "a" and role.plan_id == report.plan_id
    # A second check finds nothing to do: the plan no longer uses the dead node.
    assert await recovery.check() is None


async def test_a_revoked_node_that_still_calls_is_down_and_its_job_re_planned_elsewhere():
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    now = [100_000]
    nodes = FakeNodes(net, {n: now[0] for n in net.ids})   # every agent calls on time
    recovery = replanner(broker, nodes, now=lambda: now[0], started_ms=0)
    assert await recovery.check() is None
    nodes.revoked.add("n2")
    report = await recovery.check()
    assert report is not None and report.down == ["n2"] and report.replanned == ["a"]
    assert is_clear(broker.published[-1][placement_topic("lab", "n2")])
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert all("n2" not in j.node_ids for j in summary.jobs)


async def test_replanner_ignores_nodes_the_store_does_not_monitor():
    net = two_city_net()
    broker = InMemoryPublisher()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    nodes = FakeNodes(net, {"n0": 100_000})   # only n0 has an agent; the others came from a file
    assert await replanner(broker, nodes, now=lambda: 101_000).check() is None
    assert len(broker.published) == 1


async def test_replanner_without_a_plan_does_nothing():
    class Never:
        async def nodes(self):
            raise AssertionError("not needed without a plan")

        network = nodes

    assert await replanner(InMemoryPublisher(), Never(), now=lambda: 0).check() is None


async def test_a_restarted_planner_gives_every_node_a_full_timeout_before_calling_it_silent():
    """serve restarted after an hour down: the store's heartbeats are an hour old, yet no job is
    stopped; a node still silent a full timeout after the restart is re-planned as usual."""
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    restart = 3_600_000 + 100_000
    now = [restart]
    seen = {n: 100_000 for n in net.ids}                 # last heard an hour before the restart
    recovery = replanner(broker, FakeNodes(net, seen), now=lambda: now[0])
    assert await recovery.check() is None                # right after the restart
    now[0] = restart + 2_500
    seen.update({n: now[0] for n in net.ids if n != "n2"})   # the agents are back within seconds
    assert await recovery.check() is None
    assert broker.published[-1:] and len(broker.published) == 1    # nothing pushed but the plan
    now[0] = restart + 3_500                             # n2 never came back
    report = await recovery.check()
    assert report is not None and report.down == ["n2"]


async def test_a_summary_that_does_not_verify_is_logged_and_left_alone(caplog):
    """Recovery never re-plans from (nor re-signs) what another key signed: commands read back
    from the broker are acted on only when the planner's own key signed them."""
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=Signer.generate())
    nodes = FakeNodes(net, {n: 0 for n in net.ids})    # every node silent: re-planning would push
    assert await replanner(broker, nodes, now=lambda: 100_000, started_ms=0).check() is None
    assert len(broker.published) == 1                     # only the foreign push itself
    assert any("does not verify" in r.getMessage() and "bad signature" in r.getMessage()
               for r in caplog.records)


async def test_placements_near_expiry_are_re_signed_with_the_same_roles_and_forgeries_left_alone(caplog):
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    pushed = await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1",
                                 issued_at_ms=1, signer=SIGNER)
    forged_topic = placement_topic("lab", "n4")
    forged = pushed["n4"].signed(Signer.generate(), issued_at_ms=2, expires_at_ms=3).to_bytes()
    broker.retained[forged_topic] = forged
    now = [1 + VALIDITY_MS - RESIGN_BEFORE_MS - 1000]     # not yet due
    seen = {n: now[0] for n in net.ids}
    recovery = replanner(broker, FakeNodes(net, seen), now=lambda: now[0], started_ms=0)
    assert await recovery.check() is None and len(broker.published) == 1
    now[0] += 2000                                          # less than RESIGN_BEFORE_MS left
    seen.update({n: now[0] for n in net.ids})
    assert await recovery.check() is None and len(broker.published) == 2
    assert forged_topic not in broker.published[-1] and broker.retained[forged_topic] == forged
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert summary.issued_at_ms == now[0] and summary.expires_at_ms == now[0] + VALIDITY_MS
    for node, old in pushed.items():
        if node == "n4":
            continue
        new = parse_placement(broker.retained[placement_topic("lab", node)], verifier=VERIFIER)
        assert new.roles == old.roles and new.plan_id == old.plan_id
        assert new.issued_at_ms == now[0]
    assert any(f"leaving {forged_topic} alone" in r.getMessage() for r in caplog.records)


async def test_a_replanned_job_starts_again_with_its_restart_count(tmp_path):
    """The re-placed job's roles carry its restarts so far plus this one (HULK_RESTART_COUNT),
    which the training program uses to resume from its checkpoint."""
    net = two_city_net(per_city=4)
    plan = manual_plan(net)
    broker = InMemoryPublisher()
    await push_new_plan(broker, plan, net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    seen = {n: 100_000 for n in net.ids}
    seen["n2"] = 95_000
    with Store(tmp_path / "s.sqlite") as store:
        a = store.submit_job("a", job_spec(plan.placements[0].job))
        for _ in range(2):
            store.update_job(a.id, restart=True)
        recovery = replanner(broker, FakeNodes(net, seen), store_jobs(store),
                             now=lambda: 100_000, started_ms=0)
        report = await recovery.check()
    assert report is not None and report.replanned == ["a"]
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    (a,) = [j for j in summary.jobs if j.name == "a"]
    for node in a.node_ids:
        role = parse_placement(broker.retained[placement_topic("lab", node)],
                               verifier=VERIFIER).roles[0]
        assert role.job == "a" and role.restart_count == 3


async def test_recovery_repairs_the_running_placement_first_and_re_plans_only_what_it_cannot():
    """The Replanner's new plan is the warm-started repair's (planner.search.repair), and the
    planner is not asked; a job whose node the network no longer has (no placement to repair)
    is re-planned in full by the planner."""
    from planner.core.recovery import sub_network
    from planner.search.repair import repair_jobs

    net = two_city_net(per_city=6)
    plan = manual_plan(net)                      # a on n0-n3, b on n4
    broker = InMemoryPublisher()
    await push_new_plan(broker, plan, net, fleet="lab", plan_id="p1", issued_at_ms=1, signer=SIGNER)
    seen = {n: 100_000 for n in net.ids}
    seen["n2"] = 95_000
    nodes = FakeNodes(net, seen)
    asked = []

    def search(jobs, sub, seed=0, **options):
        asked.append([j.name for j in jobs])
        return SEARCH(jobs, sub, seed=seed)

    recovery = replanner(broker, nodes, now=lambda: 100_000, started_ms=0, planner=search)
    report = await recovery.check()
    assert report is not None and report.replanned == ["a"] and asked == []
    expected = repair_jobs(plan, net, [plan.placements[0].job], ["n2"], search=search).plan
    a = next(p for p in expected.placements if p.job.name == "a")
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert next(j for j in summary.jobs if j.name == "a").node_ids == [net.ids[i] for i in a.nodes]

    # Now n4 (job b's node) leaves the fleet and a node of a's new placement goes silent.
    nodes.net = sub_network(net, [i for i in range(net.n) if net.ids[i] != "n4"])
    silent = next(j for j in summary.jobs if j.name == "a").node_ids[0]
    seen[silent] = 95_000
    report = await recovery.check()
    assert report is not None and report.replanned == ["a", "b"] and asked == [["b"]]


def test_serve_re_plans_with_the_default_method_on_serve_s_budget(monkeypatch):
    """Without a planner given, recovery (and the lifecycle, which takes recovery's) plans with
    ``planner.methods.serve_planner()``: ``plan``'s default method, not the plain search."""
    import planner.methods
    from planner.service.lifecycle import JobLifecycle

    made = []

    def serve_planner(**kw):
        made.append(kw)
        return search_stub

    def search_stub(jobs, net, **kw):
        raise AssertionError("not called here")

    monkeypatch.setattr(planner.methods, "serve_planner", serve_planner)
    nodes = FakeNodes(two_city_net())
    recovery = Replanner(current_plan(InMemoryPublisher()), nodes, options=OPTIONS)
    lifecycle = JobLifecycle(current_plan(InMemoryPublisher()), nodes, None, options=OPTIONS)
    assert recovery.planner is search_stub and lifecycle.planner is search_stub
    assert made == [{}, {}]


class Session:
    """A broker session's presence as recovery sees it (BrokerSession.online_since_ms)."""

    def __init__(self, online_since_ms):
        self.online_since_ms = online_since_ms


async def test_no_node_is_silent_while_serve_is_offline_on_the_broker_nor_before_a_timeout_after():
    net = two_city_net(per_city=4)
    broker = InMemoryPublisher()
    await push_new_plan(broker, manual_plan(net), net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    now = [100_000]
    seen = {n: 10_000 for n in net.ids}          # every node silent for 90 s
    session = Session(None)                       # not connected: agents may hold their leases
    recovery = replanner(broker, FakeNodes(net, seen), now=lambda: now[0], started_ms=0,
                         session=session)
    assert await recovery.check() is None
    session.online_since_ms = now[0] - 1_000      # online for 1 s of the 3 s timeout
    assert await recovery.check() is None
    now[0] += 2_500                               # a full timeout after going online
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    planned = sorted({n for job in summary.jobs for n in job.node_ids})
    report = await recovery.check()              # now they are silent
    assert report is not None and report.down == planned
