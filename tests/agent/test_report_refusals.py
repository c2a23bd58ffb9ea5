"""A batch the planner cannot take must not block the spool: a real grpc.aio planner
double refuses one poisoned batch, the reporter sets it aside (counted as dropped) and every
later sample flows."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import grpc
import pytest

from agent.reporter import Backoff, GrpcPlannerClient, Reporter
from agent.spool import Spool
from hulk.wire.records import ProbeKind, ProbeSample
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.waits import wait_until_async

POISON_RTT_MS = 1e300


def samples(n: int, start: int = 0, poison_at: int | None = None) -> list[ProbeSample]:
    return [ProbeSample(peer_id="peer", sent_at_ms=1_700_000_000_000 + i, kind=ProbeKind.ICMP,
                        payload_bytes=56, lost=False,
                        rtt_ms=POISON_RTT_MS if i == poison_at else 1.0 + i, timeout_ms=2000.0)
            for i in range(start, start + n)]


class PoisonedPlanner(PlannerDouble):
    """Answers ``status`` for any batch holding an absurd RTT (what the issue's planner did
    with 1e308: INTERNAL); stores the rest."""

    def __init__(self, status: grpc.StatusCode):
        super().__init__()
        self.status = status
        self.refused: list[str] = []

    async def Report(self, request, context):
        if any(s.rtt_ms >= POISON_RTT_MS for s in request.samples):
            self.refused.append(request.batch_id)
            await context.abort(self.status, "cannot store this batch")
        return await super().Report(request, context)


async def run_until_drained(status: grpc.StatusCode, tmp_path: Path) -> tuple[PoisonedPlanner,
                                                                               Spool]:
    planner = PoisonedPlanner(status)
    server, port = await start_server(planner)
    client = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True)
    spool = Spool(tmp_path / "spool.sqlite", max_samples=10_000)
    spool.append(samples(40, poison_at=15))       # batches of 10: the second one is poisoned
    reporter = Reporter("n1", spool, client, max_batch=10, linger_s=0.05,
                        backoff=Backoff(0.02, 2.0, 0.1, rng=random.Random(7)))
    task = asyncio.create_task(reporter.run())
    try:
        await wait_until_async(lambda: spool.depth == 0, timeout=20)
        spool.append(samples(5, start=40))        # later samples flow too
        reporter.wake()
        await wait_until_async(lambda: spool.depth == 0, timeout=20)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await server.stop(None)
    return planner, spool


async def test_a_batch_the_planner_fails_on_is_set_aside_after_bounded_retries(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    planner, spool = await run_until_drained(grpc.StatusCode.INTERNAL, tmp_path)
    try:
        stored = sorted(s.sent_at_ms - 1_700_000_000_000 for s in planner.stored_samples())
        assert stored == [*range(10), *range(20, 45)]
        assert spool.dropped == 10
        assert len(set(planner.refused)) == 1                        # one batch, same id...
        assert 2 <= len(planner.refused) == Reporter.GIVE_UP_AFTER   # ...retried, bounded
        assert planner.seen.reports[-1].spool_dropped == 10           # and reported as dropped
        set_aside = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(set_aside) == 1 and "10 samples" in set_aside[0], set_aside
    finally:
        spool.close()


async def test_a_batch_the_planner_refuses_as_invalid_is_dropped_at_once(tmp_path):
    """What happens today, kept: INVALID_ARGUMENT is final, not retried."""
    planner, spool = await run_until_drained(grpc.StatusCode.INVALID_ARGUMENT, tmp_path)
    try:
        assert len(planner.refused) == 1 and spool.dropped == 10
        assert len(planner.stored_samples()) == 35
    finally:
        spool.close()


@pytest.mark.slow
@pytest.mark.parametrize("status", [grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.UNAUTHENTICATED])
async def test_a_planner_that_is_down_or_refuses_the_token_costs_no_samples(tmp_path, status):
    """Unlike INTERNAL, these say nothing about the batch: retried for as long as it takes."""
    planner = PoisonedPlanner(status)
    server, port = await start_server(planner)
    client = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True)
    spool = Spool(tmp_path / "spool.sqlite", max_samples=10_000)
    spool.append(samples(10, poison_at=3))
    reporter = Reporter("n1", spool, client, max_batch=10, linger_s=0.05,
                        backoff=Backoff(0.02, 2.0, 0.05, rng=random.Random(7)))
    task = asyncio.create_task(reporter.run())
    try:
        await wait_until_async(lambda: len(planner.refused) >= 3 * Reporter.GIVE_UP_AFTER, timeout=20)
        assert spool.depth == 10 and spool.dropped == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await server.stop(None)
        spool.close()
