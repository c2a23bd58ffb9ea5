"""The agent's report of a fenced exit (no real processes): the launcher reads ``fenced`` from the
wrapper's exit.json and reports the rank EXITED with exit cause FENCED, whatever its code, which
goes on the wire and back; any other end, and the next start, says nothing of a fence. A cause
this side does not know, or one sent with another state, reads as the process's own exit."""

from __future__ import annotations

import json
import signal
from dataclasses import replace

from agent.jobproc import EXIT_FILE
from agent.launcher import Launcher
from agent.metrics import AgentMetrics
from hulk.v1 import hulk_pb2
from hulk.wire.records import ExitCause, HeartbeatRequest, LaunchState, LaunchStatus
from tests.helpers.launch import placement
from tests.helpers.waits import wait_until_async

WHY = "the node's lease lapsed 0.3 s ago: SIGTERM to the job, SIGKILL 2.9 s later"


class Ended:
    """A job's wrapper that has already ended with ``code``."""

    pid, start_ticks = 4242, None

    def __init__(self, code: int):
        self.code = code

    async def wait(self) -> int:
        return self.code

    def signal_group(self, sig: int) -> None:
        assert sig in (signal.SIGTERM, signal.SIGKILL)


class WrapperRecords:
    """Starts nothing: each start writes what the wrapper would record in exit.json (the next
    of ``ends``: (code, why it fenced or "")) and a line of log, and ends with that code."""

    def __init__(self, *ends: tuple[int, str]):
        self.ends = list(ends)

    async def start(self, argv, env, cwd, log_path, *, unit=None):
        code, fenced = self.ends.pop(0)
        (cwd / EXIT_FILE).write_text(json.dumps({"code": code, **({"fenced": fenced}
                                                                  if fenced else {})}))
        log_path.write_text("step 40 loss 2.1\n")
        return Ended(code)


def launcher(tmp_path, runner: WrapperRecords) -> Launcher:
    return Launcher(runner=runner, command=lambda role: ["true"], jobs_dir=tmp_path / "jobs",
                    allowed_commands=[["python"]], running_after_s=0.01)


async def ended(launcher: Launcher, plan_id: str = "p1") -> LaunchStatus:
    await wait_until_async(lambda: launcher.status.state == LaunchState.EXITED
                           and launcher.status.plan_id == plan_id, timeout=10,
                           what="the job to end", detail=lambda: launcher.status)
    return launcher.status


def on_the_wire(status: LaunchStatus) -> LaunchStatus:
    """``status`` as the planner reads it from a heartbeat's bytes."""
    sent = HeartbeatRequest("n1", launch=status).to_proto().SerializeToString()
    return HeartbeatRequest.from_proto(hulk_pb2.HeartbeatRequest.FromString(sent)).launch


async def test_a_fenced_exit_is_reported_as_fenced_and_crosses_the_wire(tmp_path):
    launch = launcher(tmp_path, WrapperRecords((143, WHY)))
    await launch.apply(placement(("python", "-c", "pass")))
    status = await ended(launch)
    assert (status.exit_code, status.exit_cause) == (143, ExitCause.FENCED)
    assert status.detail.startswith(f"fenced: {WHY}\nexit code 143")
    assert HeartbeatRequest("n1", launch=status).to_proto().launch.exit_cause == (
        hulk_pb2.EXIT_CAUSE_FENCED)
    assert on_the_wire(status) == status
    metrics = AgentMetrics("n1")
    metrics.launch_changed(LaunchStatus(LaunchState.RUNNING, plan_id="p1", job="a"), status)
    assert metrics.registry.get_sample_value("hulk_agent_job_exits_total",
                                             {"outcome": "fenced"}) == 1
    await launch.stop()


async def test_a_job_that_exits_0_on_sigterm_is_still_fenced_and_the_next_run_is_not(tmp_path):
    launch = launcher(tmp_path, WrapperRecords((0, WHY), (1, "")))
    await launch.apply(placement(("python", "-c", "pass")))
    assert (await ended(launch)).exit_cause == ExitCause.FENCED
    first = placement(("python", "-c", "pass"))
    again = replace(first, plan_id="p2", roles=tuple(replace(r, plan_id="p2") for r in first.roles))
    await launch.apply(again)                    # its own crash this time
    status = await ended(launch, "p2")
    assert (status.exit_code, status.exit_cause) == (1, ExitCause.UNSPECIFIED)
    assert not status.detail.startswith("fenced")
    assert on_the_wire(status).exit_cause == ExitCause.UNSPECIFIED
    await launch.stop()


def test_an_unknown_cause_or_one_beside_another_state_is_the_process_s_own_exit():
    msg = LaunchStatus(LaunchState.EXITED, plan_id="p1", job="a", exit_code=143).to_proto()
    assert msg.exit_cause == hulk_pb2.EXIT_CAUSE_UNSPECIFIED    # what an older agent sends
    msg.exit_cause = 7                                          # a newer agent's cause
    assert LaunchStatus.from_proto(msg).exit_cause == ExitCause.UNSPECIFIED
    msg.exit_cause = hulk_pb2.EXIT_CAUSE_FENCED
    assert LaunchStatus.from_proto(msg).exit_cause == ExitCause.FENCED
    msg.state = hulk_pb2.LAUNCH_STATE_RUNNING
    assert LaunchStatus.from_proto(msg).exit_cause == ExitCause.UNSPECIFIED
