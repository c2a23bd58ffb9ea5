"""A `sync: diloco` job end to end in the WAN lab, across two "continents" (Beijing and London at
a quarter of their modelled RTT), through the agents, with a rank killed after an outer step.

`hulk-planner jobs submit` queues the job; `serve --mqtt` plans it as two islands (one per
continent: the job's cost-model view is big enough that two islands finish sooner than one,
while the example still trains its small blocks) and pushes each node its signed placement; the
agents launch examples/train_gpt.py under torchrun with the placement's HULK_SYNC,
HULK_INNER_STEPS, HULK_ISLAND... Once a checkpoint exists (written only right after an outer
step), one rank's train_gpt.py is SIGKILLed (its agent and torchrun stay, as after an OOM kill):
serve restarts the job on its nodes, both ranks print "resumed from step N (restart 1)" with N a
multiple of H no earlier than the checkpoint seen before the kill, and the job succeeds.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from lab import job_scenarios
from lab import matrix as lab_matrix
from lab.fleet import EXAMPLE, LabFleet, roles_for, worker_pids

pytestmark = [pytest.mark.root, pytest.mark.process]

CONTINENTS = ["Beijing", "London"]
INNER_STEPS = 10
# The cost model's view of the job: long sequences make each inner step's compute outweigh an
# int8 outer all-reduce every H steps over the WAN, so the planner spreads it over both hosts.
SPEC = {"params": "1e8", "seq_len": 65536, "sync": "diloco", "inner_steps": INNER_STEPS,
        "outer_compression": "int8"}
OUTER = re.compile(r"^step (\d+)/\d+ .* outer \d+ ", re.M)


@pytest.fixture
def fleet(lab_fleet) -> LabFleet:
    fleet = lab_fleet(lab_matrix.from_cities(CONTINENTS).scaled(0.25))
    job_scenarios.start(fleet, 5.0)
    return fleet


def test_a_diloco_job_over_two_continents_resumes_from_its_last_outer_step(fleet, tmp_path):
    name, ckpt = "islands", tmp_path / "checkpoints" / "islands"
    t0 = time.monotonic()
    ckpt.mkdir(parents=True)
    fleet.submit(job_scenarios.write_jobs(tmp_path / "jobs.yaml", [
        {"name": name, "steps": 80, "checkpoint_dir": ckpt, "checkpoint_every": INNER_STEPS,
         "spec": SPEC}]))
    first = job_scenarios.wait_state(fleet, name, ("running",), 90)
    print(f"\nrunning after {time.monotonic() - t0:.1f} s")
    assert len(first.nodes) == 2, first

    # The pushed placements: one island per continent, the outer sync as jobs.yaml asked.
    placements = fleet.placements()
    roles = {host: roles_for(placements[host], name) for host in first.nodes}
    assert all(len(r) == 1 for r in roles.values()), roles
    sync = {(r[0].get("sync"), r[0].get("inner_steps"), r[0].get("outer_compression"),
             r[0].get("num_islands")) for r in roles.values()}
    assert sync == {("diloco", INNER_STEPS, "int8", 2)}, roles
    assert sorted(r[0].get("island", 0) for r in roles.values()) == [0, 1], roles

    checkpointed = fleet.wait(lambda: [s for s in job_scenarios.checkpoint_steps(ckpt) if s >= 20],
                              120, "a checkpoint at an outer step >= 20", poll_s=0.2)
    victim = first.nodes[1]
    pids = fleet.wait(lambda: worker_pids(fleet.lab, victim, str(EXAMPLE)), 10,
                      f"{victim}'s train_gpt.py")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    print(f"killed after {time.monotonic() - t0:.1f} s")

    final = job_scenarios.wait_state(fleet, name, job_scenarios.FINAL, 150)
    print(f"{final.state} after {time.monotonic() - t0:.1f} s")
    assert final.state == "succeeded", (final, fleet.logs())
    assert (final.restarts, final.failures) == (1, 1), final
    assert final.nodes == first.nodes, final
    resumed = job_scenarios.resumed(fleet, first.nodes, name)
    print(f"\ncheckpoints before the kill: {checkpointed}; resumed (step, restart): {resumed}")
    assert set(resumed) == set(first.nodes), (resumed, fleet.logs())
    steps = {step for step, _ in resumed.values()}
    assert len(steps) == 1, resumed                       # both islands from the same outer step
    (step,) = steps
    assert step % INNER_STEPS == 0 and step >= max(checkpointed), resumed
    assert {restart for _, restart in resumed.values()} == {1}, resumed
    for host in first.nodes:                              # outer steps ran after the resume too
        outers = [int(s) for s in OUTER.findall(fleet.job_log(host, name))]
        assert any(s > step for s in outers), (host, outers)
