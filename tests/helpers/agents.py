"""An agent runtime in the test's event loop (real gRPC to serve, a real broker), whose launcher
runs a short Python command instead of torchrun."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

from agent.config import load_config
from agent.launcher import Launcher
from agent.placement import PlacementComponent
from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk.wire.broker import parse_broker_url
from hulk.wire.records import GpuInfo, Inventory
from hulk.wire.signing import Verifier
from tests.helpers.signing import VERIFIER

A100 = GpuInfo(name="NVIDIA A100-SXM4-40GB", uuid="", compute_capability=8.0, memory_bytes=40 * 10**9)


def sleeper(role):
    """A job that runs until it is stopped (two minutes at most)."""
    return [sys.executable, "-c", "import time; time.sleep(120)"]


class Agent:
    def __init__(self, node_id: str, target: str, broker_url: str, state_dir: Path,
                 command=sleeper, placement_key: list[str] | None = None):
        """``placement_key``: the keys it pins, as its setting (default: the session's key)."""
        config = load_config({"planner": target, "node_id": node_id, "address": "127.0.0.1",
                              "city": "Beijing", "state_dir": str(state_dir), "insecure": True,
                              "mqtt": broker_url, "interval_s": 60,
                              "allowed_commands": [["python", "train.py"]],
                              "placement_key": placement_key},
                             env_reader=lambda name: None)
        self.changes: list = []
        self.jobs_dir = Path(state_dir) / "jobs"
        self.component = PlacementComponent(
            parse_broker_url(broker_url), state_dir=state_dir, node_id=node_id,
            launcher_factory=lambda on_status: Launcher(command=command, running_after_s=0.2,
                                                        jobs_dir=self.jobs_dir,
                                                        grace_s=2, on_status=on_status,
                                                        allowed_commands=config.allowed_commands),
            subscriber_kwargs={"backoff_initial_s": 0.1, "verifier": VERIFIER if placement_key is None
                               else Verifier.from_text(config.placement_key)})
        self.runtime = AgentRuntime(
            config, client=GrpcPlannerClient.connect(target, insecure=True),
            spool=Spool(config.spool_path, 10_000), pinger=None,
            inventory_reader=lambda: Inventory(gpus=(A100,) * 8), components=[self.component],
            heartbeat_interval_s=0.3)
        self.task: asyncio.Task | None = None

    @property
    def placement(self):
        sub = self.component.subscriber
        return sub.current if sub else None

    def start(self):
        self.task = asyncio.create_task(self.runtime.run())

    async def stop(self):
        """Stops the agent, then its job: an agent that stops leaves its job running, and what
        the next agent does with a placement naming nothing stops it."""
        self.runtime.request_stop()
        if self.task:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self.task, 20)
        await Launcher(jobs_dir=self.jobs_dir, grace_s=2).apply(None)
