"""deploy/INSTALL.md's "Rotating the placement-signing key", run as written: mosquitto,
`hulk-planner serve --mqtt`, `hulk-planner enroll` and `jobs`, one real agent runtime (its job a
Python sleep that writes its pid once per start). A job placed under the old key runs across
every step, never restarted, and the lifecycle still works under the new key (a cancel stops it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

import pytest

from hulk.errors import InputError
from hulk.wire.broker import parse_broker_url, plan_topic
from hulk.wire.placement import parse_summary
from hulk.wire.records import LaunchState
from hulk.wire.signing import Verifier
from planner.service.publisher import MqttPublisher
from tests.helpers.agents import Agent
from tests.helpers.paths import REPO
from tests.helpers.processes import run_cli, start_planner
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process

NODE, FLEET = "solo-0", "solo"


async def cli(*args) -> str:
    result = await asyncio.to_thread(run_cli, *args)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


async def until(check, timeout: float, what: str) -> None:
    """Wait for the coroutine function ``check`` to return true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def job_record(db, name: str) -> dict:
    listing = json.loads(await cli("jobs", "list", "--db", db, "--json"))
    return next(j for j in listing["jobs"] if j["name"] == name)


async def test_the_documented_key_rotation_keeps_a_running_job_running(broker, tmp_path):
    pids = tmp_path / "pids"

    def training(role):
        code = (f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
                "time.sleep(300)")
        return [sys.executable, "-c", code]

    keys, db = tmp_path / "pki", tmp_path / "planner.sqlite"
    await cli("enroll", "--init-ca", keys, "--host", "localhost")
    old_key, old_pub = keys / "placement-signing.key", keys / "placement-signing.pub"

    def serve(key, *more):
        return start_planner(db, extra=(
            "--fleet-name", FLEET, "--mqtt", broker.url, "--node-timeout", "5",
            "--signing-key", str(key), *more, "--recovery-interval", "0.5",
            "--jobs-interval", "0.3", "--rollup-seconds", "1"))

    planner = serve(old_key)
    agents: list[Agent] = []

    async def start_agent(placement_key: list[str]) -> Agent:
        """The agent (re)started with ``placement_key``: it adopts the job still running."""
        if agents:
            agents[-1].runtime.request_stop()            # systemctl restart: the job keeps running
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(agents[-1].task, 20)
        agent = Agent(NODE, planner.address, broker.url, tmp_path / NODE, command=training,
                      placement_key=placement_key)
        agents.append(agent)
        agent.start()
        await wait_until_async(lambda: agent.component.subscriber is not None
                               and agent.component.subscriber.connected.is_set(), 30, "agent up")
        return agent

    logs = []
    try:
        agent = await start_agent([str(old_pub)])
        spec = tmp_path / "jobs.yaml"
        spec.write_text("jobs:\n  - {name: train, model: bert-large, command: 'python train.py'}\n")
        await cli("jobs", "submit", spec, "--db", db)

        async def running() -> bool:
            return (await job_record(db, "train"))["state"] == "running"

        await until(running, 30, "train running")
        placed = await job_record(db, "train")

        # 1. Make the new key: the old files are kept.
        made = dict(line.split(": ", 1) for line in
                    (await cli("enroll", "--new-signing-key", keys)).splitlines())
        assert old_key.exists() and made["signing_key"] == str(keys / "placement-signing.key.new")
        new_key, new_public = made["signing_key"], made["placement_key"]
        # 2. Every agent pins both keys.
        agent = await start_agent([str(old_pub), new_public])
        # 3. Serve restarts with the new key, told the old public key.
        planner.stop()
        logs.append(planner.log)
        planner = serve(new_key, "--previous-placement-key", str(old_pub))
        publisher = MqttPublisher(parse_broker_url(broker.url))
        new_only = Verifier.from_text(new_public)

        async def re_signed() -> bool:
            raw = await publisher.read_retained(plan_topic(FLEET), 2.0)
            try:
                return parse_summary(raw, verifier=new_only).plan_id == placed["plan_id"]
            except InputError:
                return False

        await until(re_signed, 30, "the plan re-signed with the new key")
        sub = agent.component.subscriber
        await wait_until_async(lambda: sub.current is not None and sub.current.seq > 0
                               and _signed_by(sub.current, new_only), 30,
                               "the agent's placement re-signed")
        # 4. The old key leaves the agents.
        agent = await start_agent([new_public])
        await wait_until_async(lambda: agent.placement is not None, 30, "placement accepted")
        assert _signed_by(agent.placement, new_only)

        record = await job_record(db, "train")
        assert (record["state"], record["plan_id"], record["restarts"]) == \
            ("running", placed["plan_id"], 0)
        assert len(pids.read_text().split()) == 1, "the job was started again"
        # The lifecycle goes on under the new key: a cancel stops the job.
        await cli("jobs", "cancel", "train", "--db", db)

        async def retired() -> bool:
            return (await job_record(db, "train"))["state"] == "cancelled" and \
                agent.runtime.launch_status.state not in (LaunchState.RUNNING, LaunchState.STARTING)

        await until(retired, 30, "train cancelled and stopped")
        logs.append(planner.log)
        for log in logs:
            assert "does not verify" not in log.read_text(), log.read_text()[-3000:]
        assert "re-signed its summary and 1 placement(s)" in planner.log.read_text()
    finally:
        for agent in agents[-1:]:
            await agent.stop()
        planner.stop()


def test_the_guide_gives_the_steps_this_test_runs():
    """The section is not run literally (it edits two hosts' files, restarts units): its
    commands must be the ones the test above runs."""
    guide = (REPO / "deploy" / "INSTALL.md").read_text()
    section = guide.split("## Rotating the placement-signing key", 1)[1].split("\n## ", 1)[0]
    for step in ("hulk-planner enroll --new-signing-key", "placement-signing.key.new",
                 "HULK_PREVIOUS_PLACEMENT_KEY=/etc/hulk/tls/placement-signing.pub",
                 "--previous-placement-key", "systemctl restart hulk-agent",
                 "systemctl restart hulk-planner", "remove the old key from every agent"):
        assert step in section, step


def _signed_by(placement, verifier: Verifier) -> bool:
    try:
        verifier.verify(placement.to_json())
    except InputError:
        return False
    return True
