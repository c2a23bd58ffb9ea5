"""A `python -m lab.run --secure --keep` lab runs jobs submitted to it and survives an agent's
death: the agents declare GPUs (`--declared-gpus`, marked in `fleet show`), a submitted job runs
to the end, SIGKILLing another host's agent is reported while serve and the other agents go on,
and `python -m lab.ctl restart HOST --work DIR` brings the agent back: `fleet show` hears from it
again. Real namespaces, switch, mosquitto with the shipped configuration, serve over TLS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from lab.fleet import wait_for
from lab.job_scenarios import write_jobs
from lab.wan import REPO

pytestmark = [pytest.mark.root, pytest.mark.process]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO)))


def fleet_row(db, node: str) -> str:
    shown = cli("-m", "planner.cli", "fleet", "show", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if line.startswith(f"│ {node} ")]
    return row


def test_a_keep_lab_runs_a_job_and_an_agent_killed_in_it_can_be_restarted(lab_available,
                                                                           tmp_path):
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    work = tmp_path / "keep"
    out = tmp_path / "lab.out"
    with open(out, "wb") as sink:
        lab = subprocess.Popen(
            [sys.executable, "-m", "lab.run", "--secure", "--keep", "--no-plan", "--hosts", "3",
             "--interval", "1", "--min-samples", "1", "--measure-timeout", "60",
             "--throughput-port", "0", "--work-dir", str(work)],
            stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        def printed() -> str:
            return out.read_text(errors="replace")

        def lab_alive() -> bool:
            assert lab.poll() is None, f"lab.run ended ({lab.returncode}):\n{printed()[-3000:]}"
            return True

        wait_for(lambda: lab_alive() and "lab: up;" in printed(), 120, "the lab to be up",
                 detail=lambda: printed()[-3000:])
        db = work / "planner.db"
        services = {r["name"]: r for r in json.loads((work / "services.json").read_text())["services"]}
        hosts = [name[len("agent-"):] for name in services if name.startswith("agent-")]
        assert len(hosts) == 3 and "(declared)" in fleet_row(db, hosts[0])

        jobs = write_jobs(tmp_path / "jobs.yaml", [{"name": "keep-1", "steps": 60}])
        submitted = cli("-m", "planner.cli", "jobs", "submit", str(jobs), "--db", str(db))
        assert submitted.returncode == 0, submitted.stderr

        def job() -> dict:
            rows = json.loads(cli("-m", "planner.cli", "jobs", "list", "--json", "--db",
                                  str(db)).stdout)["jobs"]
            return next(r for r in rows if r["name"] == "keep-1")

        running = wait_for(lambda: lab_alive() and job()["state"] in ("running", "succeeded")
                           and job(), 60, "the submitted job to run",
                           detail=lambda: f"{job()}\n{printed()[-2000:]}")
        victim = next(h for h in hosts if h not in running["nodes"])
        os.killpg(services[f"agent-{victim}"]["pid"], signal.SIGKILL)
        wait_for(lambda: lab_alive() and f"agent-{victim} exited with code -9" in printed(), 10,
                 "the lab to report the dead agent", detail=lambda: printed()[-2000:])
        assert f"python -m lab.ctl restart agent-{victim} --work {work}" in printed()

        done = wait_for(lambda: lab_alive() and job()["state"] in ("succeeded", "failed")
                        and job(), 90, "the job to end", detail=lambda: f"{job()}")
        assert done["state"] == "succeeded", done
        status = cli("-m", "lab.ctl", "status", "--work", str(work)).stdout
        for name in services:
            assert re.search(rf"^{name} .* {'dead' if name == f'agent-{victim}' else 'running'} ",
                             status, re.M), status

        restarted_at_ms = time.time() * 1000
        restarted = cli("-m", "lab.ctl", "restart", victim, "--work", str(work))
        assert restarted.returncode == 0 and f"started agent-{victim} again" in restarted.stdout, \
            restarted.stdout + restarted.stderr

        def heard_again() -> bool:
            from planner.service.store import Store

            with Store(db) as store:
                row = next(r for r in store.nodes() if r["id"] == victim)
            return lab_alive() and row["last_seen_ms"] > restarted_at_ms

        wait_for(heard_again, 30, f"{victim} heard from again", detail=lambda: printed()[-2000:])
        seen = re.search(r"│ (\d+) s ago", fleet_row(db, victim))
        assert seen and int(seen.group(1)) < 30, fleet_row(db, victim)
        assert re.search(rf"^agent-{victim} .* running ", cli(
            "-m", "lab.ctl", "status", "--work", str(work)).stdout, re.M)
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
    assert "lab: torn down" in out.read_text()
