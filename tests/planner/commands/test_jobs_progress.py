"""`hulk-planner jobs list|show`: a job's measured step time against the plan's estimate."""

from __future__ import annotations

import json

from hulk.wire.progress import StepProgress
from hulk.wire.records import LaunchState, LaunchStatus, RegisterRequest
from planner.cli import main
from planner.core.lifecycle import PLACED, RUNNING
from planner.service.store import Store


def run(capsys, *argv):
    code = main([*map(str, argv)])
    return code, capsys.readouterr().out


def beat(store: Store, node: str, iteration_s: float, samples: int = 50) -> None:
    store.heartbeat(node, launch=LaunchStatus(
        LaunchState.RUNNING, plan_id="p1", job="gpt", progress=StepProgress(
            steps=120, total_steps=1000, iteration_s=iteration_s,
            iteration_p90_s=iteration_s + 0.02, compute_s=0.2, communication_s=0.03,
            samples=samples, updated_ms=1)))


def test_list_and_show_print_measured_against_estimated(tmp_path, capsys):
    db = tmp_path / "planner.sqlite"
    with Store(db) as store:
        for node in ("n0", "n1"):
            store.register(RegisterRequest(node, address="127.0.0.1"))
        record = store.submit_job("gpt", {"model": "gpt2-xl", "steps": 1000})
        store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n0", "n1"],
                         estimate_s=200.0)
        store.update_job(record.id, state=RUNNING)
        store.submit_job("waiting", {"model": "gpt2-xl", "steps": 10})
        beat(store, "n0", 0.21)
        beat(store, "n1", 0.232, samples=40)
    code, out = run(capsys, "jobs", "show", "gpt", "--db", db)
    assert code == 0
    assert "step      232 ms / est. 200 ms (+16%)   (slowest rank's median of 40 steps)" in out
    assert "rank 0 n0: step 120/1000  median 210 ms  p90 230 ms  compute 200 ms" in out
    assert "rank 1 n1: step 120/1000  median 232 ms" in out
    code, out = run(capsys, "jobs", "show", "waiting", "--db", db)
    assert code == 0 and "step      -\n" in out and "rank " not in out
    code, out = run(capsys, "jobs", "list", "--db", db)
    assert code == 0 and "232 ms / est. 200 ms (+16%)" in out
    code, out = run(capsys, "jobs", "list", "--db", db, "--json")
    rows = {j["name"]: j for j in json.loads(out)["jobs"]}
    assert (rows["gpt"]["iteration_s"], rows["gpt"]["iteration_samples"]) == (0.232, 40)
    assert rows["gpt"]["iteration_estimate_s"] == 0.2
    assert rows["waiting"]["iteration_s"] is None
    assert rows["waiting"]["iteration_estimate_s"] is None


def test_a_microsecond_estimate_prints_in_microseconds_and_a_far_miss_as_a_ratio():
    from planner.commands.jobs import _measured_vs_estimated

    assert _measured_vs_estimated(0.5, 32e-6) == "500 ms / est. 32.0 us (15625x)"
    assert _measured_vs_estimated(0.232, 0.2) == "232 ms / est. 200 ms (+16%)"
