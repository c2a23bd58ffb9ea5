"""The dashboard's job view shows a job's measured step time beside the plan's estimate."""

from __future__ import annotations

from hulk.wire.progress import StepProgress
from hulk.wire.records import LaunchState, LaunchStatus, RegisterRequest
from planner.dashboard.compare import ComparisonWorker
from planner.dashboard.snapshot import DashboardState
from planner.service.store import Store


def test_the_jobs_document_carries_measured_and_estimated_step_times(tmp_path):
    state = DashboardState(fleet="f", node_timeout_s=30, window_days=90,
                           worker=ComparisonWorker(lambda jobs, fleet: None))
    with Store(tmp_path / "planner.sqlite") as store:
        store.register(RegisterRequest("n0", address="127.0.0.1"))
        job = store.submit_job("gpt", {"model": "gpt2-xl", "steps": 100})
        store.update_job(job.id, state="placed", plan_id="p1", nodes=["n0"], estimate_s=30.0)
        store.submit_job("waiting", {"model": "gpt2-xl", "steps": 100})
        store.heartbeat("n0", launch=LaunchStatus(LaunchState.RUNNING, plan_id="p1", job="gpt",
                                                  progress=StepProgress(steps=9, iteration_s=0.36,
                                                                        samples=8)))
        state.build(state.read(store))
    jobs = {j["name"]: j for j in state.document("jobs")["jobs"]}
    assert (jobs["gpt"]["iteration_s"], jobs["gpt"]["iteration_estimate_s"]) == (0.36, 0.3)
    assert (jobs["waiting"]["iteration_s"], jobs["waiting"]["iteration_estimate_s"]) == (None, None)
