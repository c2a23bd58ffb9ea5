"""Fencing by the job's wrapper (agent/jobproc.py WRAPPER) with real processes: once the lease in
the job's folder has lapsed, SIGTERM reaches the job and a worker in a session of its own (as
torchrun starts them), SIGKILL follows the grace for one that ignores SIGTERM (orphaned or not:
the wrapper is their subreaper), every process is gone and exit.json says it was fenced. A lease
that is renewed keeps the job running; one lapsed before the start runs nothing; the launcher
reports a fenced job as such."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from agent.jobproc import EXIT_FILE, SubprocessRunner, is_alive, start_ticks
from agent.launcher import Launcher
from agent.lease import NodeLease, lease_clock, write_lease
from hulk.lease import FenceTerms
from hulk.wire.placement import NodePlacement, Role
from hulk.wire.records import LaunchState
from tests.helpers.waits import wait_until, wait_until_async

pytestmark = pytest.mark.process

# The job: a worker in its own session that ignores SIGTERM, then the job itself, which notes
# when SIGTERM came and exits (leaving the worker orphaned).
JOB = r"""
import os, signal, subprocess, sys, time
out = sys.argv[1]
boot = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
open(os.path.join(out, "worker.pid"), "w").write(str(worker.pid))
def term(signum, frame):
    open(os.path.join(out, "term"), "w").write(repr(time.clock_gettime(boot)))
    os._exit(143)
signal.signal(signal.SIGTERM, term)
open(os.path.join(out, "started"), "w").write("1")
while True:
    time.sleep(0.05)
"""
TERMS = FenceTerms(lease_s=2.0, renew_s=0.0, poll_s=0.1, grace_s=1.0, slack_s=0.1)


def env() -> dict[str, str]:
    return {"PATH": os.environ["PATH"]}


def pid_alive(pid: int) -> bool:
    ticks = start_ticks(pid)
    return ticks is not None and is_alive(pid, ticks)


async def start_job(job_dir: Path, out: Path, deadline: float):
    job_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(exist_ok=True)
    write_lease(job_dir, deadline, TERMS)
    runner = SubprocessRunner(drop_caps=False, scope="session", poll_s=0.05)
    return await runner.start([sys.executable, "-c", JOB, str(out)], env(), job_dir,
                              job_dir / "job.log")


async def test_a_lapsed_lease_stops_the_job_term_then_kill(tmp_path):
    job_dir, out = tmp_path / "job", tmp_path / "out"
    deadline = lease_clock() + 1.5
    proc = await start_job(job_dir, out, deadline)
    wait_until(lambda: (out / "worker.pid").exists() and (out / "started").exists(), timeout=20,
               what="the job and its worker")
    worker = int((out / "worker.pid").read_text())
    assert pid_alive(worker) and pid_alive(proc.pid)
    code = await proc.wait()
    ended = lease_clock()
    term_at = float((out / "term").read_text())
    assert deadline <= term_at                              # never before the lease lapsed
    assert not pid_alive(worker)                            # the SIGTERM-proof worker too
    assert ended >= term_at + TERMS.grace_s * 0.9           # it took the SIGKILL, after the grace
    # Generous on a loaded machine: the guarantee's own margins are checked in test_lease.py.
    assert ended <= deadline + TERMS.poll_s + TERMS.grace_s + 5.0
    record = json.loads((job_dir / EXIT_FILE).read_text())
    assert record["code"] == code == 143
    assert "lease lapsed" in record["fenced"] and "SIGKILL" in record["fenced"]


async def test_a_renewed_lease_keeps_the_job_and_it_stops_once_renewals_stop(tmp_path):
    job_dir, out = tmp_path / "job", tmp_path / "out"
    proc = await start_job(job_dir, out, lease_clock() + 0.6)
    wait_until(lambda: (out / "worker.pid").exists(), timeout=20, what="the worker")
    worker = int((out / "worker.pid").read_text())
    renewed_until = time.monotonic() + 2.5
    while time.monotonic() < renewed_until:                 # a heartbeat every 0.2 s
        write_lease(job_dir, lease_clock() + 0.6, TERMS)
        time.sleep(0.2)
        assert pid_alive(proc.pid) and pid_alive(worker) and not (out / "term").exists()
    last = lease_clock() + 0.6
    write_lease(job_dir, last, TERMS)
    await proc.wait()
    assert float((out / "term").read_text()) >= last
    assert not pid_alive(worker)
    assert "lease lapsed" in json.loads((job_dir / EXIT_FILE).read_text())["fenced"]


async def test_a_lease_lapsed_before_the_start_runs_nothing(tmp_path):
    job_dir, out = tmp_path / "job", tmp_path / "out"
    proc = await start_job(job_dir, out, lease_clock() - 1.0)
    await proc.wait()
    assert not (out / "started").exists() and not (out / "worker.pid").exists()
    assert "before the job started" in json.loads((job_dir / EXIT_FILE).read_text())["fenced"]


async def test_the_launcher_reports_a_fenced_job(tmp_path):
    lease = NodeLease(tmp_path / "jobs", lease_s=2.0)
    lease.granted(lease_clock(), 2.0)                       # the only heartbeat acknowledged
    out = tmp_path / "out"
    out.mkdir()
    r = Role(plan_id="p1", job="fenced", phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
             replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
             rendezvous_port=29500, micro_batch=1, command=("python", "-c", JOB, str(out)))
    launcher = Launcher(runner=SubprocessRunner(drop_caps=False, scope="session", poll_s=0.05),
                        command=lambda role: [sys.executable, *role.command[1:]],
                        jobs_dir=tmp_path / "jobs", allowed_commands=[["python"]], lease=lease,
                        running_after_s=0.05)
    await launcher.apply(NodePlacement(fleet="f", node="n", plan_id="p1", roles=(r,)))
    await wait_until_async(lambda: launcher.status.state == LaunchState.EXITED, timeout=30,
                           what="the fenced job to end")
    assert launcher.status.detail.startswith("fenced: the node's lease lapsed")
    assert launcher.status.exit_code == 143
    assert not pid_alive(int((out / "worker.pid").read_text()))
    await launcher.stop()
