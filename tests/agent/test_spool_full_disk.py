"""The spool near a full disk, on real tiny tmpfs filesystems:

- its log stays bounded: a small, busy spool does not fill a small filesystem by itself;
- when the filesystem is full, accepted samples wait in memory (bounded; what the bound drops is
  counted) and reach the planner once there is room again, exactly once;
- the running agent on a full disk: nothing crashes, and on SIGTERM what it holds in memory
  reaches the planner (real gRPC) or stays spooled, so every sample produced is accounted for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
from pathlib import Path

import grpc
import pytest

from agent.config import load_config
from agent.prober import PacketResult
from agent.reporter import Backoff, GrpcPlannerClient, Reporter
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk.v1 import hulk_pb2
from hulk.wire.records import Inventory, ProbeKind, ProbeSample
from tests.helpers.mounts import tmpfs_mounts
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.waits import wait_until_async

pytestmark = [pytest.mark.root, pytest.mark.process]   # tmpfs mounts, a real agent process


@pytest.fixture
def tiny_fs(tmp_path: Path):
    """Mounts a tmpfs of the size asked for; unmounted (and its files gone) afterwards."""
    with tmpfs_mounts(tmp_path) as mounts:
        yield mounts.mount


def samples(n: int, start: int = 0) -> list[ProbeSample]:
    return [ProbeSample(peer_id=f"peer-{i % 20}", sent_at_ms=1_700_000_000_000 + i,
                        kind=ProbeKind.ICMP, payload_bytes=56, lost=False, rtt_ms=1.25 + i % 50,
                        timeout_ms=2000.0) for i in range(start, start + n)]


def used_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir())


def fill(directory: Path, leave_bytes: int = 0) -> Path:
    """Another program eats the filesystem's free space (all but ``leave_bytes``)."""
    filler = directory / "filler"
    with open(filler, "wb") as out:
        while True:
            stat = os.statvfs(directory)
            room = stat.f_bavail * stat.f_frsize - leave_bytes
            if room <= 0:
                break
            try:
                out.write(b"x" * min(room, 65536))
                out.flush()
            except OSError:
                break
    return filler


def test_a_busy_small_spool_does_not_fill_a_small_filesystem(tiny_fs):
    """The write-ahead log is kept small: unchecked, it can reach 987 KB for a 28 KB spool."""
    where = tiny_fs("1m")
    spool = Spool(where / "spool.sqlite", max_samples=100_000)
    try:
        for round_ in range(400):                 # ~1 s of samples in, one batch out, repeatedly
            assert spool.append(samples(60, start=round_ * 60)) == 0
            batch = spool.take_batch(2000)
            assert batch is not None and len(batch.samples) == 60
            assert spool.ack(batch.batch_id) == 60
        assert spool.depth == 0 and spool.dropped == 0 and spool.held == 0
        assert used_bytes(where) < 400_000, sorted((p.name, p.stat().st_size)
                                                  for p in where.iterdir())
    finally:
        spool.close()


async def drain(spool: Spool, reporter: Reporter) -> None:
    """What the runtime does: save what memory holds whenever there is room, send batches."""
    while spool.depth:
        spool.save()
        assert await reporter.send_one() is not None


async def test_a_full_filesystem_keeps_samples_in_memory_and_loses_none(tiny_fs, tmp_path):
    where = tiny_fs("2m")
    spool = Spool(where / "spool.sqlite", max_samples=1_000_000, memory_max=1_000_000)
    written = 0
    while spool.held == 0:                        # until the filesystem is (nearly) full
        spool.append(samples(500, start=written))
        written += 500
        assert written < 200_000, "the filesystem never filled up"
    for _ in range(20):                           # the disk stays full: appends must not fail
        spool.append(samples(500, start=written))
        written += 500
    assert spool.depth == written and spool.dropped == 0 and spool.held >= 10_000
    planner = PlannerDouble()
    server, port = await start_server(planner)
    client = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True)
    try:
        await drain(spool, Reporter("n1", spool, client, max_batch=2000))
    finally:
        await client.close()
        await server.stop(None)
        spool.close()
    stored = sorted(s.sent_at_ms for s in planner.stored_samples())
    assert stored == [1_700_000_000_000 + i for i in range(written)]     # every one, once


