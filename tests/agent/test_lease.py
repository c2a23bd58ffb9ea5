"""The node lease (hulk/lease.py, agent/lease.py): the margins hold by construction for any node
timeout serve may be given, a renewal counts from the heartbeat's send and reaches every guarded
job folder, the planner's lease is bounded, a job starts only while the lease is valid, and an
agent renews right after registering (a restarted agent keeps its adopted job)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import sys

import pytest

from agent.config import load_config
from agent.jobproc import LEASE_FILE, RunRecord, start_ticks
from agent.launcher import Launcher
from agent.lease import NodeLease, lease_clock, read_lease
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk.lease import (DEFAULT_LEASE_S, LEASE_RANGE_S, fence_terms, lease_for, serve_margin_s)
from hulk.wire.placement import NodePlacement, Role
from hulk.wire.records import HeartbeatResult, Inventory, LaunchState
from planner.commands.serve import NODE_TIMEOUT
from tests.helpers.throughput import InProcessPlanner
from tests.helpers.waits import wait_until_async


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("node_timeout_s", [NODE_TIMEOUT.low, 0.5, 2, 5, 20, 30, 600,
                                            NODE_TIMEOUT.high])
def test_the_old_copy_is_gone_before_serve_may_re_place_it(node_timeout_s):
    lease = lease_for(node_timeout_s)
    terms = fence_terms(lease)
    stopped_by = terms.renew_s + terms.poll_s + terms.grace_s + terms.slack_s
    assert math.isclose(stopped_by, lease)
    assert stopped_by + serve_margin_s(node_timeout_s) <= node_timeout_s + 1e-9
    assert terms.renew_s > 0 and terms.poll_s > 0 and terms.grace_s > 0 and terms.slack_s > 0
    assert LEASE_RANGE_S[0] <= lease <= LEASE_RANGE_S[1]


def test_a_renewal_counts_from_the_send_and_reaches_every_guarded_job(tmp_path):
    jobs = tmp_path / "jobs"
    live, dead, new = (jobs / "live", jobs / "dead", jobs / "new")
    for folder in (live, dead, new):
        folder.mkdir(parents=True)
    RunRecord(job_dir=live, pid=os.getpid(), start_ticks=start_ticks(os.getpid()), role={}).save()
    RunRecord(job_dir=dead, pid=os.getpid(), start_ticks=start_ticks(os.getpid()) + 1,
              role={}).save()                         # another process's start time: ended
    clock = Clock()
    lease = NodeLease(jobs, clock=clock)
    assert not lease.valid() and lease.renew_jobs() == 0
    lease.track(new)                                  # a job about to start: lapsed until granted
    assert read_lease(new) == 0.0
    lease.granted(sent_at=995.0, lease_s=10.0)
    terms = fence_terms(10.0)
    assert lease.deadline == 995.0 + terms.renew_s and lease.valid()
    assert read_lease(live) == read_lease(new) == lease.deadline
    assert read_lease(dead) is None
    data = json.loads((live / LEASE_FILE).read_text())
    assert (data["poll_s"], data["grace_s"]) == (terms.poll_s, terms.grace_s)
    clock.now = lease.deadline
    assert not lease.valid() and lease.remaining_s() == 0


@pytest.mark.parametrize("sent", [float("nan"), float("inf"), -1.0, 0.01, 1e9])
def test_an_unusable_planner_lease_is_not_used(sent, caplog):
    lease = NodeLease(None, clock=Clock())
    lease.granted(1000.0, sent)
    assert lease.terms == fence_terms(DEFAULT_LEASE_S)
    assert "ignoring the planner's lease_s" in caplog.text


def test_no_lease_from_an_older_planner_means_the_default_one():
    lease = NodeLease(None, clock=Clock())
    lease.granted(1000.0, 5.0)
    assert lease.terms.lease_s == 5.0
    lease.granted(1000.0, 0.0)
    assert lease.terms.lease_s == DEFAULT_LEASE_S


def role(job: str = "a") -> Role:
    return Role(plan_id="p1", job=job, phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=1, command=("python", "-c", "pass"))


class RecordingRunner:
    """Starts nothing: records the lease each start found in the job's folder."""

    def __init__(self):
        self.leases: list[float | None] = []

    async def start(self, argv, env, cwd, log_path, *, unit=None):
        self.leases.append(read_lease(cwd))
        raise OSError("not started in this test")


