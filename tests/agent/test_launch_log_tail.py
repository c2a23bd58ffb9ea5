"""The last lines of a job's log travel in its launch status (the heartbeat), while it runs and
when it ends, so `hulk-planner jobs logs` can show them."""

from __future__ import annotations


import pytest

from agent.launcher import Launcher, log_tail
from hulk.wire.records import LaunchState
from tests.helpers.launch import direct, placement
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process

TALKER = ("import sys, time\n"
          "for step in range(1, 400):\n"
          "    print(f'step {step} loss {5.0 / step:.3f}', flush=True)\n"
          "    time.sleep(0.01)\n"
          "    if step == 30: time.sleep(1.5)\n"
          "sys.exit(3)\n")


async def test_the_log_tail_is_reported_while_running_and_at_the_end(tmp_path):
    seen = []
    launcher = Launcher(command=direct, running_after_s=0.1, tail_every_s=0.3,
                        allowed_commands=[("python",)], jobs_dir=tmp_path / "jobs",
                        on_status=lambda s: seen.append(s))
    try:
        await launcher.apply(placement(("python", "-c", TALKER)))
        await wait_until_async(lambda: launcher.status.state == LaunchState.EXITED, 30,
                               "the job to end", detail=lambda: launcher.status)
    finally:
        await launcher.stop()
    running = [s for s in seen if s.state == LaunchState.RUNNING and "step 30 " in s.detail]
    assert running, [s.detail[:80] for s in seen]            # reported mid-run, before the end
    final = launcher.status
    log = tmp_path / "jobs" / "a" / "job.log"
    lines = final.detail.splitlines()
    assert final.exit_code == 3 and lines[:2] == ["exit code 3", "last lines:"]  # no error line
    assert lines[-2] == "step 399 loss 0.013" and len(lines[2:-1]) == 20
    assert lines[-1] == f"full log: {log}"
    assert len(final.detail.encode()) <= 3500


def test_log_tail_reads_only_the_end_of_a_large_log(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("".join(f"line {i}\n" for i in range(200_000)))
    tail = log_tail(log, max_bytes=100, max_lines=5)
    assert tail.splitlines() == [f"line {i}" for i in range(199_995, 200_000)]
    assert log_tail(tmp_path / "missing.log") == "" and log_tail(None) == ""
