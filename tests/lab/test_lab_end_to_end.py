"""End to end in the WAN lab: real namespaces and switch, mosquitto and `hulk-planner serve
--mqtt` in the hub, one agent per host namespace, `hulk-planner plan --push` from the hub.

1. The example program (examples/train_gpt.py) runs as two pipeline stages over two namespaces
   from a pushed placement: the real `hulk-agent` CLI launches it under torchrun, both ranks
   complete, and the launch state (exited, code 0) reaches the planner's store over gRPC.
2. SIGKILLing the agent of the rank-0 node of a pushed job gets the surviving agents a new
   placement without the dead node; the time from the kill to the last new placement.json is
   measured and must stay under 30 s.

The RTTs the planner learns are compared with the matrix (max(1 ms, 5%)) by
tests/lab/test_run.py, from the store's `fleet export`; not repeated here.

Lab hosts have no GPUs. Test 1 plans on the learned fleet declared with GPUs, as `lab.run` does.
Test 2 needs the *store* to know GPUs (the planner re-plans from the store) and heartbeats faster
than the CLI's fixed 10 s (so a 5 s node timeout has no false alarms); its agents are the real
AgentRuntime started from the real CLI arguments, with two constructor arguments set: the GPU
inventory (8 x A100, like tests/placements/test_recovery_e2e.py) and the heartbeat interval
(lab/fleet.py's AGENT_WITH_DECLARED_GPUS). The fleet (LabFleet) and its fixture (``lab_fleet``,
tests/lab/conftest.py) are shared with tests/lab/test_lab_jobs.py.
"""

from __future__ import annotations

import json
import math
import textwrap
import time
from pathlib import Path

import pytest

from lab import matrix as lab_matrix
from lab.fleet import (AGENT_WITH_DECLARED_GPUS, EXAMPLE, PYTHON, roles_for, stages_of,
                       torchrun_processes)
from lab.run import lab_fleet_with_gpus
from lab.wan import HUB, REPO
from planner.core.costmodel import stage_memory_bytes
from planner.files.jobs import parse_jobs

pytestmark = [pytest.mark.root, pytest.mark.process]

A100 = "NVIDIA A100-SXM4-40GB"
STEPS = 3
NODE_TIMEOUT_S = 5.0
RECOVERY_BOUND_S = 30.0


# ------------------------------------------------------------------ 1. two stages, two namespaces

TRAIN_JOB = "train-gpt"


def train_jobs_file(path: Path) -> Path:
    # The cost model's view of examples/train_gpt.py at its defaults (4 blocks of width 64,
    # 32-token sequences), as in lab/jobs.yaml.
    path.write_text(textwrap.dedent(f"""\
        jobs:
          - name: {TRAIN_JOB}
            params: 0.25e6
            layers: 4
            hidden: 64
            seq_len: 32
            global_batch: 16
            micro_batch: 2
            steps: {STEPS}
            command: "python {EXAMPLE} --steps {STEPS} --timeout 90"
        """))
    return path


