"""In the WAN lab: a finished job's own signed placement, published again on its node's topic
after serve cleared the node, runs nothing. Real namespaces, mosquitto, `hulk-planner serve
--mqtt`, one agent per host (lab/fleet.py), torchrun training examples/train_gpt.py.

The message is captured from the broker while the job runs (``mosquitto_sub`` in the hub) and
re-published retained afterwards (``mosquitto_pub -r``), as anyone with the planner's broker
account could: it is genuinely signed and not expired, so only its sequence number (older than the
clear's) tells the agent it is a replay (docs/PLACEMENTS.md, "The agent's checks").
"""

from __future__ import annotations

import pytest

from hulk.wire.placement import parse_placement
from lab import job_scenarios
from lab import matrix as lab_matrix
from lab.fleet import EXAMPLE, FLEET, torchrun_pids
from lab.netns import HUB_ADDRESS
from lab.run import MQTT_PORT
from lab.wan import HUB

pytestmark = [pytest.mark.root, pytest.mark.process]

NODE_TIMEOUT_S = 5.0
CITIES = ["Beijing", "Tokyo", "London"]


def topic(host: str) -> str:
    return f"hulk/v1/{FLEET}/nodes/{host}/placement"


def retained(fleet, host: str) -> bytes:
    """The broker's retained placement of ``host``, as a subscriber receives it."""
    proc = fleet.lab.run(HUB, ["mosquitto_sub", "-h", HUB_ADDRESS, "-p", str(MQTT_PORT),
                               "-t", topic(host), "-C", "1", "-W", "5", "-N", "--retained-only"],
                         text=False, timeout=30)
    assert proc.returncode == 0, proc.stderr[-1000:]
    return proc.stdout


def publish_retained(fleet, host: str, payload: bytes) -> None:
    path = fleet.work / f"replayed-{host}.json"
    path.write_bytes(payload)
    proc = fleet.lab.run(HUB, ["mosquitto_pub", "-h", HUB_ADDRESS, "-p", str(MQTT_PORT), "-q", "1",
                               "-r", "-t", topic(host), "-f", str(path)], timeout=30)
    assert proc.returncode == 0, proc.stderr[-1000:]


def test_a_finished_jobs_placement_replayed_after_its_clear_runs_nothing(lab_fleet, tmp_path):
    fleet = lab_fleet(lab_matrix.from_cities(CITIES).scaled(0.25))
    job_scenarios.start(fleet, NODE_TIMEOUT_S)
    name = "replay"
    fleet.submit(job_scenarios.write_jobs(tmp_path / "jobs-replay.yaml",
                                          [{"name": name, "steps": 40}]))
    running = job_scenarios.wait_state(fleet, name, ("running",), 90)
    (host,) = running.nodes
    captured = retained(fleet, host)                    # while it runs
    placement = parse_placement(captured)
    assert [r.job for r in placement.roles] == [name] and placement.seq > 0, placement

    done = job_scenarios.wait_state(fleet, name, job_scenarios.FINAL, 90)
    assert done.state == "succeeded", fleet.logs()
    placement_file = fleet.state_root / host / "placement.json"
    fleet.wait(lambda: not placement_file.exists() and not torchrun_pids(fleet.lab, str(EXAMPLE)),
               30, f"{host} cleared and idle")
    clear = parse_placement(retained(fleet, host))
    assert clear.roles == () and clear.seq > placement.seq, clear
    idle = fleet.wait(lambda: (n := fleet.store_nodes()[host])["launch_state"] == "idle" and n,
                      20, f"{host} to report idle")
    agent_log = fleet.services.log(f"agent-{host}")
    log_at_replay = len(agent_log.read_text(errors="replace"))
    job_log = fleet.job_log(host, name)

    publish_retained(fleet, host, captured)
    assert retained(fleet, host) == captured            # the broker retains the replay
    refusal = fleet.wait(lambda: [line for line in agent_log.read_text(errors="replace")
                                  [log_at_replay:].splitlines() if "replayed" in line],
                         30, f"{host}'s agent to refuse the replay")
    assert "refused placement" in refusal[0] and f"seq {placement.seq}" in refusal[0], refusal
    # A heartbeat after the refusal still reports the node as it was: nothing started.
    seen = fleet.store_nodes()[host]["last_seen_ms"]
    after = fleet.wait(lambda: (n := fleet.store_nodes()[host])["last_seen_ms"] > seen and n, 20,
                       f"a heartbeat from {host} after the refusal")
    assert (after["launch_state"], after["launch_changed_ms"]) == \
        (idle["launch_state"], idle["launch_changed_ms"]), after
    assert not torchrun_pids(fleet.lab, str(EXAMPLE)), "a torchrun started"
    assert not placement_file.exists()
    assert fleet.job_log(host, name) == job_log
    assert job_scenarios.record(fleet, name).state == "succeeded"
