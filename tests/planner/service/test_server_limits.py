"""The serve runtime bounds how many calls it holds at once: past the bound a call is
answered RESOURCE_EXHAUSTED at once instead of queueing without limit."""

from __future__ import annotations

import asyncio
import threading

import grpc

import pytest

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from planner.service.ingest import ServerLimits
from planner.service.runtime import PlannerRuntime


@pytest.mark.slow
async def test_calls_past_max_concurrent_rpcs_are_refused_at_once(tmp_path):
    runtime = PlannerRuntime(str(tmp_path / "planner.sqlite"), "127.0.0.1:0",
                             limits=ServerLimits(max_concurrent_rpcs=2))
    port = await runtime.start()
    release = threading.Event()
    # Hold the store's one thread: every Register waits for it, so calls pile up in the server.
    blocker = runtime.store_executor.submit(release.wait, 30)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = hulk_pb2_grpc.PlannerStub(channel)
            calls = [asyncio.ensure_future(stub.Register(
                hulk_pb2.RegisterRequest(node_id=f"n{i}", address="127.0.0.1"), timeout=20))
                for i in range(6)]
            await asyncio.sleep(1.0)
            refused = [c for c in calls if c.done()]
            assert len(refused) == 4
            for call in refused:
                assert call.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            release.set()
            answered = await asyncio.gather(*(c for c in calls if c not in refused))
            assert len(answered) == 2
    finally:
        release.set()
        blocker.result(5)
        await runtime.stop(grace_s=0)
