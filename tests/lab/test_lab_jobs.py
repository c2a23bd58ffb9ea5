"""In the WAN lab: jobs owned by `hulk-planner serve --mqtt` survive a lost node and a
planner outage. Real namespaces and switch, mosquitto, serve, one agent per host (8 declared
A100s, 1 s heartbeats: lab/fleet.py), torchrun training examples/train_gpt.py with its
checkpoints in one folder every namespace sees. The scenarios are lab/job_scenarios.py (the
benchmark bench/lab_jobs_bench.py times the same ones).

1. SIGKILLing the agent and the training process of a running job's node: recovery re-plans the
   job onto other nodes, the new ranks print that they resumed from a step > 0 (restart >= 1)
   and the job ends `succeeded` in `jobs list` with restarts >= 1.
2. The same for a job over two nodes: the surviving rank exits non-zero when its peer dies,
   and the job waits for recovery instead of failing.
3. SIGTERMing serve for less than the node lease (10 s at a 30 s node timeout) and starting it
   again on the same db stops no job: the training processes keep their pids, no placement
   changes, the job succeeds with no restart.
4. Serve down for four node timeouts, far past the lease: the broker retains serve's
   `offline`, every node renews its lease from it (docs/JOBS.md, "Fencing"), and again no job
   stops, restarts or changes placement.
5. Every agent of a job over two nodes SIGKILLed (trainers left running): the wrappers stop the
   old copy within the lease, before serve re-places the job on the other two nodes; sampling
   every host's trainers every 0.1 s never sees both copies; the new copy resumes as epoch 1.
"""

from __future__ import annotations

import pytest

from lab import job_scenarios
from lab import matrix as lab_matrix

pytestmark = [pytest.mark.root, pytest.mark.process]

NODE_TIMEOUT_S = 5.0
# Far-apart cities: the tiny job is cheapest on one node, so the others are free for recovery.
CITIES = ["Beijing", "Tokyo", "London"]


def test_a_job_whose_node_is_killed_resumes_from_its_checkpoint_on_other_nodes(lab_fleet, tmp_path):
    fleet = lab_fleet(lab_matrix.from_cities(CITIES).scaled(0.25))
    job_scenarios.start(fleet, NODE_TIMEOUT_S)

    got = job_scenarios.kill_node_mid_run(fleet, tmp_path, steps=300, checkpoint_every=10,
                                          kill_after_step=20)
    print(f"\nkill to re-planned {got['kill_to_replanned_s']:.1f} s, to resumed "
          f"{got['kill_to_resumed_s']:.1f} s, to finished {got['kill_to_finished_s']:.1f} s; "
          f"resumed {got['resumed']}")
    assert got["victim"] not in got["replanned_nodes"], got
    assert got["replanned_plan_id"] != got["first_plan_id"], got
    assert got["resumed"], got
    for host, (step, restart) in got["resumed"].items():
        assert host in got["replanned_nodes"], got
        # The checkpoint seen at the kill, or one the dying rank still wrote.
        assert 20 <= step <= got["checkpoint_at_kill"] + 2 * 10, got
        assert restart >= 1, got
    listed = got["listed"]
    assert listed["state"] == "succeeded", (listed, fleet.logs())
    assert listed["restarts"] >= 1, listed
    assert got["victim"] not in listed["nodes"], listed
    # The resumed ranks ran to the last step.
    for host in got["resumed"]:
        log = fleet.job_log(host, got["job"])
        assert "step 300/300 " in log, log[-2000:]


def test_serve_down_for_less_than_the_lease_stops_no_job(lab_fleet, tmp_path):
    fleet = lab_fleet(lab_matrix.from_cities(CITIES).scaled(0.25))
    job_scenarios.start(fleet, 30.0)          # lease 29 s, a job's deadline 25.1 s after a send

    got = job_scenarios.serve_outage(fleet, tmp_path, outage_s=10.0, steps=700,
                                      checkpoint_every=100)
    print(f"\nserve down {got['outage_s']:.1f} s; pids {got['pids_seen']}")
    assert got["serve_exit_code"] == 0, got
    assert got["outage_s"] >= 10.0
    # Still training when serve came back (else the outage proved nothing).
    assert got["alive_at_restart"] and all(got["alive_at_restart"].values()), (got, fleet.logs())
    assert got["pids_seen"] == got["pids_at_start"], got          # never restarted
    assert all(v == [got["plan_id"]] for v in got["placements_seen"].values()), got  # never cleared
    assert got["final_plan_id"] == got["plan_id"] and got["final_nodes"] == got["nodes"], got
    assert not got["resumed"], got
    listed = got["listed"]
    assert listed["state"] == "succeeded" and listed["restarts"] == 0, (listed, fleet.logs())


