"""A new placement-signing key in serve, in process (an in-memory broker, a real store): the plan
the previous key signed is adopted and re-signed when serve is told that key, and logged once
(never every round) when it is not; the lifecycle goes on either way.
The whole procedure with real processes: tests/planner/service/test_key_rotation_e2e.py."""

from __future__ import annotations

import logging

import pytest

from hulk.errors import InputError
from hulk.wire.broker import placement_topic, plan_topic
from hulk.wire.placement import parse_placement, parse_summary
from hulk.wire.signing import Signer
from planner.core.lifecycle import CANCELLED, RUNNING, SUCCEEDED
from planner.core.placements import job_spec
from planner.methods import planner_for
from planner.service.lifecycle import JobLifecycle
from planner.service.placement_seq import StoreSequence
from planner.service.publisher import InMemoryPublisher, RetainedPlan, UntrustedSummary
from planner.service.reconcile import Reconciler
from planner.service.recovery import Replanner
from planner.service.store import Store
from tests.helpers.plans import job, two_city_net
from tests.helpers.serve import FLEET, OPTIONS, FakeNodes, store_jobs

NOW = 1_000_000
SEARCH = planner_for("search")
OLD, NEW = Signer.generate(), Signer.generate()


class Serve:
    """Serve's three rounds (lifecycle, reconcile, recovery) over one broker, store and nodes,
    signing with ``signer``."""

    def __init__(self, broker, store, nodes, signer: Signer):
        # Sequence numbers kept in the store, as serve keeps them across its restarts.
        self.plan = RetainedPlan(broker, fleet=FLEET, signer=signer, clock_ms=lambda: NOW,
                                 sequence=StoreSequence(store.database))
        jobs = store_jobs(store)
        self.lifecycle = JobLifecycle(self.plan, nodes, jobs, options=OPTIONS, planner=SEARCH,
                                      clock_ms=lambda: NOW)
        self.reconciler = Reconciler(self.plan, nodes, jobs, options=OPTIONS, grace_s=10,
                                     clock_ms=lambda: NOW, started_ms=0)
        self.replanner = Replanner(self.plan, nodes, jobs, options=OPTIONS, planner=SEARCH,
                                   clock_ms=lambda: NOW, started_ms=0)

    async def rounds(self, n: int) -> None:
        for _ in range(n):
            await self.lifecycle.run_once()
            await self.reconciler.run_once()
            await self.replanner.run_once()


async def running_job(tmp_path):
    """Job ``a`` placed by a serve signing with OLD and running."""
    net = two_city_net(per_city=2)
    store = Store(tmp_path / "s.sqlite")
    nodes = FakeNodes(net, {n: NOW for n in net.ids})
    broker = InMemoryPublisher()
    old = Serve(broker, store, nodes, OLD)
    store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    await old.lifecycle.run_once()
    a = store.job_by_name("a")
    nodes.report(a.nodes, "running", "a", a.plan_id)
    await old.lifecycle.run_once()
    assert store.job_by_name("a").state == RUNNING
    return store, nodes, broker, a


def placement(broker, node, signer):
    return parse_placement(broker.retained[placement_topic(FLEET, node)], verifier=signer.verifier())


async def test_serve_told_the_previous_key_re_signs_the_plan_and_the_job_keeps_running(tmp_path, caplog):
    store, nodes, broker, a = await running_job(tmp_path)
    before = {n: placement(broker, n, OLD) for n in a.nodes}
    caplog.set_level(logging.WARNING)
    new = Serve(broker, store, nodes, NEW.replacing(OLD.verifier()))
    await new.rounds(3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    summary = parse_summary(broker.retained[plan_topic(FLEET)], verifier=NEW.verifier())
    assert [j.name for j in summary.jobs] == ["a"] and summary.plan_id == a.plan_id
    for node in a.nodes:                       # same roles, the new key, a higher number
        after = placement(broker, node, NEW)
        assert after.roles == before[node].roles and after.seq > before[node].seq
    record = store.job_by_name("a")
    assert (record.state, record.plan_id, record.restarts) == (RUNNING, a.plan_id, 0)
    # The lifecycle goes on under the new key: a cancel clears the job's nodes.
    store.update_job(a.id, state=CANCELLED)
    await new.lifecycle.run_once()
    assert store.job_by_name("a").retired_ms is not None
    assert all(placement(broker, n, NEW).roles == () for n in a.nodes)


async def test_a_summary_signed_by_no_key_serve_holds_is_logged_once_and_left_alone(tmp_path, caplog):
    store, nodes, broker, a = await running_job(tmp_path)
    retained = dict(broker.retained)
    pushes = len(broker.published)
    caplog.set_level(logging.INFO)
    new = Serve(broker, store, nodes, NEW)             # restarted without --previous-placement-key
    store.submit_job("b", job_spec(job("b", "bert-large", ("python", "train.py"))))
    await new.rounds(5)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert "--previous-placement-key" in errors[0].getMessage()
    assert "Rotating the placement-signing key" in errors[0].getMessage()
    assert broker.retained == retained and len(broker.published) == pushes   # nothing touched
    # The jobs serve knows from its store are still followed.
    nodes.report(a.nodes, "exited", "a", a.plan_id)
    await new.rounds(2)
    assert store.job_by_name("a").state == SUCCEEDED
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    with pytest.raises(UntrustedSummary):
        await new.plan.summary()


def test_serve_takes_previous_keys_from_the_variable_and_the_flag(tmp_path):
    from planner.security.signing import load_signer
    from planner.settings import load_settings

    key = tmp_path / "new.key"
    key.write_bytes(NEW.private_pem())
    (tmp_path / "old.pub").write_bytes(OLD.public_pem())
    third = Signer.generate()
    env = {"HULK_PREVIOUS_PLACEMENT_KEY": f"{tmp_path / 'old.pub'}, {third.public_text()}"}
    settings = load_settings(env.get)
    assert settings.previous_placement_key == (str(tmp_path / "old.pub"), third.public_text())
    signer = load_signer(key, "--signing-key", previous=settings.previous_placement_key)
    body = {"plan_id": "p"}
    for old in (OLD, third):
        signer.previous.verify(old.sign(body))          # trusted until re-signed
        signer.trusted().verify(old.sign(body))
    with pytest.raises(InputError):
        signer.verifier().verify(OLD.sign(body))        # but never signed with
    assert load_signer(key, "--signing-key").previous is None
