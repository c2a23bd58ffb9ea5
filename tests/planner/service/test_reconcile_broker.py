"""Serve's reconciliation through a real mosquitto: a retained placement deleted by an empty
retained publish (as an operator's ``mosquitto_pub -r -n`` does) while its node runs the job is
retained again by the next round, and counted."""

from __future__ import annotations

import pytest

from hulk.wire.broker import parse_broker_url, placement_topic
from planner.core.placements import job_spec
from planner.core.reconcile import LOST, Resend
from planner.methods import planner_for
from planner.service.lifecycle import JobLifecycle
from planner.service.metrics import PlannerMetrics
from planner.service.publisher import MqttPublisher, RetainedPlan
from planner.service.reconcile import Reconciler
from planner.service.store import Store
from tests.helpers.plans import job, two_city_net
from tests.helpers.serve import FLEET, OPTIONS, FakeNodes, store_jobs
from tests.helpers.signing import SIGNER

NOW = 1_000_000


@pytest.mark.process
async def test_a_deleted_retained_placement_is_retained_again_within_one_round(broker, tmp_path):
    net = two_city_net(per_city=2)
    store = Store(tmp_path / "s.sqlite")
    nodes = FakeNodes(net, {n: NOW for n in net.ids})
    publisher = MqttPublisher(parse_broker_url(broker.url))
    plan, jobs = RetainedPlan(publisher, fleet=FLEET, signer=SIGNER), store_jobs(store)
    metrics = PlannerMetrics()
    lifecycle = JobLifecycle(plan, nodes, jobs, options=OPTIONS, planner=planner_for("search"),
                             clock_ms=lambda: NOW)
    reconciler = Reconciler(plan, nodes, jobs, options=OPTIONS, grace_s=10.0,
                            clock_ms=lambda: NOW, started_ms=0, events=metrics)
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    a = store.job_by_name("a")
    nodes.report(a.nodes, "running", "a", a.plan_id)
    victim = a.nodes[0]
    before = (await plan.placements([victim]))[victim]
    assert await reconciler.run_once() == []            # all retained, all running: nothing
    await publisher.publish_retained({placement_topic(FLEET, victim): b""})   # deleted
    assert await plan.placements([victim]) == {}
    assert await reconciler.run_once() == [Resend(victim, LOST, "a", a.plan_id)]
    again = (await plan.placements([victim]))[victim]
    assert again.roles == before.roles and again.seq > before.seq
    assert metrics.registry.get_sample_value("hulk_placements_resent_total",
                                             {"reason": LOST}) == 1
    assert await reconciler.run_once() == []
