"""What a placement may run (agent/launcher.py), with real processes: the allow-list, job names,
the job's environment, its working directory and its capabilities."""

from __future__ import annotations

import json
import os

import pytest

from agent.launcher import JOB_LOG, Launcher, role_env
from hulk.wire.records import LaunchState
from tests.helpers.launch import direct, placement
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process

DUMP = ("import json, os, pathlib; pathlib.Path('out.json').write_text(json.dumps({"
        "'env': dict(os.environ), 'cwd': os.getcwd(), "
        "'status': open('/proc/self/status').read()}))")


@pytest.fixture
async def launchers():
    made: list[Launcher] = []
    yield lambda **kw: made.append(Launcher(command=direct, running_after_s=0.1, **kw)) or made[-1]
    for launcher in made:
        await launcher.stop()


async def finished(launcher: Launcher) -> None:
    await wait_until_async(lambda: launcher.status.state in (LaunchState.EXITED, LaunchState.FAILED),
                           20, "the job to end", detail=lambda: launcher.status)


@pytest.mark.parametrize("allowed, command, reason", [
    ((), ("python", "-c", "open('m', 'w')"), "allowed_commands is empty"),
    ([("python", "train.py")], ("python", "-c", "open('m', 'w')"), "is not in this agent's allowed_commands"),
    ([("python", "train.py")], ("python",), "is not in this agent's allowed_commands"),
    ([("python",)], ("sh", "-c", "touch m"), "is not in this agent's allowed_commands"),
])
async def test_a_command_outside_the_allow_list_is_a_visible_failure_and_runs_nothing(
        tmp_path, launchers, caplog, allowed, command, reason):
    seen = []
    launcher = launchers(allowed_commands=allowed, jobs_dir=tmp_path / "jobs", on_status=seen.append)
    await launcher.apply(placement(command))
    await finished(launcher)
    assert launcher.status.state == LaunchState.FAILED and launcher.status.job == "a"
    assert launcher.status.detail.startswith("refused: ") and reason in launcher.status.detail
    assert "\n" not in launcher.status.detail
    assert [s.state for s in seen] == [LaunchState.FAILED]        # never STARTING
    assert not (tmp_path / "jobs").exists()                       # nothing made, nothing ran
    assert any("refused to launch job a" in r.getMessage() for r in caplog.records)


async def test_a_traversal_job_name_is_refused_by_the_launcher_too(tmp_path, launchers):
    launcher = launchers(allowed_commands=[("python",)], jobs_dir=tmp_path / "state" / "jobs")
    await launcher.apply(placement(("python", "-c", DUMP), job="../../escaped"))
    await finished(launcher)
    assert launcher.status.state == LaunchState.FAILED and "job name" in launcher.status.detail
    assert list(tmp_path.rglob("*")) == []


async def test_the_job_gets_an_allow_listed_environment_its_own_folder_and_no_capabilities(
        tmp_path, launchers, monkeypatch):
    secrets = {"HULK_TOKEN": "tok-secret", "HULK_MQTT": "mqtt://n1:pw-secret@broker:1883",
               "HULK_CLIENT_KEY": "/etc/hulk/client.key", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
    for name, value in {**secrets, "WANDB_PROJECT": "demo", "LANG": "C.UTF-8"}.items():
        monkeypatch.setenv(name, value)
    jobs = tmp_path / "jobs"
    launcher = launchers(allowed_commands=[("python", "-c")], jobs_dir=jobs,
                         pass_env=["WANDB_PROJECT", "HULK_TOKEN"])      # a HULK_* is never passed
    job = placement(("python", "-c", DUMP + "; print('hello from the job')"))
    await launcher.apply(job)
    await finished(launcher)
    assert launcher.status.state == LaunchState.EXITED and launcher.status.exit_code == 0, \
        (jobs / "a" / JOB_LOG).read_text()
    out = json.loads((jobs / "a" / "out.json").read_text())
    env = out["env"]
    assert not set(secrets) & set(env)
    assert not any(s in json.dumps(env) for s in ("tok-secret", "pw-secret", "aws-secret"))
    # HULK_PROGRESS_FILE: where the agent reads the job's step times from.
    expected = {*role_env(job.roles[0]), "PATH", "HOME", "LANG", "WANDB_PROJECT", "HULK_PROGRESS_FILE"}
    assert set(env) - {"LC_CTYPE"} <= expected and set(role_env(job.roles[0])) <= set(env)
    assert env["WANDB_PROJECT"] == "demo" and env["LANG"] == "C.UTF-8"
    # Its own working directory, 0700, with its log inside.
    assert out["cwd"] == str(jobs / "a")
    assert (jobs / "a").stat().st_mode & 0o777 == 0o700
    assert "hello from the job" in (jobs / "a" / JOB_LOG).read_text()
    # No capabilities, even when the agent has them (the tests run as root).
    status = dict(line.split(":\t", 1) for line in out["status"].splitlines() if ":\t" in line)
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field], 16) == 0, (field, status[field])
    assert status["NoNewPrivs"].strip() == "1"
    if os.geteuid() == 0:
        with open("/proc/self/status") as mine:
            assert "CapEff:\t0000000000000000" not in mine.read()    # the agent keeps its own
