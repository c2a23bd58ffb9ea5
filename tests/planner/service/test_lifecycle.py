"""The serve lifecycle task against an in-memory broker and a real store (the decisions are
tested in tests/planner/core/test_lifecycle.py), and recovery's restart counting."""

from __future__ import annotations

from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from planner.core.lifecycle import CANCELLED, PLACED, QUEUED, RUNNING, SUCCEEDED
from planner.core.placements import job_spec
from planner.methods import planner_for
from planner.service.lifecycle import JobLifecycle
from planner.service.publisher import InMemoryPublisher
from planner.service.recovery import Replanner
from planner.service.store import Store
from tests.helpers.plans import job, two_city_net
from tests.helpers.serve import OPTIONS, FakeNodes, current_plan, is_clear, store_jobs
from tests.helpers.signing import VERIFIER

NOW = 1_000_000
SEARCH = planner_for("search")     # quicker than serve's default on these tiny fleets


def setup(tmp_path, **kw):
    net = two_city_net(per_city=2)
    store = Store(tmp_path / "s.sqlite")
    nodes = FakeNodes(net, {n: NOW for n in net.ids})
    broker = InMemoryPublisher()
    lifecycle = JobLifecycle(current_plan(broker), nodes, store_jobs(store), options=OPTIONS,
                             planner=SEARCH, clock_ms=lambda: NOW, **kw)
    return net, store, nodes, broker, lifecycle


def replanner_for(store, nodes, broker, **kw) -> Replanner:
    """Serve's Replanner over ``setup``'s parts."""
    return Replanner(current_plan(broker), nodes, store_jobs(store), options=OPTIONS,
                     planner=SEARCH, clock_ms=lambda: NOW, started_ms=0, **kw)


async def test_queued_jobs_are_placed_followed_and_retired(tmp_path):
    net, store, nodes, broker, lifecycle = setup(tmp_path)
    nodes.seen[net.ids[-1]] = NOW - 10_000      # a silent node gets nothing
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    first = await lifecycle.run_once()
    a = store.job_by_name("a")
    assert first.placed == {"a": list(a.nodes)} and a.state == PLACED and a.estimate_s > 0
    assert net.ids[-1] not in a.nodes
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert [j.name for j in summary.jobs] == ["a"]
    for node in a.nodes:
        role = parse_placement(broker.retained[placement_topic("lab", node)], verifier=VERIFIER).roles[0]
        assert (role.job, role.plan_id) == ("a", a.plan_id)
    assert (await lifecycle.run_once()).placed == {}              # nothing new: nothing pushed
    pushes = len(broker.published)
    nodes.report(a.nodes, "running", "a", a.plan_id)
    assert (await lifecycle.run_once()).moved == {"a": RUNNING}
    nodes.report(a.nodes, "exited", "a", a.plan_id)
    done = await lifecycle.run_once()
    assert done.moved == {"a": SUCCEEDED} and done.retired == ["a"]
    assert len(broker.published) == pushes + 1
    for node in a.nodes:                                          # cleared: never runs again
        assert is_clear(broker.retained[placement_topic("lab", node)])
    assert plan_topic("lab") not in broker.retained
    a = store.job_by_name("a")
    assert a.retired_ms is not None and [e[0] for e in a.events] == [QUEUED, PLACED, RUNNING, SUCCEEDED]
    assert await lifecycle.run_once() is not None and store.job_records(unretired_only=True) == []


async def test_cancel_clears_only_the_cancelled_jobs_nodes(tmp_path):
    net, store, nodes, broker, lifecycle = setup(tmp_path)
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    store.submit_job("b", job_spec(job("b", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    a, b = store.job_by_name("a"), store.job_by_name("b")
    if b.state != PLACED:          # the search used every node for a: b waits; nothing more here
        assert b.state == QUEUED
        return
    assert not set(a.nodes) & set(b.nodes)
    b_messages = {n: broker.retained[placement_topic("lab", n)] for n in b.nodes}
    store.update_job(a.id, state=CANCELLED)
    report = await lifecycle.run_once()
    assert report.retired == ["a"]
    for node in a.nodes:
        assert is_clear(broker.retained[placement_topic("lab", node)])
    for node in b.nodes:                                          # b's nodes: untouched
        assert broker.retained[placement_topic("lab", node)] == b_messages[node]
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert [(j.name, j.plan_id) for j in summary.jobs] == [("b", b.plan_id)]


async def test_recovery_counts_a_restart_and_never_replans_a_finished_job(tmp_path):
    net, store, nodes, broker, lifecycle = setup(tmp_path)
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    a = store.job_by_name("a")
    nodes.seen[a.nodes[0]] = NOW - 10_000
    replanner = replanner_for(store, nodes, broker)
    report = await replanner.run_once()
    again = store.job_by_name("a")
    if report.replanned == ["a"]:
        assert again.restarts == 1 and again.state == PLACED and again.plan_id == report.plan_id
        assert a.nodes[0] not in again.nodes
    else:                          # no free nodes left: back in the queue, restart counted
        assert report.lost == ["a"] and again.state == QUEUED and again.restarts == 1
    # A succeeded job whose node goes silent before it is retired is left alone.
    store.update_job(again.id, state=SUCCEEDED)
    nodes.seen.update({n: NOW - 10_000 for n in again.nodes})
    pushed = len(broker.published)
    report = await replanner.run_once()
    assert report is None or report.replanned == []
    assert store.job_by_name("a").restarts == 1 and len(broker.published) >= pushed


async def test_the_current_plan_decides_which_nodes_a_retired_job_clears(tmp_path):
    """The retained summary owns where jobs run; a job record's nodes are only its view: a
    cancelled job's nodes are those the current plan names, whatever its record says."""
    net, store, nodes, broker, lifecycle = setup(tmp_path)
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    a = store.job_by_name("a")
    stale = [n for n in net.ids if n not in a.nodes]
    store.update_job(a.id, state=CANCELLED, nodes=stale)     # a record out of step with the plan
    assert (await lifecycle.run_once()).retired == ["a"]
    pushed = broker.published[-1]
    assert pushed[plan_topic("lab")] == b""                  # nothing runs any more
    assert {t for t, payload in pushed.items() if t != plan_topic("lab") and is_clear(payload)} == {
        placement_topic("lab", n) for n in a.nodes}
