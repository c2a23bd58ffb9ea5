"""Job scenarios in the lab, shared by tests/lab/test_lab_jobs.py (which asserts on what they
return) and bench/lab_jobs_bench.py (which reports their timings).

Every scenario runs real processes in a :class:`lab.fleet.LabFleet`: `hulk-planner serve --mqtt`
owns the jobs (`hulk-planner jobs submit`), the agents (8 declared A100s each, 1 s heartbeats)
launch examples/train_gpt.py under torchrun, and the jobs' ``checkpoint_dir`` is one absolute
folder that every namespace sees (the namespaces share the filesystem).

- :func:`kill_node_mid_run`: SIGKILL the agent and the training process of a node of a running
  job; recovery re-plans it onto other nodes and the new ranks resume from the last checkpoint.
- :func:`serve_outage`: SIGTERM serve for ``outage_s``, start it again on the same db; the job's
  processes and placements must not change.
- :func:`kill_every_agent`: SIGKILL every agent of a running job over several nodes, trainers
  left alone; their wrappers must stop them before serve re-places the job elsewhere.
- :func:`queue_handoff`: on one host, a second job waits for the first; the time from the
  first's last rank exiting to the second's torchrun starting.
"""

from __future__ import annotations

import glob
import re
import time
from pathlib import Path

from lab.fleet import (AGENT_WITH_DECLARED_GPUS, EXAMPLE, PYTHON, LabFleet, kill_tree,
                       torchrun_pids)

RESUMED = re.compile(r"^resumed from step (\d+) \(restart (\d+)\)", re.M)
STEP = re.compile(r"^step (\d+)/(\d+) ", re.M)
FINAL = ("succeeded", "failed", "cancelled")