async def test_a_job_starts_only_while_the_node_holds_its_lease(tmp_path):
    clock = Clock()
    lease = NodeLease(tmp_path / "jobs", clock=clock)
    runner = RecordingRunner()
    launcher = Launcher(runner=runner, command=lambda r: ["true"], jobs_dir=tmp_path / "jobs",
                        allowed_commands=[["python"]], lease=lease, running_after_s=0.01)
    await launcher.apply(NodePlacement(fleet="f", node="n", plan_id="p1", roles=(role(),)))
    await wait_until_async(lambda: "node lease" in launcher.status.detail, timeout=5,
                           what="the launcher to wait for the lease")
    await asyncio.sleep(0.2)
    assert runner.leases == [] and launcher.status.state == LaunchState.STARTING
    lease.granted(clock.now, 10.0)
    await wait_until_async(lambda: runner.leases, timeout=5, what="the start")
    assert runner.leases == [lease.deadline]
    await launcher.stop()


async def test_without_a_lease_a_stale_lease_file_is_not_the_new_run_s(tmp_path):
    runner = RecordingRunner()
    (tmp_path / "jobs" / "a").mkdir(parents=True)
    (tmp_path / "jobs" / "a" / LEASE_FILE).write_text('{"deadline": 0, "poll_s": 1, "grace_s": 1}')
    launcher = Launcher(runner=runner, command=lambda r: ["true"], jobs_dir=tmp_path / "jobs",
                        allowed_commands=[["python"]])
    await launcher.apply(NodePlacement(fleet="f", node="n", plan_id="p1", roles=(role(),)))
    await wait_until_async(lambda: runner.leases, timeout=5, what="the start")
    assert runner.leases == [None]
    await launcher.stop()


class LeasingPlanner(InProcessPlanner):
    def __init__(self, lease_s: float):
        super().__init__()
        self.lease_s = lease_s
        self.sent: list[float] = []

    async def heartbeat(self, node_id, time_ms, spool_depth, spool_dropped, launch):
        self.sent.append(lease_clock())
        await asyncio.sleep(0.05)                   # the answer comes later than the send
        self.heartbeats += 1
        return HeartbeatResult(2, lease_s=self.lease_s)


async def test_the_agent_renews_right_after_registering_from_the_send_time(tmp_path):
    config = load_config({"planner": "planner.test:50051", "node_id": "tokyo-1",
                          "address": "127.0.0.1", "state_dir": str(tmp_path)}, env_reader={}.get)
    planner = LeasingPlanner(lease_s=6.0)
    runtime = AgentRuntime(
        config, client=planner, spool=Spool(config.spool_path, config.spool_max), pinger=None,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=60.0, report_linger_s=0.05, rng=random.Random(1))
    job = tmp_path / "jobs" / "adopted"
    job.mkdir(parents=True)
    RunRecord(job_dir=job, pid=os.getpid(), start_ticks=start_ticks(os.getpid()), role={}).save()
    task = asyncio.create_task(runtime.run())
    try:
        # The first beat comes at once, not after the 60 s interval.
        await wait_until_async(lambda: runtime.lease.valid(), timeout=10, what="the first grant")
        terms = fence_terms(6.0)
        assert runtime.lease.deadline <= planner.sent[0] + terms.renew_s + 1e-6
        assert runtime.lease.deadline >= planner.sent[0] + terms.renew_s - 0.02
        assert read_lease(job) == runtime.lease.deadline
        assert runtime.beat_interval_s() == pytest.approx(terms.renew_s / 3)
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
    assert sys.platform != "linux" or planner.heartbeats >= 1