async def test_the_memory_bound_drops_the_oldest_and_counts_them(tiny_fs):
    where = tiny_fs("2m")
    filler = fill(where, leave_bytes=200_000)
    spool = Spool(where / "spool.sqlite", max_samples=1_000_000, memory_max=3000)
    spool.append(samples(1000))
    assert spool.held == 1000                      # no room: in memory
    spool.append(samples(2500, start=1000))
    assert spool.held == 3000 and spool.dropped == 500 and spool.depth == 3000
    filler.unlink()                                # room again
    assert spool.save() == 0
    assert spool.held == 0 and spool.stored == 3000 and spool.dropped == 500
    batch = spool.take_batch(5000)
    assert [s.sent_at_ms - 1_700_000_000_000 for s in batch.samples] == list(range(500, 3500))
    spool.close()
    reopened = Spool(where / "spool.sqlite", max_samples=1_000_000)
    assert reopened.dropped == 500                 # the count outlives the process
    reopened.close()


class CountingPinger:
    """Answers every packet at once, each with its own sent_at: counts what the agent produced."""

    def __init__(self):
        self.produced = 0

    async def ping(self, address, count, timeout_s, payload_bytes, gap_s):
        results = []
        for _ in range(count):
            self.produced += 1
            results.append(PacketResult(sent_at=float(self.produced), rtt_ms=0.5))
        return results


class ReportRefusingPlanner(PlannerDouble):
    """Registers and takes heartbeats, but Report answers UNAVAILABLE while ``down``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.down = True

    async def Report(self, request, context):
        if self.down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "planner store is down")
        return await super().Report(request, context)


async def test_the_agent_on_a_full_disk_accounts_for_every_sample_through_sigterm(
        tiny_fs, caplog):
    where = tiny_fs("2m")
    peers = [(f"p{i}", f"127.0.1.{i}", 0) for i in range(1, 41)]
    planner = ReportRefusingPlanner(
        peers=peers, settings=hulk_pb2.ProbeSettings(interval_s=0.5, packets_per_round=100,
                                                     timeout_s=0.5, max_batch=2000))
    server, port = await start_server(planner)
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "full", "insecure": "1",
                          "address": "127.0.0.1", "state_dir": str(where),
                          "max_probe_rate": "10000"},   # unpaced: fill the disk fast
                         env_reader=lambda name: None)
    pinger = CountingPinger()
    runtime = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True),
        spool=Spool(config.spool_path, config.spool_max), pinger=pinger,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        report_backoff=Backoff(0.05, 2.0, 0.2, rng=random.Random(1)), flush_deadline_s=30.0,
        rng=random.Random(3), summarize=False)   # raw samples: one row a packet fills the disk
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, runtime.request_stop)    # as `hulk-agent` does
    caplog.set_level(logging.INFO)
    task = asyncio.create_task(runtime.run())
    try:
        # ~60 bytes a sample: 40,000 samples do not fit in 2 MiB; the agent goes on probing.
        await wait_until_async(lambda: pinger.produced > 50_000 and runtime.spool.held > 1000,
                         timeout=60)
        planner.down = False                      # the planner comes back as the agent stops
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(task, timeout=60) == 0
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        runtime.request_stop()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout=60)
        await server.stop(None)
    stored = [s.sent_at_ms for s in planner.stored_samples()]
    assert len(stored) == len(set(stored))        # exactly once
    left = Spool(config.spool_path, config.spool_max)
    try:
        accounted = len(stored) + left.depth + left.dropped
    finally:
        left.close()
    assert accounted == pinger.produced, (len(stored), pinger.produced)
    errors_logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors_logged == []                    # no crashed loop, nothing lost
