"""The serve runtime's periodic jobs: a failed one (a prune on a full disk) is retried soon."""

from __future__ import annotations

import asyncio

from hulk.errors import StoreError
from planner.service.runtime import BackgroundTask, PlannerRuntime


async def test_a_failed_job_is_retried_after_retry_s_not_after_its_interval(tmp_path):
    calls: list[bool] = []
    health_seen: list[bool] = []
    runtime = PlannerRuntime(str(tmp_path / "planner.sqlite"), "127.0.0.1:0")

    def flaky_prune() -> str:
        health_seen.append(runtime.store_health.serving)
        calls.append(True)
        if len(calls) == 1:
            raise StoreError("planner.sqlite: store failed during prune: database or disk is full")
        return "pruned"

    runtime.tasks = [BackgroundTask("prune", flaky_prune, interval_s=3600.0, run_at_start=True,
                                    retry_s=0.05)]
    await runtime.start()
    try:
        for _ in range(200):
            if len(calls) >= 2 and runtime.store_health.serving:
                break
            await asyncio.sleep(0.05)
        assert len(calls) == 2                  # an hour-long interval, retried within seconds
        assert health_seen == [True, False]     # NOT_SERVING between the failure and the retry
        assert runtime.store_health.serving     # the successful retry made it SERVING again
    finally:
        await runtime.stop(grace_s=0)


async def test_no_background_task_runs_while_the_server_stops(tmp_path):
    # Once the server refuses new calls every node falls silent to the planner: a recovery round
    # then would move every job. The tasks end before the server's grace period begins.
    runs: list[float] = []
    runtime = PlannerRuntime(str(tmp_path / "planner.sqlite"), "127.0.0.1:0")

    async def recovery_round() -> None:
        runs.append(asyncio.get_running_loop().time())

    runtime.tasks = [BackgroundTask("recovery", recovery_round, interval_s=0.02,
                                    in_store_thread=False, run_at_start=True)]
    await runtime.start()
    for _ in range(200):
        if len(runs) >= 3:
            break
        await asyncio.sleep(0.02)
    assert len(runs) >= 3
    server, seen_at_stop = runtime.server, []

    class SlowStop:
        async def stop(self, grace):
            seen_at_stop.append(len(runs))
            await asyncio.sleep(0.3)            # fifteen task intervals of grace
            seen_at_stop.append(len(runs))
            await server.stop(0)

    runtime.server = SlowStop()
    await runtime.stop(grace_s=0.3)
    assert seen_at_stop[0] == seen_at_stop[1] == len(runs), (seen_at_stop, len(runs))