def test_serve_down_far_past_the_lease_stops_no_job_whose_nodes_reach_the_broker(lab_fleet,
                                                                                 tmp_path):
    fleet = lab_fleet(lab_matrix.from_cities(CITIES).scaled(0.25))
    job_scenarios.start(fleet, NODE_TIMEOUT_S)   # lease 4.5 s, a job's deadline 3.6 s after a send

    got = job_scenarios.serve_outage(fleet, tmp_path, outage_s=4 * NODE_TIMEOUT_S, steps=1400,
                                      checkpoint_every=100)
    print(f"\nserve down {got['outage_s']:.1f} s; pids {got['pids_seen']}")
    assert got["outage_s"] >= 4 * NODE_TIMEOUT_S
    assert got["alive_at_restart"] and all(got["alive_at_restart"].values()), (got, fleet.logs())
    assert got["pids_seen"] == got["pids_at_start"], got          # never fenced nor restarted
    assert all(v == [got["plan_id"]] for v in got["placements_seen"].values()), got
    for host in got["nodes"]:
        agent_log = fleet.services.log(f"agent-{host}").read_text(errors="replace")
        assert "serve is offline" in agent_log, agent_log[-3000:]
        assert "was fenced" not in agent_log, agent_log[-3000:]
    listed = got["listed"]
    assert listed["state"] == "succeeded" and listed["restarts"] == 0, (listed, fleet.logs())


def test_a_job_over_two_nodes_whose_node_is_killed_resumes_instead_of_failing(lab_fleet, tmp_path):
    # A 20e9-parameter model in the cost model's eyes: two of the 8 x A100-40GB nodes (the
    # example still trains its small blocks). The survivor's rank exits non-zero when its peer
    # dies; the job must wait for recovery instead of failing (planner/core/lifecycle.py).
    fleet = lab_fleet(lab_matrix.from_cities(CITIES).scaled(0.25))
    job_scenarios.start(fleet, NODE_TIMEOUT_S)

    got = job_scenarios.kill_node_mid_run(fleet, tmp_path, steps=80, checkpoint_every=10,
                                          kill_after_step=20, spec={"params": "20e9", "layers": 8})
    print(f"\n{got['first_nodes']} -> {got['replanned_nodes']}: kill to resumed "
          f"{got['kill_to_resumed_s']:.1f} s, to finished {got['kill_to_finished_s']:.1f} s; "
          f"resumed {got['resumed']}")
    assert len(got["first_nodes"]) == 2, got
    assert got["victim"] not in got["replanned_nodes"] and len(got["replanned_nodes"]) == 2, got
    listed = got["listed"]
    assert listed["state"] == "succeeded" and listed["restarts"] >= 1, (listed, fleet.logs())
    assert set(got["resumed"]) == set(got["replanned_nodes"]), got
    assert all(step >= 20 and restart >= 1 for step, restart in got["resumed"].values()), got


def test_a_job_over_two_nodes_whose_agents_all_die_never_trains_twice(lab_fleet, tmp_path):
    # Two pairs of nearby cities: the 20e9-parameter job takes one pair, recovery the other.
    fleet = lab_fleet(lab_matrix.from_cities(["Beijing", "Tokyo", "London", "Paris"]).scaled(0.25))
    job_scenarios.start(fleet, NODE_TIMEOUT_S)

    got = job_scenarios.kill_every_agent(fleet, tmp_path, steps=300,
                                         spec={"params": "20e9", "layers": 8})
    print(f"\n{got['nodes']} -> {got['final_nodes']}: old copy gone {got['old_gone_s']:.1f} s, "
          f"new copy up {got['new_up_s']:.1f} s after the kill ({got['samples']} samples)")
    assert len(got["nodes"]) == 2, got
    assert not got["both"], got                       # never two copies at once
    assert got["new_up_s"] is not None and got["old_gone_s"] < got["new_up_s"], got
    assert got["old_gone_s"] < NODE_TIMEOUT_S, got    # the lease, not the node timeout, ended it
    listed = got["listed"]
    assert listed["state"] == "succeeded" and listed["restarts"] == 1, (listed, fleet.logs())
    assert set(got["final_nodes"]) == set(got["others"]), got
    assert got["resumed"] and all(r == 1 for _, r in got["resumed"].values()), got
    assert got["epoch"] == "1", got

