"""The job lifecycle end to end: mosquitto, `hulk-planner serve --mqtt`, `hulk-planner jobs`,
one real agent runtime (its launcher's command a short Python sleep, allow-listed).

One node, so the second job must wait: the first succeeds, its node is freed, the second starts
without an operator and succeeds; a third, long job is cancelled: its process stops and its
node's placement and the plan summary are cleared.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from hulk.wire.broker import parse_broker_url, placement_topic, plan_topic
from planner.service.publisher import MqttPublisher
from tests.helpers.agents import Agent
from tests.helpers.processes import run_cli, start_planner
from tests.helpers.serve import is_clear
from tests.helpers.signing import write_signing_key
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process

NODE = "solo-0"


def sleeper(role):
    seconds = {"long": 120, "first": 6}.get(role.job, 3)   # first outlasts submitting the second
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


async def cli(*args):
    result = await asyncio.to_thread(run_cli, *args)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


async def states(db) -> dict[str, str]:
    listing = json.loads(await cli("jobs", "list", "--db", db, "--json"))
    return {j["name"]: j["state"] for j in listing["jobs"]}


async def test_a_waiting_job_starts_when_the_first_succeeds_and_cancel_stops_a_job(broker, tmp_path):
    db = tmp_path / "planner.sqlite"
    planner = start_planner(db, extra=(
        "--fleet-name", "solo", "--mqtt", broker.url, "--node-timeout", "5",
        "--signing-key", write_signing_key(tmp_path / "signing.key"),
        "--recovery-interval", "0.5", "--jobs-interval", "0.3", "--rollup-seconds", "1"))
    # Jobs that end on their own ("long" excepted).
    agent = Agent(NODE, planner.address, broker.url, tmp_path / NODE, command=sleeper)
    agent.start()
    publisher = MqttPublisher(parse_broker_url(broker.url))
    try:
        await wait_until_async(lambda: agent.component.subscriber is not None
                               and agent.component.subscriber.connected.is_set(), 30, "agent up")
        jobs = tmp_path / "jobs.yaml"
        seen: dict[str, list[str]] = {"first": [], "second": []}
        jobs.write_text("jobs:\n  - {name: first, model: bert-large, command: 'python train.py'}\n")
        await cli("jobs", "submit", jobs, "--db", db)
        await wait_until_async(lambda: agent.runtime.launch_status.job == "first", 20, "first placed")
        # The only node is busy: the second job has to wait for it.
        jobs.write_text("jobs:\n  - {name: second, model: bert-large, command: 'python train.py'}\n")
        await cli("jobs", "submit", jobs, "--db", db)

        async def watch() -> bool:
            now = await states(db)
            for name, state in now.items():
                if name in seen and (not seen[name] or seen[name][-1] != state):
                    seen[name].append(state)
            return now.get("second") == "succeeded"

        deadline = asyncio.get_running_loop().time() + 60
        while not await watch():
            assert asyncio.get_running_loop().time() < deadline, (seen, planner.log.read_text()[-4000:])
            await asyncio.sleep(0.2)
        assert seen["first"][-1] == "succeeded" and "running" in seen["second"]
        assert seen["second"][0] == "queued"          # it waited for the node
        for name in ("first", "second"):
            shown = await cli("jobs", "show", name, "--db", db)
            history = shown.split("history", 1)[1]
            for state in ("queued", "placed", "running", "succeeded"):
                assert state in history, shown
        first = json.loads(await cli("jobs", "list", "--db", db, "--json"))["jobs"][0]
        assert first["nodes"] == [NODE] and first["estimate_s"] > 0 and first["elapsed_s"] > 0
        # Retired: the node's retained placement is a signed clear, newer than the jobs' own.
        await wait_until_async(lambda: agent.placement and agent.placement.roles == (), 10,
                               "the node freed")
        assert is_clear(await publisher.read_retained(placement_topic("solo", NODE), 0.3))

        jobs.write_text("jobs:\n  - {name: long, model: bert-large, command: 'python train.py'}\n")
        await cli("jobs", "submit", jobs, "--db", db)
        await wait_until_async(lambda: agent.runtime.launch_status.state.name == "RUNNING"
                               and agent.runtime.launch_status.job == "long", 30, "long running")
        await cli("jobs", "cancel", "long", "--db", db)
        await wait_until_async(lambda: agent.placement and agent.placement.roles == ()
                               and agent.runtime.launch_status.state.name in ("IDLE", "EXITED"),
                               15, "the cancelled job stopped")
        assert is_clear(await publisher.read_retained(placement_topic("solo", NODE), 0.3))
        assert await publisher.read_retained(plan_topic("solo"), 0.3) is None
        assert (await states(db))["long"] == "cancelled"
        log = planner.log.read_text()
        assert "retired ['long']" in log, log[-3000:]
    finally:
        await agent.stop()
        planner.stop()
