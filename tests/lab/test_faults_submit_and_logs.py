"""In the WAN lab (mosquitto, `hulk-planner serve --mqtt`, one agent per host with declared
GPUs): a job that cannot run is refused at `jobs submit`, and a job whose command fails at
start-up leaves its error readable in `jobs logs` after it has ended and its nodes went idle.

1. A job without a command: `jobs submit` exits 2 with one line naming the job and `command`;
   the store holds no job and no node gets a placement.
2. examples/train_gpt.py with ``--dim 65 --heads 4`` exits at once ("--dim (65) must be a
   multiple of --heads (4)"): the job (``max_restarts: 0``) ends failed, is retired, and
   `jobs logs` still shows that line and where the full log is on the node.
"""

from __future__ import annotations

import subprocess

import pytest

from lab import job_scenarios
from lab.fleet import EXAMPLE, PYTHON, REPO, LabFleet

pytestmark = [pytest.mark.root, pytest.mark.process]

SPEC = ("    params: 0.25e6\n    layers: 4\n    hidden: 64\n    seq_len: 32\n"
        "    global_batch: 16\n    micro_batch: 2\n    steps: 20\n")
CRASH = "--dim (65) must be a multiple of --heads (4)"


def jobs_cli(fleet: LabFleet, *args: str) -> subprocess.CompletedProcess:
    """`hulk-planner jobs ARGS --db <the fleet's db>`, whatever its exit code."""
    return subprocess.run([PYTHON, "-m", "planner.cli", "jobs", *args, "--db", str(fleet.db)],
                          capture_output=True, text=True, cwd=REPO, env=fleet.services.env,
                          timeout=60)


@pytest.fixture
def fleet(job_fleet) -> LabFleet:
    return job_fleet


def test_submit_refuses_a_job_without_command_and_logs_outlive_a_failed_job(fleet, tmp_path):
    # 1. No command: refused, nothing stored, nothing placed.
    idle = tmp_path / "no-command.yaml"
    idle.write_text("jobs:\n  - name: idle\n" + SPEC)
    proc = jobs_cli(fleet, "submit", str(idle))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'idle'" in proc.stderr and "command: " in proc.stderr, proc.stderr
    assert job_scenarios.record(fleet, "idle") is None
    assert not any(fleet.placements().values()), fleet.placements()

    # 2. A command that fails at start-up: failed, retired, its error kept.
    crash = tmp_path / "crash.yaml"
    crash.write_text("jobs:\n  - name: crash\n" + SPEC + "    max_restarts: 0\n"
                     f'    command: "python {EXAMPLE} --steps 20 --dim 65 --heads 4"\n')
    assert jobs_cli(fleet, "submit", str(crash)).returncode == 0
    final = job_scenarios.wait_state(fleet, "crash", job_scenarios.FINAL, 60)
    assert final.state == "failed", (final, fleet.logs())
    nodes = list(final.nodes)
    fleet.wait(lambda: (r := job_scenarios.record(fleet, "crash")).retired_ms is not None and r,
               30, "the failed job to be retired")
    # Its nodes no longer report it: what `jobs logs` prints now comes from the kept reports.
    fleet.wait(lambda: all((fleet.store_nodes()[n].get("launch_job") or "") != "crash"
                           for n in nodes), 30, "the job's nodes to report idle")
    logs = jobs_cli(fleet, "logs", "crash")
    assert logs.returncode == 0, logs.stderr
    out = logs.stdout
    print(f"\n{out}")
    assert CRASH in out, (out, fleet.logs())
    assert "exit code" in out and "no report" not in out, out
    assert "full log: " in out, out
    for node in nodes:
        path = fleet.state_root / node / "jobs" / "crash" / "job.log"
        assert f"full log: {path}" in out or f"full log: {path.resolve()}" in out, out
        assert CRASH in path.read_text(errors="replace")
