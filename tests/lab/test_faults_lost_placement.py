"""In the WAN lab: a node whose retained placement is deleted is sent it again by serve in the
round that sees it gone, and its job still succeeds.

A one-node job runs (examples/train_gpt.py under torchrun, checkpoints in one folder every
namespace sees). Its node's retained placement is deleted (an empty retained message on the
node's topic) while the node runs its job and reports nothing wrong. Serve's reconciliation reads
the plan nodes' retained placements every round, finds this one gone and re-sends it at once,
signed with a newer sequence number (reason lost; no grace). The agent is then stopped, loses its
placement file (its accepted mark stays) and is started again: it accepts the re-sent placement,
takes its rank over (adopted, or resumed from the newest checkpoint) and the job ends
`succeeded`, never re-planned (restarts 0). Without the re-send the restarted agent finds nothing
retained and the job stays `running` on an idle node for good.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from hulk.wire.broker import placement_topic
from lab import job_scenarios
from lab import matrix as lab_matrix
from lab.fleet import FLEET, LabFleet
from lab.netns import HUB_ADDRESS
from lab.run import MQTT_PORT
from lab.wan import HUB

pytestmark = [pytest.mark.root, pytest.mark.process]

# Longer than an agent restart takes, so recovery never calls the node silent meanwhile: the
# re-send can only come from reconciliation.
NODE_TIMEOUT_S = 15.0
CITIES = ["Beijing", "Tokyo"]
STEPS = 300      # long enough to be running through the delete and the restart


def mqtt(fleet: LabFleet, tool: str, *args: str) -> str:
    """``mosquitto_pub``/``mosquitto_sub`` in the hub's namespace (the broker listens there)."""
    proc = fleet.lab.run(HUB, [tool, "-h", HUB_ADDRESS, "-p", str(MQTT_PORT), *args], timeout=20)
    assert proc.returncode in (0, 27), (tool, args, proc.returncode, proc.stderr)  # 27: -W timeout
    return proc.stdout


def retained(fleet: LabFleet, topic: str) -> dict | None:
    out = mqtt(fleet, "mosquitto_sub", "-t", topic, "-C", "1", "-W", "2", "--retained-only")
    return json.loads(out) if out.strip() else None


def restart_agent_without_state(fleet: LabFleet, host: str) -> None:
    """Stop ``host``'s agent (SIGTERM), delete its placement file, start it again."""
    proc = fleet.agents[host]
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    (fleet.state_root / host / "placement.json").unlink(missing_ok=True)
    fleet.agents[host] = fleet.services.restart(f"agent-{host}")


def test_a_lost_placement_is_sent_again_and_the_job_succeeds(lab_fleet, tmp_path):
    fleet = lab_fleet(lab_matrix.from_cities(CITIES).scaled(0.25))
    job_scenarios.start(fleet, NODE_TIMEOUT_S)
    name, ckpt = "lost", tmp_path / "checkpoints" / "lost"
    ckpt.mkdir(parents=True)
    fleet.submit(job_scenarios.write_jobs(tmp_path / "jobs-lost.yaml", [
        {"name": name, "steps": STEPS, "checkpoint_dir": ckpt, "checkpoint_every": 10}]))
    running = job_scenarios.wait_state(fleet, name, ("running",), 90)
    (victim,) = running.nodes
    fleet.wait(lambda: any(s >= 10 for s in job_scenarios.checkpoint_steps(ckpt)), 60,
               "a checkpoint at step 10 or later")
    topic = placement_topic(FLEET, victim)
    first = retained(fleet, topic)
    assert first is not None and [r["job"] for r in first["roles"]] == [name], first

    mqtt(fleet, "mosquitto_pub", "-t", topic, "-r", "-n")           # the retained one is gone
    planner_log = fleet.services.log("planner")
    fleet.wait(lambda: f"reconcile: re-sent {victim}'s placement (lost" in
               planner_log.read_text(errors="replace"), 10, "serve to re-send the placement")
    again = retained(fleet, topic)
    assert again is not None and [r["job"] for r in again["roles"]] == [name], again
    assert [r["plan_id"] for r in again["roles"]] == [running.plan_id], again
    assert again.get("seq", 0) > first.get("seq", 0), (first.get("seq"), again.get("seq"))

    restart_agent_without_state(fleet, victim)
    changed = fleet.store_nodes()[victim].get("launch_changed_ms") or 0

    def taken_over() -> bool:
        node = fleet.store_nodes()[victim]
        return (node.get("launch_changed_ms") or 0) > changed and \
            node.get("launch_job") == name and node.get("launch_state") in ("running", "exited")
    fleet.wait(taken_over, 30, f"{victim}'s new agent to report {name} taken over")

    final = job_scenarios.wait_state(fleet, name, job_scenarios.FINAL, 120)
    listed = fleet.jobs()[name]
    assert final.state == "succeeded", (listed, fleet.logs())
    assert listed["restarts"] == 0 and list(final.nodes) == [victim], listed   # never re-planned
    log = fleet.job_log(victim, name)
    resumed = job_scenarios.resumed(fleet, [victim], name)       # a restarted rank resumes
    assert victim not in resumed or resumed[victim][0] >= 10, (resumed, log)
    assert f"step {STEPS}/{STEPS} " in log
