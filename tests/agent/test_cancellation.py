"""Stopping the agent must not hang: a loop cancelled at the moment it is woken up stops anyway.

Python 3.11's asyncio.wait_for returns the result instead of raising CancelledError when the
awaited thing finishes in the same loop iteration as the cancel; a loop built on it then goes
on forever and the runtime's shutdown waits for it forever (seen as a stop that timed out).
Found in hostile testing (re-registrations wake the prober several times a second).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.prober import Prober
from agent.reporter import Reporter
from agent.spool import Spool
from hulk.wire.records import Peer, ProbeSettings


class NoClient:
    async def report(self, *args):  # never called: the spool stays empty
        raise AssertionError("no report expected")


async def test_the_reporter_stops_when_cancelled_as_it_is_woken(tmp_path: Path):
    spool = Spool(tmp_path / "spool.sqlite", max_samples=100)
    reporter = Reporter("n", spool, NoClient(), linger_s=30.0)
    task = asyncio.create_task(reporter.run())
    await asyncio.sleep(0.05)                      # lingering: nothing to send
    reporter.wake()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2.0)
    spool.close()
    assert task in done and task.cancelled()


async def test_the_prober_stops_when_cancelled_as_it_is_woken():
    prober = Prober(ProbeSettings(interval_s=30.0), lambda samples: None, pinger=None)
    task = asyncio.create_task(prober.run())
    await asyncio.sleep(0.05)
    prober.set_peers([Peer("p", "192.0.2.1", 0)])  # wakes the loop
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2.0)
    assert task in done and task.cancelled()