def memory_forcing_two_stages(jobs: Path) -> float:
    """Declared GPU memory (GB) per host: below the whole model's state, so one node cannot hold
    the job, and above the most a half can need (any micro-batch), so two stages fit."""
    (job,) = parse_jobs(jobs.read_text(), str(jobs))
    whole = stage_memory_bytes(job, job.layers, 1, 1, 1)
    half = stage_memory_bytes(job, job.layers // 2, job.global_batch, job.global_batch, 2)
    assert half < whole
    return (half + whole) / 2 / 1e9


def test_the_example_trains_as_two_pipeline_stages_over_two_namespaces_from_a_pushed_plan(lab_fleet):
    fleet = lab_fleet(lab_matrix.from_cities(["Beijing", "Neimeng"]).scaled(0.5))
    first, second = fleet.lab.hosts
    fleet.start_hub()
    fleet.start_agents([PYTHON, "-m", "agent"])  # the real `hulk-agent` CLI

    # The agents register and measure; the store's fleet, declared with GPUs, is what we plan on.
    learned = fleet.wait_for_rtts()
    jobs = train_jobs_file(fleet.work / "jobs.yaml")
    declared = lab_fleet_with_gpus(learned, fleet.lab.matrix, 1, A100,
                                   memory_gb=memory_forcing_two_stages(jobs))
    assert {n["id"] for n in declared["nodes"]} == {first, second}
    fleet_file = fleet.work / "fleet-declared.json"
    fleet_file.write_text(json.dumps(declared))

    plan, _ = fleet.plan_push(jobs, "--fleet", str(fleet_file))
    stages = stages_of(plan, TRAIN_JOB)
    assert [len(st["nodes"]) for st in stages] == [1, 1], plan
    assert {st["nodes"][0] for st in stages} == {first, second}

    # Each agent holds exactly its own role of the same plan.
    def both_placed() -> dict | None:
        p = fleet.placements()
        return p if all(p.values()) else None

    placements = fleet.wait(both_placed, 30, "both placements")
    plan_ids = {p["plan_id"] for p in placements.values()}
    assert len(plan_ids) == 1, placements
    plan_id = plan_ids.pop()
    for k, st in enumerate(stages):
        node = st["nodes"][0]
        assert placements[node]["node"] == node
        (role,) = roles_for(placements[node], TRAIN_JOB)
        assert (role["stage"], role["num_stages"], role["replica"], role["num_replicas"]) == (k, 2, 0, 1)
        assert (role["rank"], role["world_size"], role["layers"]) == (k, 2, st["layers"])
        assert role["command"][:2] == ["python", str(EXAMPLE)]          # an argv, allow-listed

    # torchrun runs both ranks to the end; the exit reaches the planner with the next heartbeat.
    torchruns: dict[str, list[str]] = {}

    def exited() -> dict | None:
        torchruns.update(torchrun_processes(fleet.lab, str(EXAMPLE)))
        nodes = fleet.store_nodes()
        done = all(nodes.get(n, {}).get("launch_state") == "exited"
                   and nodes[n].get("launch_plan_id") == plan_id for n in (first, second))
        return nodes if done else None

    t0 = time.monotonic()
    nodes = fleet.wait(exited, 180, "both launches to exit and be reported")
    print(f"\npush to both exits reported: {time.monotonic() - t0:.1f} s")
    for n in (first, second):
        assert nodes[n]["launch_exit_code"] == 0, (nodes[n], fleet.logs())
        assert nodes[n]["launch_job"] == TRAIN_JOB
    # Seen while running: a static-rendezvous torchrun in each node's namespace, with the rank of
    # its placement and the rank-0 node as the rendezvous.
    assert set(torchruns) == {first, second}, torchruns
    for k, st in enumerate(stages):
        argv = torchruns[st["nodes"][0]]
        assert argv[argv.index("--node-rank") + 1] == str(k), argv
        assert argv[argv.index("--nnodes") + 1] == "2" and "static" in argv, argv
        assert argv[argv.index("--master-addr") + 1] == stages[0]["nodes"][0], argv

    # The training output: every step on both stages, and a finite loss per step on the last.
    for k, st in enumerate(stages):
        node = st["nodes"][0]
        log = (fleet.state_root / node / "jobs" / TRAIN_JOB / "job.log").read_text(errors="replace")
        for step in range(1, STEPS + 1):
            assert f"step {step}/{STEPS} stage {k} replica 0" in log, log[-3000:]
        agent_log = (fleet.work / f"agent-{node}.log").read_text(errors="replace")
        assert f"launch {TRAIN_JOB}: exited (code 0)" in agent_log, agent_log[-2000:]
    last_log = (fleet.state_root / stages[1]["nodes"][0] / "jobs" / TRAIN_JOB / "job.log").read_text()
    losses = [float(line.split(" loss ", 1)[1].split()[0]) for line in last_log.splitlines()
              if line.startswith("step ") and " loss " in line]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), last_log[-2000:]

    shown = fleet.lab.run(HUB, [PYTHON, "-m", "planner.cli", "fleet", "show", "--db", str(fleet.db)],
                          cwd=REPO, env=fleet.services.env)
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[1]: line for line in shown.stdout.splitlines()
            if len(line.split()) > 1 and line.split()[1] in (first, second)}
    assert set(rows) == {first, second}, shown.stdout
    assert all("exited" in row and TRAIN_JOB in row for row in rows.values()), shown.stdout


# ------------------------------------------------------------------------- 2. a node is lost

RECOVERY_JOB = "big"
DECLARED_SERVER_GB = 8 * 40  # what the agents of test 2 declare: 8 x A100-40GB


