"""In the WAN lab (mosquitto, `hulk-planner serve --mqtt`, one agent per host with declared GPUs,
examples/train_gpt.py under torchrun): an agent crash neither stops its training nor leaves a
second copy of it.

1. SIGKILL of a running one-node job's agent only (its training stays), the agent started again
   within the node timeout: the same torchrun pid goes on training, the node reports the job
   running again ("adopted pid N"), and the job succeeds with no restart.
2. The agent down past the node timeout: the job is re-placed on the other host while the old
   copy trains on as an orphan; the old agent, started again, stops that orphan (its pid is
   gone, its log stops growing) and the job succeeds from the re-placed copy alone.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lab import job_scenarios
from lab.fleet import EXAMPLE, LabFleet, torchrun_pids

pytestmark = [pytest.mark.root, pytest.mark.process]


@pytest.fixture
def fleet(job_fleet) -> LabFleet:
    return job_fleet


def restart_agent(fleet: LabFleet, host: str) -> None:
    """Start ``host``'s agent again as the lab first started it (same flags, same state dir)."""
    fleet.agents[host] = fleet.services.restart(host)


def torchruns(fleet: LabFleet, host: str) -> set[int]:
    return set(torchrun_pids(fleet.lab, str(EXAMPLE)).get(host, {}))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def launch(fleet: LabFleet, host: str) -> dict:
    return fleet.store_nodes().get(host) or {}


def submit_and_wait(fleet: LabFleet, work: Path, name: str, steps: int) -> tuple[object, Path]:
    ckpt = work / "checkpoints" / name
    ckpt.mkdir(parents=True)
    fleet.submit(job_scenarios.write_jobs(work / f"jobs-{name}.yaml", [
        {"name": name, "steps": steps, "checkpoint_dir": ckpt, "checkpoint_every": 20}]))
    running = job_scenarios.wait_state(fleet, name, ("running",), 90)
    fleet.wait(lambda: job_scenarios.checkpoint_steps(ckpt), 60, "a first checkpoint")
    return running, ckpt


def test_an_agent_restarted_within_the_node_timeout_adopts_its_training(fleet, tmp_path):
    name = "survivor"
    running, _ = submit_and_wait(fleet, tmp_path, name, steps=400)
    (host,) = running.nodes
    before = fleet.wait(lambda: torchruns(fleet, host), 10, f"{host}'s torchrun")
    fleet.kill_agent(host)                                      # the agent only
    assert all(alive(pid) for pid in before)                    # training outlives its agent
    restart_agent(fleet, host)
    t_restart_ms = int(time.time() * 1000)
    reported = fleet.wait(lambda: (row := launch(fleet, host)).get("launch_state") == "running"
                          and (row.get("launch_detail") or "").startswith("adopted pid")
                          and row.get("last_seen_ms", 0) >= t_restart_ms and row, 30,
                          f"{host} to report the adopted job", poll_s=0.2)
    assert reported["launch_job"] == name, reported
    assert torchruns(fleet, host) == before                     # the same process, never restarted
    final = job_scenarios.wait_state(fleet, name, job_scenarios.FINAL, 150)
    assert final.state == "succeeded", (final, fleet.logs())
    assert final.restarts == 0 and list(final.nodes) == [host], final
    assert "step 400/400 " in fleet.job_log(host, name)
    assert "adopted job survivor" in fleet.services.log(f"agent-{host}").read_text()


def test_an_agent_back_after_its_job_was_re_placed_stops_the_orphan(fleet, tmp_path):
    name = "moved"
    running, _ = submit_and_wait(fleet, tmp_path, name, steps=400)
    (victim,) = running.nodes
    (other,) = [h for h in fleet.lab.hosts if h != victim]
    orphans = fleet.wait(lambda: torchruns(fleet, victim), 10, f"{victim}'s torchrun")
    fleet.kill_agent(victim)
    fleet.wait(lambda: (r := job_scenarios.record(fleet, name)) and other in r.nodes and r, 60,
               f"job {name} re-placed on {other}", poll_s=0.2)
    fleet.wait(lambda: torchruns(fleet, other), 30, f"{other}'s torchrun")
    assert all(alive(pid) for pid in orphans)    # the old copy still trains, for now
    restart_agent(fleet, victim)
    fleet.wait(lambda: not any(alive(pid) for pid in orphans), 30,
               f"the orphan on {victim} to be stopped", poll_s=0.2)
    log = fleet.state_root / victim / "jobs" / name / "job.log"
    size = log.stat().st_size
    final = job_scenarios.wait_state(fleet, name, job_scenarios.FINAL, 200)
    assert final.state == "succeeded", (final, fleet.logs())
    assert list(final.nodes) == [other], final
    assert log.stat().st_size == size            # one copy only wrote steps after the stop
    assert not torchruns(fleet, victim)
    assert "step 400/400 " in fleet.job_log(other, name)
