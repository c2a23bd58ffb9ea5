"""The launcher with real processes: states, HULK_* variables, stopping the old group, torchrun."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from agent.launcher import Launcher, TorchrunCommand, role_env
from hulk.wire.placement import NodePlacement, Role
from hulk.wire.records import LaunchState
from tests.helpers.ports import free_port
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process


PY_C = ("python", "-c")      # the allowed prefix of the test jobs


def placement(code: str | tuple[str, ...] | None, *, plan_id: str = "p1", job: str = "a",
              port: int = 29500) -> NodePlacement:
    """A placement whose command is ``python -c CODE`` (or the argv given)."""
    command = (*PY_C, code) if isinstance(code, str) else code
    role = Role(plan_id=plan_id, job=job, phase=0, stage=1, num_stages=2, layer_lo=20, layer_hi=48,
                replica=0, num_replicas=1, rank=1, world_size=2, rendezvous_address="127.0.0.1",
                rendezvous_port=port, micro_batch=4, command=command)
    return NodePlacement(fleet="lab", node="n1", plan_id=plan_id, roles=(role,))


@pytest.fixture
async def make_launcher():
    """Launchers that are stopped after the test, pass or fail (no stray processes); they may
    run ``python -c`` unless told otherwise."""
    made: list[Launcher] = []

    def make(**kwargs) -> Launcher:
        kwargs.setdefault("allowed_commands", [PY_C])
        made.append(Launcher(**kwargs))
        return made[-1]

    yield make
    for launcher in made:
        await launcher.stop()


def python_c(role: Role) -> list[str]:
    """Stands in for torchrun: runs the role's ``python -c CODE`` with this interpreter."""
    return [sys.executable, *role.command[1:]]


def recorder():
    seen = []
    return seen, (lambda status: seen.append((status.state, status.exit_code, status.job)))


async def wait_state(launcher: Launcher, state: LaunchState, timeout_s: float = 15.0,
                     job: str | None = None):
    await wait_until_async(
        lambda: launcher.status.state == state and (job is None or launcher.status.job == job),
        timeout_s, f"state {state.name}" + (f" of job {job}" if job else ""),
        detail=lambda: launcher.status)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not us counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_runs_the_command_with_hulk_variables_and_reports_its_states(tmp_path, make_launcher):
    out = tmp_path / "env.json"
    code = ("import json, os, time; time.sleep(0.8); "
            f"json.dump({{k: v for k, v in os.environ.items() if k.startswith('HULK_')}}, open({str(out)!r}, 'w')); "
            "raise SystemExit(3)")
    seen, on_status = recorder()
    launcher = make_launcher(command=python_c, running_after_s=0.3, on_status=on_status)
    await launcher.apply(placement(code))
    await wait_state(launcher, LaunchState.EXITED)
    assert [s[:2] for s in seen] == [(LaunchState.STARTING, 0), (LaunchState.RUNNING, 0),
                                     (LaunchState.EXITED, 3)]
    assert launcher.status.job == "a" and launcher.status.plan_id == "p1"
    env = json.loads(out.read_text())
    assert env == role_env(placement(code).roles[0])
    assert (env["HULK_STAGE"], env["HULK_NUM_STAGES"], env["HULK_LAYER_LO"], env["HULK_LAYER_HI"],
            env["HULK_MICRO_BATCH"], env["HULK_PLAN_ID"]) == ("1", "2", "20", "48", "4", "p1")


