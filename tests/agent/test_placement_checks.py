"""The agent refuses placements it must not act on (agent/placement.py), through a real broker
into a real launcher: another key, expired, replayed, a traversal job name, malformed; each is
refused and logged in one line, nothing is launched and the running job keeps running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys

import pytest

from agent.launcher import Launcher
from agent.placement import PlacementSubscriber
from hulk.wire.broker import parse_broker_url, placement_topic
from hulk.wire.placement import NodePlacement, Role, parse_placement
from hulk.wire.records import LaunchState
from hulk.wire.signing import Signer
from planner.service.publisher import MqttPublisher
from tests.helpers.signing import SIGNER, T0, VERIFIER
from tests.helpers.waits import wait_until_async

HOUR = 3_600_000


def role(job: str, code: str) -> Role:
    return Role(plan_id="p", job=job, phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=1, command=("python", "-c", code))


def signed(job: str, code: str, *, plan_id: str, issued: int, expires: int | None = None,
           signer: Signer = SIGNER, node: str = "n1", seq: int | None = None) -> bytes:
    """Signed as the planner does; ``seq`` the issue time unless given (both follow the clock)."""
    bare = NodePlacement(fleet="lab", node=node, plan_id=plan_id, roles=(role(job, code),))
    return bare.signed(signer, issued_at_ms=issued, seq=issued if seq is None else seq,
                       expires_at_ms=issued + HOUR if expires is None else expires).to_bytes()


def direct(r: Role) -> list[str]:
    return [sys.executable, *r.command[1:]]


@pytest.mark.process
async def test_bad_placements_are_refused_logged_and_the_running_job_keeps_running(broker, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    launcher = Launcher(command=direct, running_after_s=0.2, jobs_dir=tmp_path / "jobs",
                        allowed_commands=[("python", "-c")])
    sub = PlacementSubscriber(parse_broker_url(broker.url), fleet="lab", node_id="n1",
                              state_dir=tmp_path, verifier=VERIFIER, on_change=launcher.apply,
                              backoff_initial_s=0.1)
    publisher = MqttPublisher(parse_broker_url(broker.url))
    topic = placement_topic("lab", "n1")
    marker = tmp_path / "launched"
    touch = f"open({str(marker)!r}, 'w')"
    task = asyncio.create_task(sub.run())
    try:
        await wait_until_async(sub.connected.is_set, 10, "subscribe")
        good_issued = T0 + 10_000
        await publisher.publish_retained({topic: signed("good", "import time; time.sleep(60)",
                                                        plan_id="p2", issued=good_issued)})
        await wait_until_async(lambda: launcher.status.state == LaunchState.RUNNING, 15, "good job running")
        pid = launcher._proc.pid
        # A signed placement whose job name would leave the jobs folder (signed as a raw document:
        # our own builders cannot even make one).
        doc = json.loads(signed("x", touch, plan_id="p3", issued=good_issued + 1))
        doc.pop("signature")
        doc["roles"][0]["job"] = "../escaped"
        traversal = json.dumps(SIGNER.sign(doc)).encode()
        deep = b'{"format":"hulk-placement/2","roles":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        bad = {
            "another key": signed("evil", touch, plan_id="p3", issued=good_issued + 1, signer=Signer.generate()),
            "unsigned": NodePlacement(fleet="lab", node="n1", plan_id="p3", roles=(role("evil", touch),),
                                      issued_at_ms=good_issued + 1, expires_at_ms=good_issued + HOUR).to_bytes(),
            "expired": signed("old", touch, plan_id="p3", issued=T0 - 2 * HOUR, expires=T0 - HOUR),
            "replayed": signed("older", touch, plan_id="p1", issued=good_issued - 5_000),
            "traversal": traversal,
            "deep": deep,
        }
        for n, payload in enumerate(bad.values(), start=1):
            await publisher.publish_retained({topic: payload})
            await wait_until_async(lambda n=n: sub.ignored == n, 10, f"refusal {n}")
        assert launcher.status.state == LaunchState.RUNNING and launcher._proc.pid == pid
        assert launcher.status.job == "good" and sub.current.plan_id == "p2"
        assert not marker.exists() and not (tmp_path / "escaped").exists()
        assert parse_placement((tmp_path / "placement.json").read_bytes()).plan_id == "p2"
        lines = [r.getMessage() for r in caplog.records if "refused placement" in r.getMessage()]
        assert len(lines) == len(bad) and all("\n" not in line for line in lines)
        for needle, line in zip(["bad signature", "unsigned", "expired", "replayed", "roles[0].job",
                                 "nested too deeply"], lines):
            assert needle in line, (needle, line)
        # The same retained message again (a reconnect) changes nothing; a newer good one runs.
        await publisher.publish_retained({topic: signed("next", touch, plan_id="p4", issued=good_issued + 20)})
        await wait_until_async(lambda: marker.exists(), 15, "the newer good placement to run")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await launcher.stop()


async def test_a_restarted_agent_still_refuses_replays_and_accepts_its_retained_placement(tmp_path, caplog):
    """The accepted seq and digest survive a restart: the retained placement the agent accepted
    before is accepted again, an older one is refused."""
    changes: list = []

    def subscriber(now: int) -> PlacementSubscriber:
        return PlacementSubscriber(parse_broker_url("mqtt://127.0.0.1:1"), fleet="lab", node_id="n1",
                                   state_dir=tmp_path, verifier=VERIFIER, on_change=changes.append,
                                   clock_ms=lambda: now)

    topic = placement_topic("lab", "n1")
    current = signed("a", "pass", plan_id="p5", issued=T0)
    first = subscriber(T0)
    await first.handle(topic, current)
    assert first.current is not None and first.ignored == 0
    restarted = subscriber(T0 + 60_000)
    await restarted.handle(topic, signed("b", "pass", plan_id="p4", issued=T0 - 1))
    assert restarted.ignored == 1 and restarted.current is None
    await restarted.handle(topic, current)                 # the retained one: accepted again
    assert restarted.current is not None and restarted.current.plan_id == "p5"
    # Later its expiry passes while it runs: the redelivered retained message changes nothing.
    late = subscriber(T0 + 2 * HOUR)
    late.current = restarted.current
    await late.handle(topic, current)
    assert late.ignored == 0 and late.current.plan_id == "p5"
    assert [c.plan_id for c in changes] == ["p5", "p5"]


async def test_without_a_pinned_key_every_placement_is_refused(tmp_path, caplog):
    sub = PlacementSubscriber(parse_broker_url("mqtt://127.0.0.1:1"), fleet="lab", node_id="n1",
                              state_dir=tmp_path, verifier=None)
    await sub.handle(placement_topic("lab", "n1"), signed("a", "pass", plan_id="p1", issued=T0))
    assert sub.ignored == 1 and sub.current is None
    assert any("no placement_key" in r.getMessage() for r in caplog.records)
