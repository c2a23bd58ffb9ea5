"""The serve lifecycle task against an in-memory broker and a real store (the decisions are
tested in tests/planner/core/test_lifecycle.py), and recovery's restart counting."""

from __future__ import annotations

from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from planner.core.lifecycle import CANCELLED, PLACED, QUEUED, RUNNING, SUCCEEDED
from planner.core.placements import job_spec
from planner.service.lifecycle import JobLifecycle, recovery_hooks
from planner.service.recovery import Replanner
from planner.service.store import Store
from tests.helpers.plans import job, two_city_net
from tests.helpers.signing import SIGNER, VERIFIER
from tests.planner.service.test_recovery import MemoryBroker

NOW = 1_000_000


class FakeRuntime:
    """What the lifecycle needs of a serve runtime: a store and ``in_store``; node rows are ours."""

    def __init__(self, store, net):
        self.store = store
        self.rows = {n: {"id": n, "source": "agent", "last_seen_ms": NOW, "address": "127.0.0.1"}
                     for n in net.ids}

    async def in_store(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    async def call(self, name, *args, **kwargs):
        if name == "nodes":
            return [dict(r) for r in self.rows.values()]
        return getattr(self.store, name)(*args, **kwargs)

    def report(self, nodes, state, job_name, plan_id, code=0):
        for n in nodes:
            self.rows[n].update(launch_state=state, launch_job=job_name, launch_plan_id=plan_id,
                                launch_exit_code=code, launch_detail="")


def setup(tmp_path, **kw):
    net = two_city_net(per_city=2)
    store = Store(tmp_path / "s.sqlite")
    runtime = FakeRuntime(store, net)
    broker = MemoryBroker()

    async def network():
        return net

    lifecycle = JobLifecycle(broker, fleet="lab", signer=SIGNER, in_store=runtime.call,
                             network=network, timeout_s=3, clock_ms=lambda: NOW, **kw)
    return net, store, runtime, broker, lifecycle


def replanner_for(net, store, runtime, broker, seen: dict, **kw) -> Replanner:
    """Serve's Replanner over ``setup``'s parts, the nodes last seen at ``seen`` (ms)."""
    async def last_seen():
        return seen

    async def network():
        return net

    hooks = recovery_hooks(type("R", (), {"store": store, "in_store": runtime.in_store})())
    return Replanner(broker, fleet="lab", signer=SIGNER, last_seen=last_seen, network=network,
                     timeout_s=3, clock_ms=lambda: NOW, started_ms=0, **kw, **hooks)


async def test_queued_jobs_are_placed_followed_and_retired(tmp_path):
    net, store, runtime, broker, lifecycle = setup(tmp_path)
    runtime.rows[net.ids[-1]]["last_seen_ms"] = NOW - 10_000      # a silent node gets nothing
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
    runtime.report(a.nodes, "running", "a", a.plan_id)
    assert (await lifecycle.run_once()).moved == {"a": RUNNING}
    runtime.report(a.nodes, "exited", "a", a.plan_id)
    done = await lifecycle.run_once()
    assert done.moved == {"a": SUCCEEDED} and done.retired == ["a"]
    assert len(broker.published) == pushes + 1
    for node in a.nodes:                                          # cleared: never runs again
        assert placement_topic("lab", node) not in broker.retained
    assert plan_topic("lab") not in broker.retained
    a = store.job_by_name("a")
    assert a.retired_ms is not None and [e[0] for e in a.events] == [QUEUED, PLACED, RUNNING, SUCCEEDED]
    assert await lifecycle.run_once() is not None and store.job_records(unretired_only=True) == []


async def test_cancel_clears_only_the_cancelled_jobs_nodes(tmp_path):
    net, store, runtime, broker, lifecycle = setup(tmp_path)
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
        assert placement_topic("lab", node) not in broker.retained
    for node in b.nodes:                                          # b's nodes: untouched
        assert broker.retained[placement_topic("lab", node)] == b_messages[node]
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    assert [(j.name, j.plan_id) for j in summary.jobs] == [("b", b.plan_id)]


async def test_recovery_counts_a_restart_and_never_replans_a_finished_job(tmp_path):
    net, store, runtime, broker, lifecycle = setup(tmp_path)
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    a = store.job_by_name("a")
    seen = {n: NOW for n in net.ids}
    seen[a.nodes[0]] = NOW - 10_000
    replanner = replanner_for(net, store, runtime, broker, seen)
    report = await replanner.run_once()
    again = store.job_by_name("a")
    if report.replanned == ["a"]:
        assert again.restarts == 1 and again.state == PLACED and again.plan_id == report.plan_id
        assert a.nodes[0] not in again.nodes
    else:                          # no free nodes left: back in the queue, restart counted
        assert report.lost == ["a"] and again.state == QUEUED and again.restarts == 1
    # A succeeded job whose node goes silent before it is retired is left alone.
    store.update_job(again.id, state=SUCCEEDED)
    seen.update({n: NOW - 10_000 for n in again.nodes})
    pushed = len(broker.published)
    report = await replanner.run_once()
    assert report is None or report.replanned == []
    assert store.job_by_name("a").restarts == 1 and len(broker.published) >= pushed