async def test_a_new_placement_stops_the_old_process_group_first(tmp_path, make_launcher):
    marker = tmp_path / "terminated"
    child = tmp_path / "child.pid"
    # The job starts a grandchild too: the whole group must go, not just the direct child.
    old = ("import signal, subprocess, sys, time, pathlib\n"
           f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
           f"pathlib.Path({str(child)!r}).write_text(str(c.pid))\n"
           f"def bye(*_): pathlib.Path({str(marker)!r}).write_text('x'); sys.exit(0)\n"
           "signal.signal(signal.SIGTERM, bye)\n"
           "time.sleep(60)\n")
    seen, on_status = recorder()
    launcher = make_launcher(command=python_c, running_after_s=0.2, on_status=on_status)
    await launcher.apply(placement(old, job="old"))
    await wait_state(launcher, LaunchState.RUNNING)
    for _ in range(100):
        if child.exists() and child.read_text():
            break
        await asyncio.sleep(0.05)
    grandchild = int(child.read_text())
    await launcher.apply(placement("import time; time.sleep(0.3)", plan_id="p2", job="new"))
    assert marker.exists()                               # SIGTERM reached the old job ...
    for _ in range(50):
        if not alive(grandchild):
            break
        await asyncio.sleep(0.02)
    assert not alive(grandchild)                         # ... and its whole process group
    await wait_state(launcher, LaunchState.EXITED, job="new")
    jobs = [(state, job) for state, _, job in seen]
    stopped = jobs.index((LaunchState.EXITED, "old"))
    assert stopped < jobs.index((LaunchState.STARTING, "new"))
    assert launcher.status.job == "new" and launcher.status.exit_code == 0


async def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(make_launcher):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    launcher = make_launcher(command=python_c, running_after_s=0.3, grace_s=0.5)
    await launcher.apply(placement(stubborn))
    await wait_state(launcher, LaunchState.RUNNING)
    t0 = asyncio.get_running_loop().time()
    await launcher.apply(None)
    assert asyncio.get_running_loop().time() - t0 < 5
    assert launcher.status.state == LaunchState.IDLE


async def test_the_same_roles_again_do_not_restart_the_process(make_launcher):
    seen, on_status = recorder()
    launcher = make_launcher(command=python_c, running_after_s=0.1, on_status=on_status)
    await launcher.apply(placement("import time; time.sleep(30)"))
    await wait_state(launcher, LaunchState.RUNNING)
    await launcher.apply(placement("import time; time.sleep(30)"))    # e.g. a retained redelivery
    assert [s[0] for s in seen] == [LaunchState.STARTING, LaunchState.RUNNING]
    await launcher.stop()


async def test_no_command_is_idle_and_an_unstartable_command_fails(tmp_path, make_launcher):
    launcher = make_launcher(command=python_c)
    await launcher.apply(placement(None))
    assert launcher.status.state == LaunchState.IDLE and "no command" in launcher.status.detail
    broken = make_launcher(command=lambda role: [str(tmp_path / "no-such-torchrun")])
    await broken.apply(placement("x"))
    await wait_state(broken, LaunchState.FAILED)
    assert "cannot start" in broken.status.detail


def test_torchrun_command_line_uses_the_placement():
    cmd = TorchrunCommand(torchrun="/opt/venv/bin/torchrun", python="/opt/venv/bin/python")
    argv = cmd(placement(("python", "train.py", "--steps", "3"), port=29777).roles[0])
    assert argv == ["/opt/venv/bin/torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
                    "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", "29777",
                    "--max-restarts", "0", "--no-python", "/opt/venv/bin/python", "train.py", "--steps", "3"]


async def test_real_torchrun_single_node_smoke(tmp_path, make_launcher):
    """torch 2.13 CPU: a one-node static rendezvous, gloo process group, our variables visible."""
    code = ("import os, torch.distributed as d; d.init_process_group('gloo'); "
            "print('HULK', d.get_rank(), d.get_world_size(), os.environ['HULK_STAGE'], "
            "os.environ['HULK_LAYER_LO'], flush=True); d.destroy_process_group()")
    role = Role(plan_id="p1", job="smoke", phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=free_port(), micro_batch=1, command=("python", "-c", code))
    seen, on_status = recorder()
    launcher = make_launcher(jobs_dir=tmp_path, on_status=on_status)
    await launcher.apply(NodePlacement(fleet="lab", node="n0", plan_id="p1", roles=(role,)))
    await wait_state(launcher, LaunchState.EXITED, timeout_s=60)
    log_text = (tmp_path / "smoke" / "job.log").read_text()
    assert launcher.status.exit_code == 0, log_text[-2000:]
    assert "HULK 0 1 0 0" in log_text
    # A long start (a busy machine) adds RUNNING updates carrying the log's tail: compare changes.
    states = [s[0] for s in seen]
    changes = [st for i, st in enumerate(states) if i == 0 or st != states[i - 1]]
    assert changes == [LaunchState.STARTING, LaunchState.RUNNING, LaunchState.EXITED]