def recovery_jobs_file(path: Path) -> Path:
    """One job that needs the memory of three servers: the plan uses three or all four hosts,
    and after one is lost exactly the three left, so every surviving agent of the job gets a
    role again (whatever the planner prefers)."""
    path.write_text(textwrap.dedent(f"""\
        jobs:
          - {{name: {RECOVERY_JOB}, params: 45e9, layers: 48, hidden: 6144, seq_len: 2048,
             global_batch: 512, micro_batch: 1}}
        """))
    (job,) = parse_jobs(path.read_text(), str(path))
    server = DECLARED_SERVER_GB * 1e9
    assert stage_memory_bytes(job, job.layers // 2, 1, 1, 2) > server  # two servers are too few
    assert stage_memory_bytes(job, job.layers // 3, 1, 3, 3) < server  # three are enough
    return path


def test_killing_an_agent_gets_the_affected_agents_a_new_placement_within_30_s(lab_fleet):
    fleet = lab_fleet(lab_matrix.from_cities(["Beijing", "Neimeng", "Nanjing", "Tokyo"]).scaled(0.25))
    fleet.start_hub("--node-timeout", f"{NODE_TIMEOUT_S:g}", "--recovery-interval", "0.5")
    fleet.start_agents([PYTHON, "-c", AGENT_WITH_DECLARED_GPUS, "1"])
    fleet.wait_for_rtts()
    fleet.wait(lambda: all((fleet.store_nodes().get(n) or {}).get("gpu_count") == 8
                           for n in fleet.lab.hosts), 20, "every node's GPUs in the store")

    jobs = recovery_jobs_file(fleet.work / "jobs.yaml")
    plan, _ = fleet.plan_push(jobs, "--db", str(fleet.db))  # the store, as in production
    old_nodes = [n for st in stages_of(plan, RECOVERY_JOB) for n in st["nodes"]]
    assert len(old_nodes) >= 3, plan

    def pushed() -> dict | None:
        p = fleet.placements()
        ids = {p[n]["plan_id"] for n in old_nodes if p[n]}
        return p if all(p[n] for n in old_nodes) and len(ids) == 1 else None

    before = fleet.wait(pushed, 30, "the first placements")
    old_plan_id = before[old_nodes[0]]["plan_id"]
    # The rank-0 node: every other node's placement names it as the rendezvous.
    (victim,) = [n for n in old_nodes if roles_for(before[n], RECOVERY_JOB)[0]["rank"] == 0]
    victim_address = fleet.lab.address(victim)
    assert all(roles_for(before[n], RECOVERY_JOB)[0]["rendezvous"]["address"] == victim_address
               for n in old_nodes)
    survivors = [n for n in old_nodes if n != victim]

    def replanned() -> dict | None:
        p = fleet.placements()
        new = {n: p[n] for n in fleet.lab.hosts if n != victim and p[n]
               and p[n]["plan_id"] != old_plan_id and roles_for(p[n], RECOVERY_JOB)}
        if not new:
            return None
        world = roles_for(next(iter(new.values())), RECOVERY_JOB)[0]["world_size"]
        # Every survivor of the old group holds a role of the new plan, and the group is complete.
        return new if set(survivors) <= set(new) and len(new) == world else None

    t_kill = time.monotonic()
    fleet.kill_agent(victim)
    new = fleet.wait(replanned, RECOVERY_BOUND_S + 15, "the new placements", poll_s=0.05)
    elapsed = time.monotonic() - t_kill
    print(f"\nkill to new placements on {len(new)} agent(s): {elapsed:.2f} s "
          f"(node timeout {NODE_TIMEOUT_S:g} s, agents' heartbeat 1 s)")
    assert elapsed < RECOVERY_BOUND_S, fleet.logs()

    new_plan_ids = {p["plan_id"] for p in new.values()}
    assert len(new_plan_ids) == 1 and old_plan_id not in new_plan_ids
    roles = {n: roles_for(p, RECOVERY_JOB)[0] for n, p in new.items()}
    assert victim not in new
    assert sorted(r["rank"] for r in roles.values()) == list(range(len(roles)))
    rank0 = next(n for n, r in roles.items() if r["rank"] == 0)
    for n, r in roles.items():
        assert r["rendezvous"]["address"] == fleet.lab.address(rank0) != victim_address, r
        assert r["plan_id"] in new_plan_ids
        assert victim not in json.dumps(new[n])
    # The planner logs the recovery right after its push returns.
    fleet.wait(lambda: f"recovery: re-planned ['{RECOVERY_JOB}']" in
               (fleet.work / "planner.log").read_text(), 10, "the planner's recovery log line")
