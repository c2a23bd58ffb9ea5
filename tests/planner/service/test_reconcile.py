"""Serve's reconciliation against an in-memory broker and a real store (the decisions are tested
in tests/planner/core/test_reconcile.py): a lost placement is sent again as it was, a process
the plan no longer gives a node is stopped, a job running after it ended is noticed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hulk.wire.broker import placement_topic
from hulk.wire.placement import parse_placement
from planner.core.lifecycle import CANCELLED, SUCCEEDED
from planner.core.placements import job_spec
from planner.core.reconcile import LOST, UNPLANNED, Resend
from planner.methods import planner_for
from planner.service.lifecycle import JobLifecycle
from planner.service.metrics import PlannerMetrics
from planner.service.publisher import InMemoryPublisher
from planner.service.reconcile import Reconciler
from planner.service.runtime import BackgroundTask
from planner.service.store import Store
from tests.helpers.plans import job, two_city_net
from tests.helpers.serve import FLEET, OPTIONS, FakeNodes, current_plan, store_jobs
from tests.helpers.signing import SIGNER, VERIFIER

NOW = 1_000_000
GRACE_MS = 10_000
SEARCH = planner_for("search")


class World:
    """A lifecycle and a reconciler over one broker, store and set of nodes, on one clock."""

    def __init__(self, tmp_path, per_city: int = 2):
        self.net = two_city_net(per_city=per_city)
        self.store = Store(tmp_path / "s.sqlite")
        self.nodes = FakeNodes(self.net, {n: NOW for n in self.net.ids})
        self.broker = InMemoryPublisher()
        self.now = NOW
        self.silent: set[str] = set()
        self.metrics = PlannerMetrics()
        plan, jobs = current_plan(self.broker), store_jobs(self.store)
        self.lifecycle = JobLifecycle(plan, self.nodes, jobs, options=OPTIONS, planner=SEARCH,
                                      clock_ms=lambda: self.now)
        self.reconciler = Reconciler(plan, self.nodes, jobs, options=OPTIONS,
                                     grace_s=GRACE_MS / 1000, clock_ms=lambda: self.now,
                                     started_ms=0, events=self.metrics)

    def at(self, t: int) -> None:
        """Time is ``t``; every node but the ``silent`` ones has just been heard from."""
        self.now = t
        self.nodes.seen.update({n: t for n in self.nodes.seen if n not in self.silent})

    async def place(self, name: str, model: str = "bert-large"):
        self.store.submit_job(name, job_spec(job(name, model, ("python", "train.py"))))
        await self.lifecycle.run_once()
        return self.store.job_by_name(name)

    def retained(self, node: str):
        raw = self.broker.retained.get(placement_topic(FLEET, node))
        return parse_placement(raw, verifier=VERIFIER) if raw else None

    def resent(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("hulk_placements_resent_total",
                                                      {"reason": reason})


async def test_a_lost_placement_is_sent_again_after_the_grace_and_at_most_every_30_s(tmp_path):
    w = World(tmp_path)
    a = await w.place("a")
    before = {n: w.retained(n) for n in a.nodes}
    w.nodes.report(a.nodes, "running", "a", a.plan_id)
    victim = a.nodes[0]
    w.nodes.report([victim], "idle", "", "")     # its agent lost its state; the message is kept
    pushes = len(w.broker.published)
    assert await w.reconciler.run_once() == []
    w.at(NOW + GRACE_MS - 1)
    assert await w.reconciler.run_once() == []
    w.at(NOW + GRACE_MS)
    assert await w.reconciler.run_once() == [Resend(victim, LOST, "a", a.plan_id)]
    assert len(w.broker.published) == pushes + 1
    assert set(w.broker.published[-1]) == {placement_topic(FLEET, victim)}   # only that node
    again = w.retained(victim)
    assert again.roles == before[victim].roles and again.seq > before[victim].seq
    assert w.resent(LOST) == 1 and w.resent(UNPLANNED) == 0
    w.at(NOW + GRACE_MS + 29_999)                     # still idle: not sooner than 30 s
    assert await w.reconciler.run_once() == []
    w.at(NOW + GRACE_MS + 30_000)
    assert [r.node for r in await w.reconciler.run_once()] == [victim]
    w.nodes.report([victim], "running", "a", a.plan_id)       # it runs again: left alone
    w.at(NOW + 10 * GRACE_MS)
    assert await w.reconciler.run_once() == [] and w.resent(LOST) == 2


async def test_a_deleted_retained_placement_of_a_running_node_is_sent_again_at_once(tmp_path):
    """Its node runs the job (nothing in its reports is wrong), but the retained message is gone:
    the round that sees it sends it again, with the same roles and a higher sequence number."""
    w = World(tmp_path)
    a = await w.place("a")
    w.nodes.report(a.nodes, "running", "a", a.plan_id)
    victim = a.nodes[0]
    before = w.retained(victim)
    del w.broker.retained[placement_topic(FLEET, victim)]
    assert await w.reconciler.run_once() == [Resend(victim, LOST, "a", a.plan_id)]
    again = w.retained(victim)
    assert again.roles == before.roles and again.seq > before.seq
    assert w.resent(LOST) == 1
    assert await w.reconciler.run_once() == []          # it is there again: left alone


async def test_a_stale_retained_placement_is_rebuilt_from_the_summary(tmp_path):
    """A retained placement that does not give the node what the summary does (an older one
    published again) is never re-signed: the node's placement is rebuilt from the summary with
    the rendezvous the job's other ranks have, although the plan's ports moved since."""
    w = World(tmp_path, per_city=3)
    a = await w.place("a")
    b = await w.place("b", "gpt2-xl")
    assert len(b.nodes) >= 2 and not set(a.nodes) & set(b.nodes), (a.nodes, b.nodes)
    before = w.retained(b.nodes[0])
    w.store.update_job(a.id, state=CANCELLED)       # a retires: b alone in the plan
    w.nodes.report(a.nodes, "idle", "", "")
    await w.lifecycle.run_once()
    assert w.store.job_by_name("a").retired_ms is not None
    stale = replace(before, roles=tuple(replace(r, plan_id="0000-old") for r in before.roles))
    w.broker.retained[placement_topic(FLEET, b.nodes[0])] = stale.signed(
        SIGNER, issued_at_ms=NOW, expires_at_ms=NOW + 10**9, seq=before.seq + 1).to_bytes()
    w.nodes.report(b.nodes, "running", "b", b.plan_id)
    w.nodes.report(b.nodes[:1], "idle", "", "")
    await w.reconciler.run_once()
    w.at(NOW + GRACE_MS)
    assert await w.reconciler.run_once() == [Resend(b.nodes[0], LOST, "b", b.plan_id)]
    rebuilt = w.retained(b.nodes[0])
    assert rebuilt.roles == before.roles, (rebuilt.roles, before.roles)
    assert rebuilt.roles[0].rendezvous_port == w.retained(b.nodes[1]).roles[0].rendezvous_port


async def test_a_job_running_after_it_ended_is_stopped_and_noted_once(tmp_path):
    w = World(tmp_path)
    a = await w.place("a")
    w.nodes.report(a.nodes, "running", "a", a.plan_id)
    await w.lifecycle.run_once()
    w.nodes.report(a.nodes, "exited", "a", a.plan_id)
    await w.lifecycle.run_once()
    done = w.store.job_by_name("a")
    assert done.state == SUCCEEDED and done.retired_ms is not None
    victim = a.nodes[0]
    cleared = w.retained(victim)
    assert cleared is not None and cleared.roles == ()
    w.nodes.report([victim], "running", "a", a.plan_id)     # its old placement, replayed
    assert await w.reconciler.run_once() == []
    w.at(NOW + GRACE_MS)
    assert await w.reconciler.run_once() == [Resend(victim, UNPLANNED, "a", a.plan_id)]
    clear = w.retained(victim)
    assert clear.roles == () and clear.seq > cleared.seq
    events = w.store.job_by_name("a").events
    assert events[-1][0] == SUCCEEDED
    assert events[-1][2] == f"running on {victim} after it ended; stopped"
    w.at(NOW + GRACE_MS + 30_000)                          # still running: sent again, one event
    assert [r.node for r in await w.reconciler.run_once()] == [victim]
    assert w.store.job_by_name("a").events == events
    assert w.resent(UNPLANNED) == 2 and w.resent(LOST) == 0


async def test_a_node_the_plan_gives_nothing_is_cleared(tmp_path):
    w = World(tmp_path)
    stray = w.net.ids[0]
    w.nodes.report([stray], "starting", "ghost", "P0")      # no summary, no retained placement
    await w.reconciler.run_once()
    w.at(NOW + GRACE_MS)
    assert await w.reconciler.run_once() == [Resend(stray, UNPLANNED, "ghost", "P0")]
    placement = w.retained(stray)
    assert placement.roles == () and placement.node == stray and placement.seq > 0


async def test_silent_nodes_are_left_to_recovery(tmp_path):
    w = World(tmp_path)
    a = await w.place("a")
    victim = a.nodes[0]
    del w.broker.retained[placement_topic(FLEET, victim)]
    w.nodes.report(a.nodes, "running", "a", a.plan_id)
    w.nodes.report([victim], "idle", "", "")
    w.nodes.seen[victim] = NOW - 10_000
    w.silent.add(victim)
    pushes = len(w.broker.published)
    for t in (NOW, NOW + GRACE_MS, NOW + 5 * GRACE_MS):
        w.at(t)
        assert await w.reconciler.run_once() == []
    assert len(w.broker.published) == pushes and w.resent(LOST) == 0


async def test_an_unreachable_broker_fails_the_round_only(tmp_path):
    w = World(tmp_path)
    w.broker.unavailable = True
    assert await w.reconciler.run_once() is None
    assert w.metrics.registry.get_sample_value("hulk_placement_push_failures_total",
                                               {"source": "reconcile"}) == 1


def test_serve_runs_it_every_lifecycle_interval_under_the_shared_lock(tmp_path):
    from planner.service.reconcile import add_to_runtime
    from planner.service.recovery import Replanner

    class Runtime:
        events = PlannerMetrics()
        tasks: list[BackgroundTask] = []

        def add_task(self, task: BackgroundTask) -> None:
            self.tasks.append(task)

    w = World(tmp_path)
    replanner = Replanner(current_plan(w.broker), w.nodes, store_jobs(w.store), options=OPTIONS)
    runtime = Runtime()
    reconciler = add_to_runtime(runtime, replanner, interval_s=0.5)
    (task,) = runtime.tasks
    assert (task.name, task.interval_s, task.in_store_thread) == ("reconcile", 0.5, False)
    assert reconciler.lock is replanner.lock and reconciler.grace_s == 10.0
    assert reconciler.events is runtime.events


async def test_a_restarted_serve_exports_the_retained_plans_makespan_in_its_first_round(tmp_path):
    w = World(tmp_path)
    w.lifecycle.events = w.metrics
    await w.place("a")
    pushed = w.metrics.registry.get_sample_value("hulk_plan_makespan_seconds")
    assert pushed > 0
    (tmp_path / "restarted").mkdir()
    later = World(tmp_path / "restarted")
    later.broker.retained = dict(w.broker.retained)          # the same broker, a new serve
    assert later.metrics.registry.get_sample_value("hulk_plan_makespan_seconds") == 0
    await later.reconciler.run_once()
    assert later.metrics.registry.get_sample_value("hulk_plan_makespan_seconds") == \
        pytest.approx(pushed)
    assert later.metrics.registry.get_sample_value("hulk_placement_pushes_total",
                                                   {"source": "jobs"}) == 0
