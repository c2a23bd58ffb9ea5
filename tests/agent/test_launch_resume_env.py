"""The resume variables a launched job gets (agent/launcher.py role_env), with a real process."""

from __future__ import annotations

import json
import sys

import pytest

from agent.launcher import Launcher, role_env
from hulk.settings import ENV_VARS
from hulk.wire.placement import NodePlacement, Role
from hulk.wire.records import LaunchState
from tests.helpers.waits import wait_until_async

RESUME_VARS = ("HULK_CHECKPOINT_DIR", "HULK_RESTART_COUNT", "HULK_MICRO_BATCHES")
DUMP = ("import json, os, pathlib; pathlib.Path(os.environ['HULK_CHECKPOINT_DIR']).mkdir(); "
        "pathlib.Path('out.json').write_text(json.dumps(dict(os.environ)))")


def role(**fields) -> Role:
    return Role(plan_id="p1", job="a", phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=2, **fields)


def test_role_env_carries_the_resume_variables_and_settings_lists_them():
    env = role_env(role(micro_batches=8, checkpoint_dir="/data/ckpt/a", restart_count=3))
    assert {k: env[k] for k in RESUME_VARS} == {
        "HULK_CHECKPOINT_DIR": "/data/ckpt/a", "HULK_RESTART_COUNT": "3", "HULK_MICRO_BATCHES": "8"}
    assert all(ENV_VARS[name].used_by == "launched job" for name in RESUME_VARS)
    # A job that names no checkpoint_dir: the variable is there, empty (it keeps no checkpoints).
    plain = role_env(role())
    assert (plain["HULK_CHECKPOINT_DIR"], plain["HULK_RESTART_COUNT"], plain["HULK_MICRO_BATCHES"]) == \
        ("", "0", "1")


@pytest.mark.process
async def test_a_launched_job_gets_them_and_a_relative_checkpoint_dir_lands_in_its_folder(tmp_path):
    def direct(r: Role) -> list[str]:
        return [sys.executable, *list(r.command)[1:]]

    launcher = Launcher(command=direct, running_after_s=0.1, allowed_commands=[("python", "-c")],
                        jobs_dir=tmp_path / "jobs")
    job = role(command=("python", "-c", DUMP), micro_batches=6, checkpoint_dir="ckpt", restart_count=1)
    try:
        await launcher.apply(NodePlacement(fleet="lab", node="n1", plan_id="p1", roles=(job,)))
        await wait_until_async(lambda: launcher.status.state in (LaunchState.EXITED, LaunchState.FAILED),
                               20, "the job to end", detail=lambda: launcher.status)
    finally:
        await launcher.stop()
    assert launcher.status.state == LaunchState.EXITED and launcher.status.exit_code == 0
    env = json.loads((tmp_path / "jobs" / "a" / "out.json").read_text())
    assert (env["HULK_CHECKPOINT_DIR"], env["HULK_RESTART_COUNT"], env["HULK_MICRO_BATCHES"]) == \
        ("ckpt", "1", "6")
    assert (tmp_path / "jobs" / "a" / "ckpt").is_dir()
