"""Jobs' measured step times in the store: heartbeats keep each rank's progress, the job's
measured iteration is its slowest rank's median against the plan's estimate, hostile figures are
refused at the wire (INVALID_ARGUMENT) and never stored; the metric exports both; a job that
recovery re-places is compared with its new placement's estimate."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc
import pytest

from hulk.errors import InputError
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.broker import plan_topic
from hulk.wire.placement import parse_summary
from hulk.wire.progress import StepProgress
from hulk.wire.records import HeartbeatRequest, LaunchState, LaunchStatus, RegisterRequest
from planner.core.costmodel import estimate
from planner.core.lifecycle import PLACED, RUNNING
from planner.core.placements import job_spec, plan_from_summary
from planner.methods import planner_for
from planner.service.ingest import IngestService
from planner.service.metrics import fleet_snapshot, read_snapshot, snapshot_metrics
from planner.service.publisher import InMemoryPublisher, push_new_plan
from planner.service.recovery import Replanner
from planner.service.servicer import create_server
from planner.service.store import Store
from tests.helpers.clock import ManualClock
from tests.helpers.plans import manual_plan, two_city_net
from tests.helpers.serve import OPTIONS, FakeNodes, current_plan, store_jobs
from tests.helpers.signing import SIGNER, VERIFIER

T0 = 1_790_000_000_000
SPEC = {"model": "gpt2-xl", "steps": 1000, "command": ["python", "train.py"]}


def running(job: str, plan_id: str, iteration_s: float, samples: int = 50) -> LaunchStatus:
    return LaunchStatus(LaunchState.RUNNING, plan_id=plan_id, job=job, changed_at_ms=T0,
                        progress=StepProgress(steps=120, total_steps=1000, iteration_s=iteration_s,
                                              iteration_p90_s=iteration_s * 1.1, compute_s=0.1,
                                              communication_s=0.05, samples=samples,
                                              updated_ms=T0))


@pytest.fixture
def ingest(tmp_path):
    clock = ManualClock(T0)
    store = Store(tmp_path / "planner.sqlite", clock=clock)
    service = IngestService(store, clock=clock)
    for node in ("n0", "n1", "n2", "n3"):
        service.register(RegisterRequest(node, hostname=node, address="127.0.0.1"))
    record = store.submit_job("gpt", SPEC)
    store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n0", "n1", "n2"],
                     estimate_s=250.0)
    store.update_job(record.id, state=RUNNING)
    yield service
    store.close()


def test_the_slowest_ranks_median_is_the_jobs_iteration_against_the_estimate(ingest):
    store = ingest.store
    for node, seconds in (("n0", 0.30), ("n1", 0.42), ("n2", 0.35)):
        ingest.heartbeat(HeartbeatRequest(node, time_ms=T0, launch=running("gpt", "p1", seconds)))
    ingest.heartbeat(HeartbeatRequest("n1", time_ms=T0, launch=running("gpt", "p1", 0.40, 30)))
    # A rank that measured nothing yet, a job the store does not know, an older plan's rank.
    ingest.heartbeat(HeartbeatRequest("n3", launch=running("gpt", "p1", 9.0, samples=0)))
    ingest.heartbeat(HeartbeatRequest("n3", launch=running("other", "p9", 5.0)))
    (it,) = store.job_iterations()
    assert (it.job_name, it.plan_id, it.nodes) == ("gpt", "p1", ["n0", "n1", "n2"])
    assert (it.measured_iteration_s, it.samples) == (0.40, 30)     # n1's newest report wins
    assert it.estimated_iteration_s == pytest.approx(0.25)          # 250 s over 1000 steps
    assert it.spec == SPEC
    ranks = store.rank_progress(store.job_by_name("gpt").id, "p1")
    assert [(r.node_id, r.rank) for r in ranks] == [("n3", None), ("n0", 0), ("n1", 1), ("n2", 2)]
    assert ranks[2].progress.compute_s == 0.1 and ranks[2].received_ms == T0
    record = store.job_by_name("gpt")
    store.update_job(record.id, plan_id="p2", nodes=["n3"], restart=True)   # re-placed
    assert store.job_iterations() == []                 # p1's ranks measured another placement
    ingest.heartbeat(HeartbeatRequest("n3", launch=running("gpt", "p2", 0.5)))
    assert [j.measured_iteration_s for j in store.job_iterations()] == [0.5]


@pytest.mark.parametrize("field, value", [("iteration_s", math.nan), ("iteration_s", 1e300),
                                          ("compute_s", -1.0), ("iteration_p90_s", math.inf)])
def test_hostile_progress_is_never_stored(ingest, field, value):
    good = running("gpt", "p1", 0.3)
    bad = replace(good, progress=replace(good.progress, **{field: value}))
    with pytest.raises(InputError, match=f"launch.progress.{field}"):
        ingest.heartbeat(HeartbeatRequest("n0", launch=bad))
    assert ingest.store.job_iterations() == []
    assert ingest.store.conn.execute("SELECT count(*) FROM job_progress").fetchone() == (0,)


async def test_hostile_progress_is_refused_at_the_wire_with_invalid_argument(tmp_path):
    executor = ThreadPoolExecutor(1)        # the store's thread, as serve runs it
    store = executor.submit(Store, tmp_path / "planner.sqlite").result()
    service = IngestService(store)
    executor.submit(service.register, RegisterRequest("n0", address="127.0.0.1")).result()
    executor.submit(store.submit_job, "gpt", SPEC).result()
    server, port, _ = await create_server(service, "127.0.0.1:0", executor)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = hulk_pb2_grpc.PlannerStub(channel)
            message = HeartbeatRequest("n0", launch=running("gpt", "", 0.3)).to_proto()
            message.launch.progress.iteration_s = math.nan
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Heartbeat(message, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "launch.progress.iteration_s" in caught.value.details()
            message.launch.progress.iteration_s = 0.3
            answer = await stub.Heartbeat(message, timeout=10)
            assert isinstance(answer, hulk_pb2.HeartbeatResponse) and not answer.reregister
        rows = executor.submit(lambda: store.conn.execute(
            "SELECT iteration_s FROM job_progress").fetchall()).result()
        assert rows == [(0.3,)]
    finally:
        await server.stop(None)
        executor.submit(store.close).result()
        executor.shutdown()


def test_the_metric_shows_measured_and_estimated_iteration_of_unretired_jobs(ingest):
    store = ingest.store
    ingest.heartbeat(HeartbeatRequest("n0", launch=running("gpt", "p1", 0.3)))
    snap = read_snapshot(store, node_timeout_s=60, now_ms=T0, pairs=[])
    assert snap.job_iteration_s == {("gpt", "measured"): 0.3, ("gpt", "estimated"): 0.25}
    (family,) = [m for m in snapshot_metrics(snap) if m.name == "hulk_job_iteration_seconds"]
    assert {(s.labels["job"], s.labels["kind"]): s.value for s in family.samples} == {
        ("gpt", "measured"): 0.3, ("gpt", "estimated"): 0.25}
    store.update_job(store.job_by_name("gpt").id, state="succeeded", retired=True)
    assert read_snapshot(store, node_timeout_s=60, now_ms=T0, pairs=[]).job_iteration_s == {}
    bare = fleet_snapshot([], [], [], now_ms=T0, node_timeout_s=60,
                          iterations=[("j", 1.5, None)])
    assert bare.job_iteration_s == {("j", "measured"): 1.5}



async def test_a_job_recovery_re_places_gets_its_new_placements_estimate(tmp_path):
    net = two_city_net(per_city=4)
    plan = manual_plan(net)
    broker = InMemoryPublisher()
    await push_new_plan(broker, plan, net, fleet="lab", plan_id="p1", issued_at_ms=1,
                        signer=SIGNER)
    seen = {n: 100_000 for n in net.ids}
    seen["n2"] = 95_000
    with Store(tmp_path / "s.sqlite") as store:
        first = plan.placements[0]
        a = store.submit_job("a", job_spec(first.job))
        store.update_job(a.id, state=PLACED, plan_id="p1", estimate_s=1.0,
                         nodes=[net.ids[i] for i in first.nodes])
        recovery = Replanner(current_plan(broker), FakeNodes(net, seen), store_jobs(store),
                             options=OPTIONS, clock_ms=lambda: 100_000,
                             planner=planner_for("search"), started_ms=0)
        report = await recovery.check()
        assert report is not None and report.replanned == ["a"]
        record = store.job_by_name("a")
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    (moved,) = [p for p in plan_from_summary(summary, net)[0].placements if p.job.name == "a"]
    assert record.plan_id == report.plan_id
    assert record.estimate_s == pytest.approx(estimate(moved, net).job_s) != 1.0