def write_jobs(path: Path, jobs: list[dict]) -> Path:
    """A jobs.yaml of examples/train_gpt.py jobs, each ``{name, steps, checkpoint_dir?,
    checkpoint_every?, spec?}``; by default the cost model's view of the example at its defaults
    (as lab/jobs.yaml); ``spec`` replaces fields of that view (a bigger model makes the planner
    spread the job over nodes; the example still trains its small blocks)."""
    lines = ["jobs:"]
    for job in jobs:
        command = f"python {EXAMPLE} --steps {job['steps']} --timeout 60"
        spec = {"params": "0.25e6", "layers": 4, "hidden": 64, "seq_len": 32, "global_batch": 16,
                "micro_batch": 2, **job.get("spec", {})}
        lines += [f"  - name: {job['name']}", *(f"    {k}: {v}" for k, v in spec.items()),
                  f"    steps: {job['steps']}"]
        if job.get("checkpoint_dir"):
            lines.append(f"    checkpoint_dir: {job['checkpoint_dir']}")
            command += f" --checkpoint-every {job.get('checkpoint_every', 10)}"
        lines.append(f'    command: "{command}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def start(fleet: LabFleet, node_timeout_s: float) -> None:
    """Broker, serve (fast recovery and job rounds) and declared-GPU agents; the store knows every
    pair's RTT and every node's GPUs when this returns."""
    fleet.start_hub("--node-timeout", f"{node_timeout_s:g}", "--recovery-interval", "0.5",
                    "--jobs-interval", "0.5")
    fleet.start_agents([PYTHON, "-c", AGENT_WITH_DECLARED_GPUS, "1"])
    fleet.wait_for_rtts(min_samples=1)
    fleet.wait_for_gpus()


def record(fleet: LabFleet, name: str):
    """The newest job record named ``name`` in the store (None before it is submitted)."""
    from planner.service.store import Store

    with Store(fleet.db) as store:
        mine = [r for r in store.job_records() if r.name == name]
    return mine[-1] if mine else None


def checkpoint_steps(directory: Path) -> list[int]:
    """Steps with at least one complete shard in ``directory``."""
    return sorted({int(Path(p).parent.name[len("step-"):])
                   for p in glob.glob(str(directory / "step-*" / "shard-L*.pt"))})


def resumed(fleet: LabFleet, hosts, job: str) -> dict[str, tuple[int, int]]:
    """Host -> (step, restart) its rank printed on resuming, for the hosts whose log has one."""
    out = {}
    for host in hosts:
        m = RESUMED.search(fleet.job_log(host, job))
        if m:
            out[host] = (int(m.group(1)), int(m.group(2)))
    return out


def wait_state(fleet: LabFleet, name: str, states: tuple[str, ...], timeout_s: float):
    return fleet.wait(lambda: (r := record(fleet, name)) is not None and r.state in states and r,
                      timeout_s, f"job {name} to be {' or '.join(states)}", poll_s=0.2)


def kill_node_mid_run(fleet: LabFleet, work: Path, *, steps: int = 300, checkpoint_every: int = 10,
                      kill_after_step: int = 20, timeout_s: float = 150,
                      spec: dict | None = None) -> dict:
    """Submit one job, wait until it is running and has a checkpoint at ``kill_after_step`` or
    later, SIGKILL the agent and then the torchrun of one of its nodes, and follow it to the end.
    Returns what happened and when (seconds from the kill)."""
    name, ckpt = "resume", work / "checkpoints" / "resume"
    ckpt.mkdir(parents=True)
    fleet.submit(write_jobs(work / "jobs-resume.yaml", [
        {"name": name, "steps": steps, "checkpoint_dir": ckpt, "checkpoint_every": checkpoint_every,
         "spec": spec or {}}]))
    first = wait_state(fleet, name, ("running",), 90)
    fleet.wait(lambda: any(s >= kill_after_step for s in checkpoint_steps(ckpt)), 90,
               f"a checkpoint at step {kill_after_step} or later")
    victim = first.nodes[0]
    pids = torchrun_pids(fleet.lab, str(EXAMPLE)).get(victim, {})
    assert pids, f"no torchrun in {victim}'s namespace"
    checkpoint_at_kill = max(checkpoint_steps(ckpt))
    t_kill = time.monotonic()
    fleet.kill_agent(victim)          # first: a live agent would report its rank's death
    for pid in pids:
        kill_tree(pid)
    others = [h for h in fleet.lab.hosts if h != victim]

    replanned = fleet.wait(lambda: (r := record(fleet, name)) and r.restarts >= 1 and r, timeout_s,
                           "the job to be re-planned", poll_s=0.2)
    t_replanned = time.monotonic() - t_kill
    fleet.wait(lambda: resumed(fleet, others, name), timeout_s, "a rank to resume", poll_s=0.2)
    t_resumed = time.monotonic() - t_kill
    final = wait_state(fleet, name, FINAL, timeout_s)
    t_final = time.monotonic() - t_kill
    listed = fleet.jobs()[name]
    return {"job": name, "first_nodes": list(first.nodes), "first_plan_id": first.plan_id,
            "victim": victim, "checkpoint_at_kill": checkpoint_at_kill,
            "replanned_nodes": list(replanned.nodes), "replanned_plan_id": replanned.plan_id,
            "final_nodes": list(final.nodes), "resumed": resumed(fleet, others, name),
            "listed": listed, "kill_to_replanned_s": t_replanned,
            "kill_to_resumed_s": t_resumed, "kill_to_finished_s": t_final}


def kill_every_agent(fleet: LabFleet, work: Path, *, steps: int = 300, checkpoint_every: int = 10,
                     spec: dict | None = None, timeout_s: float = 150) -> dict:
    """Submit one job; once it runs on every node and has a checkpoint, SIGKILL all its nodes'
    agents (not their trainers). Samples every host's torchruns every 0.1 s until the new copy
    has trained for 5 s; returns the samples' verdicts (seconds from the kill) and the end."""
    name, ckpt = "orphaned", work / "checkpoints" / "orphaned"
    ckpt.mkdir(parents=True)
    fleet.submit(write_jobs(work / "jobs-orphaned.yaml", [
        {"name": name, "steps": steps, "checkpoint_dir": ckpt, "checkpoint_every": checkpoint_every,
         "spec": spec or {}}]))
    first = wait_state(fleet, name, ("running",), 90)
    nodes = list(first.nodes)
    old = fleet.wait(lambda: (p := torchrun_pids(fleet.lab, str(EXAMPLE))) and all(
        p.get(h) for h in nodes) and {h: set(p[h]) for h in nodes}, 60, "a torchrun on every node")
    fleet.wait(lambda: checkpoint_steps(ckpt), 90, f"job {name}'s first checkpoint")
    t_kill = time.monotonic()
    for host in nodes:
        fleet.kill_agent(host)
    others = [h for h in fleet.lab.hosts if h not in nodes]
    samples: list[tuple[float, bool, bool]] = []   # (s after the kill, old runs, new runs)
    new_since = None
    while time.monotonic() < t_kill + timeout_s:
        now = torchrun_pids(fleet.lab, str(EXAMPLE))
        t = time.monotonic() - t_kill
        old_runs = any(set(now.get(h, {})) & old[h] for h in nodes)
        new_runs = any(now.get(h) for h in others)
        samples.append((t, old_runs, new_runs))
        if new_runs and new_since is None:
            new_since = t
        if new_since is not None and t - new_since > 5:
            break
        time.sleep(0.1)
    final = wait_state(fleet, name, FINAL, timeout_s)
    return {"job": name, "nodes": nodes, "others": others,
            "both": [t for t, o, n in samples if o and n],
            "old_gone_s": max((t for t, o, _ in samples if o), default=0.0),
            "new_up_s": new_since, "samples": len(samples), "final": final,
            "final_nodes": list(final.nodes), "listed": fleet.jobs()[name],
            "resumed": resumed(fleet, others, name),
            "epoch": (ckpt / "epoch").read_text() if (ckpt / "epoch").exists() else None}


def serve_outage(fleet: LabFleet, work: Path, *, outage_s: float, steps: int = 600,
                 checkpoint_every: int = 50, timeout_s: float = 150,
                 after_checkpoint: bool = False) -> dict:
    """Submit one job; once it runs (``after_checkpoint``: and has written a checkpoint),
    SIGTERM serve, wait ``outage_s``, start serve again on the same db and follow the job to the
    end, watching its torchrun pids and its nodes' placements all along."""
    name, ckpt = "steady", work / "checkpoints" / "steady"
    ckpt.mkdir(parents=True)
    fleet.submit(write_jobs(work / "jobs-steady.yaml", [
        {"name": name, "steps": steps, "checkpoint_dir": ckpt, "checkpoint_every": checkpoint_every}]))
    running = wait_state(fleet, name, ("running",), 90)
    if after_checkpoint:
        fleet.wait(lambda: checkpoint_steps(ckpt), 90, f"job {name}'s first checkpoint")
    nodes = list(running.nodes)
    pids = {h: set(p) for h, p in torchrun_pids(fleet.lab, str(EXAMPLE)).items() if h in nodes}
    placed = {h: (p or {}).get("plan_id") for h, p in fleet.placements().items() if h in nodes}
    seen_pids: dict[str, set[int]] = {h: set(p) for h, p in pids.items()}
    placements_seen: dict[str, set] = {h: {v} for h, v in placed.items()}

    def watch() -> bool:
        """Adds what runs and what is placed now; True once the job is finished."""
        for h, p in torchrun_pids(fleet.lab, str(EXAMPLE)).items():
            if h in seen_pids:
                seen_pids[h] |= set(p)
        now = {h: (p or {}).get("plan_id") for h, p in fleet.placements().items() if h in nodes}
        done = (r := record(fleet, name)) is not None and r.state in FINAL
        for h, plan_id in now.items():
            # A finished job's placements are cleared in the round that finishes it: only a
            # clearing seen while it still ran counts.
            if plan_id is not None or not done:
                placements_seen[h].add(plan_id)
        return done

    t0 = time.monotonic()
    exit_code = fleet.stop_planner()
    while time.monotonic() - t0 < outage_s:
        if watch():
            break               # finished while serve was down: the caller sees it
        time.sleep(0.5)
    alive_at_restart = {h: any(Path(f"/proc/{pid}").exists() for pid in p) for h, p in pids.items()}
    fleet.start_planner()
    t_back = time.monotonic() - t0

    fleet.wait(watch, timeout_s, f"job {name} to finish", poll_s=0.5)
    final = record(fleet, name)
    return {"job": name, "nodes": nodes, "plan_id": running.plan_id, "serve_exit_code": exit_code,
            "outage_s": t_back, "pids_at_start": {h: sorted(p) for h, p in pids.items()},
            "pids_seen": {h: sorted(p) for h, p in seen_pids.items()},
            "placements_seen": {h: sorted(map(str, v)) for h, v in placements_seen.items()},
            "alive_at_restart": alive_at_restart, "final_plan_id": final.plan_id,
            "final_nodes": list(final.nodes), "listed": fleet.jobs()[name],
            "resumed": resumed(fleet, nodes, name)}


def queue_handoff(fleet: LabFleet, work: Path, *, steps: int = 60, timeout_s: float = 150) -> dict:
    """Two jobs submitted together on a one-host fleet: the second waits. Seconds from the first
    job's last torchrun exiting to the second's torchrun starting (both seen in /proc)."""
    (host,) = fleet.lab.hosts
    fleet.submit(write_jobs(work / "jobs-queue.yaml", [{"name": "first", "steps": steps},
                                                       {"name": "second", "steps": steps}]))
    placed = fleet.wait(lambda: ((a := record(fleet, "first")) and (b := record(fleet, "second"))
                                 and {a.state, b.state} & {"placed", "running"} and (a, b)),
                        90, "one of the two jobs placed", poll_s=0.2)
    waiting = [r.name for r in placed if r.state == "queued"]
    order = [r.name for r in placed if r.state != "queued"] + waiting
    first_job, second_job = order
    first_pids: set[int] = set()

    def runs(job: str) -> set[int]:
        # Which job a torchrun runs: its cwd is the job's folder under the agent's state dir.
        out = set()
        for pid in torchrun_pids(fleet.lab, str(EXAMPLE)).get(host, {}):
            try:
                if Path(f"/proc/{pid}/cwd").resolve().name == job:
                    out.add(pid)
            except OSError:
                continue
        return out

    first_pids |= fleet.wait(lambda: runs(first_job), 90, f"{first_job}'s torchrun", poll_s=0.1)
    fleet.wait(lambda: not any(Path(f"/proc/{p}").exists() for p in first_pids), timeout_s,
               f"{first_job}'s torchrun to exit", poll_s=0.05)
    t_exit = time.monotonic()
    fleet.wait(lambda: runs(second_job), timeout_s, f"{second_job}'s torchrun", poll_s=0.05)
    t_start = time.monotonic()
    final = {n: wait_state(fleet, n, FINAL, timeout_s).state for n in order}
    return {"order": order, "waiting_at_first_round": waiting, "final": final,
            "exit_to_next_start_s": t_start - t_exit}
