"""Job processes apart from the agent (agent/jobproc.py) and what a restarted agent does with them:
the launch detail of an ended job, adopting or stopping recorded processes (with stand-ins), and
the same with real processes that outlive a detached launcher."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from agent.jobproc import (EXIT_FILE, RunRecord, SubprocessRunner, descendant_groups, is_alive,
                           parse_stat, proc_stat, resolve_scope, role_json, start_ticks)
from agent.launcher import DETAIL_MAX_BYTES, Launcher, exit_detail, first_error
from hulk.wire.placement import NodePlacement, Role
from hulk.wire.records import LaunchState
from tests.helpers.waits import wait_until_async

PY_C = ("python", "-c")


def role(job: str = "a", code: str = "pass", plan_id: str = "p1") -> Role:
    return Role(plan_id=plan_id, job=job, phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=1, command=(*PY_C, code))


def placement(*roles: Role) -> NodePlacement:
    return NodePlacement(fleet="lab", node="n1", plan_id=roles[0].plan_id if roles else "cleared",
                         roles=roles)


def python_c(r: Role) -> list[str]:
    return [sys.executable, *r.command[1:]]


# ------------------------------------------------------------------------------- the detail

def write_log(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_stat_fields_are_read_after_the_last_parenthesis():
    line = b"42 (a) b) (c d) S 1 42 42 0 -1 4194560 " + b" ".join(b"%d" % i for i in range(9, 22)) + b"\n"
    assert parse_stat(line) == ("S", 21)            # field 22 is the 20th after the name
    assert parse_stat(b"42 (x) Z 1") is None and parse_stat(b"garbage") is None


def test_this_process_is_alive_with_its_own_start_time_only():
    state, ticks = proc_stat(os.getpid())
    assert state in "RS" and is_alive(os.getpid(), ticks)
    assert not is_alive(os.getpid(), ticks + 1)        # a reused pid
    assert proc_stat(2**22 + 1) is None                              # beyond pid_max: none


def test_a_failure_detail_shows_the_first_error_the_tail_and_the_full_log(tmp_path):
    lines = [f"banner {i}" for i in range(1, 11)]
    lines.append("ValueError: --dim (65) must be a multiple of --heads (4)")        # line 11
    lines += [f"after {i}" for i in range(12, 45)]                                    # 44 lines
    log = write_log(tmp_path / "job.log", lines)
    detail = exit_detail(1, log).splitlines()
    assert detail[0] == "exit code 1"
    assert detail[1] == "first error (lines 8-15 of 44):"
    assert detail[2:10] == lines[7:15] and "--dim (65)" in detail[5]
    assert detail[10] == "last lines:"
    assert detail[11:-1] == lines[-20:]
    assert detail[-1] == f"full log: {log}"


def test_an_error_on_the_first_line_and_no_error_at_all(tmp_path):
    log = write_log(tmp_path / "job.log", ["Traceback (most recent call last):", "x", "y"])
    assert first_error(log) == (1, 3, 3, ["Traceback (most recent call last):", "x", "y"])
    clean = write_log(tmp_path / "clean.log", ["step 1", "step 2"])
    assert exit_detail(3, clean).splitlines() == ["exit code 3", "last lines:", "step 1", "step 2",
                                                  f"full log: {clean}"]
    # exit 0: the tail and the full log's path; never a first-error section
    noisy = write_log(tmp_path / "noisy.log", ["error rate 0.1", "done"])
    assert exit_detail(0, noisy).splitlines() == ["exited 0", "error rate 0.1", "done",
                                                  f"full log: {noisy}"]
    assert exit_detail(-9, None) == "exit code -9" and first_error(tmp_path / "none.log") is None


def test_the_detail_stays_within_its_byte_budget(tmp_path):
    wide = "é" * 2000                                  # multi-byte, far past a line's budget
    log = write_log(tmp_path / "job.log", [wide, f"FATAL {wide}", *([wide] * 50)])
    detail = exit_detail(137, log)
    assert len(detail.encode()) <= DETAIL_MAX_BYTES
    lines = detail.splitlines()
    assert lines[:2] == ["exit code 137", "first error (lines 1-8 of 52):"]
    assert lines[3].startswith("FATAL ") and lines[-1] == f"full log: {log}"
    assert "last lines:" in lines and lines[lines.index("last lines:") + 1].startswith("é")
    many = write_log(tmp_path / "many.log", [f"Exception {i} " + "x" * 200 for i in range(5000)])
    assert len(exit_detail(1, many).encode()) <= DETAIL_MAX_BYTES


# ------------------------------------------------------- adoption decisions, with stand-ins

class StandIn:
    """A recorded process that is alive until signalled or told to end."""

    def __init__(self, pid: int, ticks: int):
        self.pid, self.start_ticks = pid, ticks
        self.signals: list[int] = []
        self.ended = asyncio.Event()
        self.code = 0

    async def wait(self) -> int:
        await self.ended.wait()
        return self.code

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)
        self.code = -sig
        self.ended.set()


class StandInRunner:
    """Adopts the records whose pid it is told are alive; starts nothing."""

    def __init__(self, alive: dict[int, StandIn]):
        self.alive = alive
        self.started: list[list[str]] = []

    async def start(self, argv, env, cwd, log_path, *, unit=None):
        self.started.append(list(argv))
        raise OSError("the stand-in starts nothing")

    def adopt(self, record: RunRecord, poll_s: float):
        return self.alive.get(record.pid)


def recorded(jobs: Path, r: Role, pid: int, code: int | None = None) -> None:
    job_dir = jobs / r.job
    job_dir.mkdir(parents=True, exist_ok=True)
    RunRecord(job_dir=job_dir, pid=pid, start_ticks=pid * 10, role=role_json(r),
              log=str(job_dir / "job.log")).save()
    if code is not None:
        (job_dir / EXIT_FILE).write_text(json.dumps({"code": code}))


async def test_the_first_placement_adopts_what_it_names_and_stops_the_rest(tmp_path):
    jobs = tmp_path / "jobs"
    kept, stray = role("a"), role("b", plan_id="p0")
    recorded(jobs, kept, 101)
    recorded(jobs, stray, 102)
    alive = {101: StandIn(101, 1010), 102: StandIn(102, 1020)}
    runner = StandInRunner(alive)
    launcher = Launcher(runner=runner, command=python_c, jobs_dir=jobs, allowed_commands=[PY_C])
    await launcher.apply(placement(kept))
    assert alive[102].signals == [signal.SIGTERM] and alive[101].signals == []
    assert launcher.status.state == LaunchState.RUNNING and launcher.status.job == "a"
    assert launcher.status.detail == "adopted pid 101" and runner.started == []
    (jobs / "a" / EXIT_FILE).write_text(json.dumps({"code": 7}))
    alive[101].code = 7
    alive[101].ended.set()
    await wait_until_async(lambda: launcher.status.state == LaunchState.EXITED, 5, "the end")
    assert launcher.status.exit_code == 7 and launcher.status.detail.startswith("exit code 7")
    # Later placements do not look at the records again.
    await launcher.apply(placement(kept))
    assert runner.started == []


async def test_a_named_role_that_ended_unwatched_is_reported_not_run_again(tmp_path):
    jobs = tmp_path / "jobs"
    done, killed = role("a"), role("b")
    recorded(jobs, done, 201, code=0)
    recorded(jobs, killed, 202)                    # no exit.json: its wrapper was killed
    for r, code in ((done, 0), (killed, -9)):
        runner = StandInRunner({})
        launcher = Launcher(runner=runner, command=python_c, jobs_dir=jobs, allowed_commands=[PY_C])
        await launcher.apply(placement(r))
        await wait_until_async(lambda: launcher.status.state == LaunchState.EXITED, 5, "reported")
        assert (launcher.status.job, launcher.status.exit_code) == (r.job, code)
        assert runner.started == []


async def test_no_placement_at_start_stops_every_live_record(tmp_path):
    jobs = tmp_path / "jobs"
    recorded(jobs, role("a"), 301)
    recorded(jobs, role("b"), 302)
    alive = {301: StandIn(301, 3010), 302: StandIn(302, 3020)}
    launcher = Launcher(runner=StandInRunner(alive), command=python_c, jobs_dir=jobs)
    await launcher.apply(None)
    assert [s.signals for s in alive.values()] == [[signal.SIGTERM], [signal.SIGTERM]]
    assert launcher.status.state == LaunchState.IDLE


# ---------------------------------------------------------------------- real processes

WAITER = ("import pathlib, sys, time\n"
          "pathlib.Path('ready').write_text('')\n"
          "go = pathlib.Path('go')\n"
          "while not go.exists(): time.sleep(0.05)\n"
          "sys.exit(int(go.read_text()))\n")


@pytest.fixture
async def jobs(tmp_path):
    """The jobs folder; afterwards, pass or fail, every recorded process still alive is stopped
    (as a new agent with no placement would)."""
    folder = tmp_path / "jobs"
    yield folder
    await Launcher(jobs_dir=folder, grace_s=2, adopt_poll_s=0.1).apply(None)


async def started(jobs: Path, r: Role) -> tuple[Launcher, RunRecord]:
    launcher = Launcher(command=python_c, jobs_dir=jobs, allowed_commands=[PY_C],
                        running_after_s=0.1, adopt_poll_s=0.1, grace_s=5)
    await launcher.apply(placement(r))
    await wait_until_async(lambda: (jobs / r.job / "ready").exists()
                           and launcher.status.state == LaunchState.RUNNING, 15, "the job to run",
                           detail=lambda: launcher.status)
    record = RunRecord.load(jobs / r.job)
    assert record is not None and is_alive(record.pid, record.start_ticks)
    return launcher, record


@pytest.mark.process
async def test_a_job_survives_detach_and_a_new_launcher_adopts_it(jobs):
    r = role("a", WAITER)
    first, record = await started(jobs, r)
    second = None
    try:
        await first.detach()
        assert is_alive(record.pid, record.start_ticks)          # the agent went, the job did not
        second = Launcher(command=python_c, jobs_dir=jobs, allowed_commands=[PY_C],
                          adopt_poll_s=0.1)
        await second.apply(placement(r))
        assert second.status.state == LaunchState.RUNNING
        assert second.status.detail == f"adopted pid {record.pid}"
        (jobs / "a" / "go").write_text("5")
        await wait_until_async(lambda: second.status.state == LaunchState.EXITED, 15, "the end",
                               detail=lambda: second.status)
        assert second.status.exit_code == 5                        # read from exit.json
        assert json.loads((jobs / "a" / EXIT_FILE).read_text()) == {"code": 5}
        assert second.status.detail.splitlines()[-1] == f"full log: {jobs / 'a' / 'job.log'}"
    finally:
        if second is not None:
            await second.stop()


@pytest.mark.process
async def test_a_new_launcher_stops_a_job_its_placement_does_not_name(jobs):
    r = role("a", WAITER)
    first, record = await started(jobs, r)
    await first.detach()
    second = Launcher(command=python_c, jobs_dir=jobs, allowed_commands=[PY_C],
                      adopt_poll_s=0.1, grace_s=5)
    await second.apply(placement(role("b", "pass", plan_id="p2")))   # re-placed: not "a"
    assert not is_alive(record.pid, record.start_ticks)
    assert json.loads((jobs / "a" / EXIT_FILE).read_text()) == {"code": -signal.SIGTERM}
    await wait_until_async(lambda: second.status.state == LaunchState.EXITED
                           and second.status.job == "b", 15, "job b to run",
                           detail=lambda: second.status)
    assert second.status.exit_code == 0


def test_auto_scope_is_a_session_without_systemd(tmp_path):
    assert resolve_scope("auto", systemd_dir=str(tmp_path / "no-systemd")) == "session"
    assert (resolve_scope("session"), resolve_scope("systemd")) == ("session", "systemd")


@pytest.mark.process
async def test_the_systemd_scope_wraps_the_job_and_its_code_still_comes_back(tmp_path, monkeypatch):
    bin_dir, args = tmp_path / "bin", tmp_path / "systemd-run.args"
    bin_dir.mkdir()
    fake = bin_dir / "systemd-run"      # records its arguments, then runs what follows "--"
    fake.write_text(f"#!{sys.executable}\nimport os, sys\n"
                    f"open({str(args)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
                    "rest = sys.argv[sys.argv.index('--') + 1:]\nos.execv(rest[0], rest)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    launcher = Launcher(runner=SubprocessRunner(scope="systemd"), command=python_c,
                        jobs_dir=tmp_path / "jobs", allowed_commands=[PY_C], running_after_s=0.1)
    try:
        await launcher.apply(placement(role("a", "raise SystemExit(4)")))
        await wait_until_async(lambda: launcher.status.state == LaunchState.EXITED, 15, "the end",
                               detail=lambda: launcher.status)
    finally:
        await launcher.stop()
    assert launcher.status.exit_code == 4
    assert args.read_text().splitlines()[:5] == ["--scope", "--collect", "--quiet",
                                                 "--unit=hulk-job-a-0-0", "--"]


@pytest.mark.process
async def test_a_job_killed_by_a_signal_reports_the_signal(tmp_path):
    launcher = Launcher(command=python_c, jobs_dir=tmp_path / "jobs", allowed_commands=[PY_C],
                        running_after_s=0.1)
    try:   # as an OOM kill would: SIGKILL of the job itself, not of its wrapper
        await launcher.apply(placement(role("a", "import os; print('Killed', flush=True); "
                                                 "os.kill(os.getpid(), 9)")))
        await wait_until_async(lambda: launcher.status.state == LaunchState.EXITED, 15, "the end",
                               detail=lambda: launcher.status)
    finally:
        await launcher.stop()
    assert launcher.status.exit_code == -9
    assert launcher.status.detail.splitlines()[:3] == ["exit code -9", "first error (lines 1-1 of 1):",
                                                      "Killed"]
    assert json.loads((tmp_path / "jobs" / "a" / EXIT_FILE).read_text()) == {"code": -9}


@pytest.mark.process
async def test_a_stop_right_after_the_start_reaches_the_job(tmp_path):
    """Before, during or after the wrapper's fork: the job never outlives a SIGTERM to its group."""
    job_dir = tmp_path / "a"
    job_dir.mkdir()
    proc = await SubprocessRunner().start([sys.executable, "-c", "import time; time.sleep(30)"],
                                          {"PATH": os.environ["PATH"]}, job_dir, job_dir / "job.log")
    proc.signal_group(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGTERM


# Like torchrun: a worker in a session of its own, and a parent that ignores SIGTERM (so the
# group is SIGKILLed after the grace, when the worker could be left behind).
TORCHRUN_LIKE = ("import pathlib, signal, subprocess, sys, time\n"
                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                 "w = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], "
                 "start_new_session=True)\n"
                 "pathlib.Path('worker').write_text(str(w.pid))\n"
                 "pathlib.Path('ready').write_text('')\n"
                 "time.sleep(60)\n")


def test_descendant_groups_are_read_from_parent_links(tmp_path):
    proc = tmp_path / "proc"
    for pid, ppid, pgrp in [(10, 1, 10), (11, 10, 10), (12, 11, 12), (13, 12, 12), (20, 1, 20)]:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_bytes(f"{pid} (a b) S {ppid} {pgrp} 0".encode())
    (proc / "self").mkdir()
    assert descendant_groups(10, str(proc)) == {12}     # its own group left out, 20 not its own
    assert descendant_groups(20, str(proc)) == set()


@pytest.mark.process
async def test_a_stop_also_kills_a_worker_that_left_the_job_s_session(jobs):
    r = role("a", TORCHRUN_LIKE)
    launcher, record = await started(jobs, r)
    launcher.grace_s = 0.5
    worker = int((jobs / "a" / "worker").read_text())
    worker_ticks = start_ticks(worker)
    assert worker_ticks is not None and os.getpgid(worker) == worker   # its own session
    await launcher.apply(placement(role("b", "pass", plan_id="p2")))
    assert not is_alive(record.pid, record.start_ticks)
    await wait_until_async(lambda: not is_alive(worker, worker_ticks), 10, "the worker to die")
    await launcher.stop()
