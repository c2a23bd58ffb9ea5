"""In the WAN lab (mosquitto, `hulk-planner serve --mqtt`, one agent per host with declared GPUs,
examples/train_gpt.py under torchrun): an agent crash neither stops its training nor leaves a
second copy of it.

1. SIGKILL of a running one-node job's agent only (its training stays), the agent started again
   within the node lease (here a 20 s node timeout): the same torchrun pid goes on training, the
   node reports the job running again ("adopted pid N"), and the job succeeds with no restart.
2. Fencing: the agent stays dead. Its job's wrapper stops the old copy once the node lease
   lapses (docs/JOBS.md, "Fencing"), before serve re-places the job on the other host: sampling
   both hosts' trainers every 0.1 s never sees two copies, the old one is gone within the node
   timeout of the kill, its exit.json says it was fenced, and the new copy resumes from the old
   copy's checkpoint (epoch 0) as epoch 1, writes epoch-1 shards and succeeds.
3. The same with the agent alive but its host cut off from the hub (nft drops every packet to and
   from it): the old copy stops before the new one starts, and once the cut heals the node,
   heard from again, starts nothing.
4. The same with only serve's port cut: the agent still reads the broker, where serve says it is
   online, so nothing renews the lease and the old copy stops before the new one starts.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from lab import job_scenarios
from lab import matrix as lab_matrix
from lab.fleet import EXAMPLE, LabFleet, torchrun_pids
from lab.netns import HUB_ADDRESS
from lab.run import PLANNER_PORT
from tests.helpers.job_lab import JOB_LAB_CITIES, JOB_NODE_TIMEOUT_S

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


def test_an_agent_restarted_within_the_node_timeout_adopts_its_training(lab_fleet, tmp_path):
    # The lease lets an agent restart take up to about the node timeout less 15%; the default
    # fleet's 5 s would leave a loaded CI machine too little.
    fleet = lab_fleet(lab_matrix.from_cities(JOB_LAB_CITIES).scaled(0.25))
    job_scenarios.start(fleet, 20.0)
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


def watch_handover(fleet: LabFleet, victim: str, other: str, old: set[int],
                   since: float) -> tuple[float, float]:
    """Sample both hosts' trainers every 0.1 s from ``since`` until the new copy on ``other`` has
    trained 5 s; asserts two copies never ran at once and the old one (``old``: its torchrun
    pids) was gone before the new one started, within the node timeout. Returns (old gone, new
    up) in seconds after ``since``."""
    samples: list[tuple[float, set[int], set[int]]] = []     # (time, old host's, new host's)
    while time.monotonic() < since + 90:
        samples.append((time.monotonic(), torchruns(fleet, victim), torchruns(fleet, other)))
        if samples[-1][2] and samples[-1][0] - next(t for t, _, o in samples if o) > 5:
            break                                           # the new copy trained for 5 s
        time.sleep(0.1)
    both = [(t - since, v, o) for t, v, o in samples if v and o]
    assert not both, both[:3]
    started = next((t for t, _, o in samples if o), None)
    assert started is not None, "the job was never re-placed"
    stopped = max((t for t, v, _ in samples if v & old), default=since)
    print(f"fencing: old copy gone {stopped - since:.1f} s after the fault, new copy up "
          f"{started - since:.1f} s after it ({len(samples)} samples)")
    assert stopped < started and stopped - since < JOB_NODE_TIMEOUT_S, (stopped - since,
                                                                      started - since)
    return stopped - since, started - since


def assert_fenced_and_moved(fleet: LabFleet, victim: str, other: str, name: str,
                            ckpt: Path) -> None:
    exit_record = json.loads((fleet.state_root / victim / "jobs" / name / "exit.json").read_text())
    assert "lease lapsed" in exit_record.get("fenced", ""), exit_record

    final = job_scenarios.wait_state(fleet, name, job_scenarios.FINAL, 200)
    assert final.state == "succeeded", (final, fleet.logs())
    assert list(final.nodes) == [other] and final.restarts == 1, final
    log = fleet.job_log(other, name)
    assert "step 400/400 " in log
    resumed = re.search(r"^resumed from step (\d+) \(restart 1\) .* epoch (\d+)$", log, re.M)
    assert resumed and int(resumed.group(2)) == 0, log[:2000]      # the old copy's, older
    assert (ckpt / "epoch").read_text() == "1"
    assert sorted(p.name for p in (ckpt / "step-00000400").iterdir()) == [
        "shard-L0-4-of4-r0-e1.pt"], list((ckpt / "step-00000400").iterdir())


def test_a_job_whose_agent_died_stops_before_its_new_copy_starts(fleet, tmp_path):
    name = "moved"
    running, ckpt = submit_and_wait(fleet, tmp_path, name, steps=400)
    (victim,) = running.nodes
    (other,) = [h for h in fleet.lab.hosts if h != victim]
    old = fleet.wait(lambda: torchruns(fleet, victim), 10, f"{victim}'s torchrun")
    fleet.kill_agent(victim)
    killed = time.monotonic()
    stopped, started = watch_handover(fleet, victim, other, old, killed)
    assert_fenced_and_moved(fleet, victim, other, name, ckpt)


def partition(fleet: LabFleet, host: str, cut: bool, *, port: int | None = None) -> None:
    """Drop (``cut``) or pass again every packet between ``host`` and the hub (``port``: only
    those to and from that TCP port of the hub), in its namespace."""
    to = f"tcp dport {port} " if port else ""
    back = f"tcp sport {port} " if port else ""
    argv = (["nft", "-f", "-"], "table inet hulk_partition {\n chain out { type filter hook "
            f"output priority 0; ip daddr {HUB_ADDRESS} {to}drop; }}\n chain in {{ type filter "
            f"hook input priority 0; ip saddr {HUB_ADDRESS} {back}drop; }}\n}}\n") if cut else \
        (["nft", "delete", "table", "inet", "hulk_partition"], None)
    proc = fleet.lab.run(host, argv[0], input=argv[1], timeout=10)
    assert proc.returncode == 0, proc.stderr


def test_a_job_on_a_node_cut_off_from_the_hub_stops_before_its_new_copy_starts(fleet, tmp_path):
    """The agent lives on but hears nothing from serve: the lease lapses all the same, and once
    the partition heals the node trains nothing (its placement was cleared meanwhile)."""
    name = "cut"
    running, ckpt = submit_and_wait(fleet, tmp_path, name, steps=400)
    (victim,) = running.nodes
    (other,) = [h for h in fleet.lab.hosts if h != victim]
    old = fleet.wait(lambda: torchruns(fleet, victim), 10, f"{victim}'s torchrun")
    partition(fleet, victim, True)
    cut = time.monotonic()
    try:
        watch_handover(fleet, victim, other, old, cut)
    finally:
        partition(fleet, victim, False)
    healed_ms = int(time.time() * 1000)
    fleet.wait(lambda: (launch(fleet, victim).get("last_seen_ms") or 0) > healed_ms, 60,
               f"{victim} to be heard from again", poll_s=0.2)
    settled = time.monotonic()
    while time.monotonic() < settled + 5:       # back in touch: it starts nothing again
        assert not torchruns(fleet, victim)
        time.sleep(0.2)
    assert_fenced_and_moved(fleet, victim, other, name, ckpt)


def test_a_node_cut_off_from_serve_but_not_the_broker_stops_before_its_new_copy_starts(fleet,
                                                                                     tmp_path):
    """serve is up and says so on the broker: the broker renews nothing, so the node's lease
    lapses as in a full partition although its agent still reads the broker."""
    name = "half"
    running, ckpt = submit_and_wait(fleet, tmp_path, name, steps=400)
    (victim,) = running.nodes
    (other,) = [h for h in fleet.lab.hosts if h != victim]
    old = fleet.wait(lambda: torchruns(fleet, victim), 10, f"{victim}'s torchrun")
    partition(fleet, victim, True, port=PLANNER_PORT)
    cut = time.monotonic()
    try:
        watch_handover(fleet, victim, other, old, cut)
    finally:
        partition(fleet, victim, False)
    agent_log = fleet.services.log(f"agent-{victim}").read_text(errors="replace")
    assert "serve is offline" not in agent_log, agent_log[-3000:]
    assert_fenced_and_moved(fleet, victim, other, name, ckpt)
