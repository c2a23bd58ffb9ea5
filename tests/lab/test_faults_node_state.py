"""In the WAN lab: node state is true and one store has one serve.

Real namespaces and switch, mosquitto, `hulk-planner serve --mqtt`, one agent per host (8
declared A100s, 1 s heartbeats: lab/fleet.py), jobs of examples/train_gpt.py under torchrun.

(a) A second `hulk-planner serve` on the lab's store, in the hub like the first, stops at start
    with exit 2 and one line naming the store and the running serve's pid; the first goes on
    placing jobs.
(b) A node revoked the way an operator does it (`hulk-planner enroll NODE`, later
    `hulk-planner revoke NODE --db`) is marked `revoked` by `fleet show` and never planned on:
    three one-node jobs on a three-host fleet all run on the other two hosts, one after another.
    The lab runs with --insecure (its agents present no token), so the revoked node's agent
    keeps calling: what keeps jobs off it is the revocation, not silence.
"""

from __future__ import annotations

import subprocess

import pytest

from lab import job_scenarios
from lab import matrix as lab_matrix
from lab.fleet import PYTHON
from lab.netns import HUB_ADDRESS
from lab.run import PLANNER_PORT
from lab.wan import HUB, REPO
from planner.service.serve_lock import lock_path

pytestmark = [pytest.mark.root, pytest.mark.process]

NODE_TIMEOUT_S = 5.0
# Far-apart cities: a tiny job is cheapest on one node, so three jobs would use all three hosts.
CITIES = ["Beijing", "Tokyo", "London"]


def planner_cli(fleet, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "planner.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=fleet.services.env, timeout=60)


def fleet_show_rows(fleet) -> dict[str, str]:
    shown = planner_cli(fleet, "fleet", "show", "--db", str(fleet.db),
                        "--node-timeout", f"{NODE_TIMEOUT_S:g}")
    assert shown.returncode == 0, shown.stderr
    return {line.split()[1]: line for line in shown.stdout.splitlines()
            if line.startswith("│") and line.split()[1] in fleet.lab.hosts}


def test_a_second_serve_is_refused_and_a_revoked_node_is_never_planned_on(lab_fleet, tmp_path):
    fleet = lab_fleet(lab_matrix.from_cities(CITIES).scaled(0.25))
    job_scenarios.start(fleet, NODE_TIMEOUT_S)

    # (a) The first serve's pid, as its lock file names it, is a live serve on this store.
    holder = lock_path(fleet.db).read_text().strip()
    cmdline = open(f"/proc/{holder}/cmdline", "rb").read().split(b"\0")
    assert b"serve" in cmdline and str(fleet.db).encode() in cmdline, cmdline
    second = fleet.lab.run(HUB, [PYTHON, "-m", "planner.cli", "serve", "--db", str(fleet.db),
                                 "--listen", f"{HUB_ADDRESS}:{PLANNER_PORT + 1}", "--insecure",
                                 "--fleet-name", "lab"],
                           timeout=60, cwd=REPO, env=fleet.services.env)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2, second.stdout[-1000:] + second.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert str(fleet.db) in lines[0] and f"pid {holder}" in lines[0], lines[0]
    assert "listening on" not in second.stdout
    assert fleet.planner is not None and fleet.planner.poll() is None
    fleet.services.check()

    # (b) Revoke one host the way an operator does.
    victim = fleet.lab.hosts[0]
    enrolled = planner_cli(fleet, "enroll", victim, "--db", str(fleet.db))
    assert enrolled.returncode == 0, enrolled.stderr
    revoked = planner_cli(fleet, "revoke", victim, "--db", str(fleet.db))
    assert revoked.returncode == 0 and f"revoked {victim}" in revoked.stdout, revoked.stderr
    rows = fleet_show_rows(fleet)
    assert set(rows) == set(fleet.lab.hosts), rows
    assert "revoked" in rows[victim] and "silent" not in rows[victim], rows[victim]
    for host in fleet.lab.hosts:
        if host != victim:
            assert "revoked" not in rows[host] and "silent" not in rows[host], rows[host]

    names = ["n1", "n2", "n3"]
    fleet.submit(job_scenarios.write_jobs(tmp_path / "jobs.yaml",
                                          [{"name": n, "steps": 20} for n in names]))
    used: set[str] = set()
    victim_roles: list[dict] = []

    def all_final() -> bool:
        records = [job_scenarios.record(fleet, n) for n in names]
        used.update(node for r in records if r is not None for node in r.nodes)
        victim_roles.extend((fleet.placements().get(victim) or {}).get("roles", []))
        return all(r is not None and r.state in job_scenarios.FINAL for r in records)

    fleet.wait(all_final, 90, "the three jobs to end", poll_s=0.2)
    listed = fleet.jobs()
    assert {n: listed[n]["state"] for n in names} == dict.fromkeys(names, "succeeded"), listed
    assert victim not in used and used, (victim, used)
    assert not victim_roles, victim_roles
    assert not job_scenarios.torchrun_pids(fleet.lab, str(job_scenarios.EXAMPLE)).get(victim)
    # The revoked node's agent still calls (no token in this lab): it is marked, not silent.
    assert "revoked" in fleet_show_rows(fleet)[victim]
    assert fleet.planner.poll() is None
